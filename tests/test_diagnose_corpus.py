"""Diagnosis on the whole labelled corpus (tests/data/corpus/excerpts.jsonl): the safety lines and the score floor.

The per-label table and the leave-one-repository-out figure come from scripts/score_diagnose.py (docs/diagnosis.md);
this test holds the lines that must never move: no failure called healthy, no healthy excerpt called a failure, and
the in-sample accuracy not below what docs/diagnosis.md reports.
"""

from __future__ import annotations

import json
from pathlib import Path

from campaign.diagnose import diagnose

CORPUS = Path(__file__).parent / "data" / "corpus" / "excerpts.jsonl"
RECORDS = [json.loads(line) for line in CORPUS.read_text(encoding="utf-8").splitlines() if line.strip()]
LAUNCH_LOGS = [r for r in RECORDS if r["category"] != "wrong_output"]
#: The in-sample accuracy docs/diagnosis.md reports, rounded down: a change that loses excerpts fails here.
FLOOR = 0.93


def test_the_corpus_is_large_and_wide() -> None:
    assert len(LAUNCH_LOGS) >= 300
    assert len({r["repo"] for r in RECORDS}) >= 8
    assert all(r["source"].startswith(r["repo"] + "#") for r in RECORDS)


def test_no_failure_is_called_healthy_and_no_healthy_log_a_failure() -> None:
    results = [(r, diagnose(r["excerpt"]).kind) for r in LAUNCH_LOGS]
    waved_through = [r["id"] for r, kind in results if r["category"] != "healthy" and kind == "healthy"]
    false_alarms = [
        r["id"] for r, kind in results if r["category"] == "healthy" and kind not in ("healthy", "inconclusive")
    ]
    assert not waved_through
    assert not false_alarms
    right = sum(1 for r, kind in results if kind == r["category"])
    assert right / len(results) >= FLOOR, f"{right}/{len(results)}"
