"""The report schema reads what earlier code wrote: a report.json stored before the typed record tree existed.

``tests/data/reports/schema1-bench-isolate.json`` was written by ``campaign run`` at schema_version 1 when
``Attempt.bench``, ``RunReport.attribution`` and ``environment`` were still plain dicts (the quickstart with a small
bench, gates, ``--isolate`` and a secret in the baseline's env). Reading it with today's records must lose nothing.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from campaign.records import SCHEMA_VERSION, BenchResult, Finding, RunReport

STORED = Path(__file__).parent / "data" / "reports" / "schema1-bench-isolate.json"
REPO = Path(__file__).resolve().parents[1]
#: Smoke fields added after the stored report was written, with the values an old report reads back as.
SMOKE_RESULT_ADDED: dict[str, Any] = {
    "mode": "answers",
    "api": "chat",
    "model": None,
    "reasoning_off": None,
    "agreement": None,
    "logprobs": None,
    "notes": [],
}
#: Report fields added since (interruption and the host lock): None in an older report.
REPORT_ADDED: dict[str, Any] = {
    "signal": None,
    "lock_taken_over": None,
    "resumes": [],
    "ended_early": None,
    "not_run": [],
    "hosts": [],
}
#: Long-campaign fields added since (retries, known failures, attempt and restore timings), the profile step's, and
#: the host of an attempt (fleets).
LONGRUN_ATTEMPT_ADDED: dict[str, Any] = {"retry_of": None, "known_failure": None, "profile": None, "host": None}
TIMINGS_ADDED: dict[str, Any] = {"attempt_s": None}
RESTORE_ADDED: dict[str, Any] = {"ready_s": None, "cold_start_ready_s": None, "mode": None, "phases": {}}
SMOKE_CHECK_ADDED: dict[str, Any] = {
    "reasoning": None,
    "verdict": None,
    "finish_reason": None,
    "phase": "sequential",
    "batch": 1,
    "tokens": None,
    "logprobs": None,
    "top_logprobs": None,
}

#: Bench fields added since (the endpoint, credentials, SLA search, input and total throughput), with their defaults.
BENCH_RESULT_ADDED: dict[str, Any] = {"input_lengths": "approximate", "sla": None}
BENCH_SETTINGS_ADDED: dict[str, Any] = {
    "endpoint": "chat",
    "api_key": None,
    "headers": {},
    "sla": None,
    "launches": 1,
}
BENCH_LEVEL_ADDED: dict[str, Any] = {"input_throughput": 0.0, "total_throughput": 0.0}


def _pop_defaults(doc: dict[str, Any], added: dict[str, Any]) -> None:
    assert all(doc.pop(k) == v for k, v in added.items()), doc


#: Added with bench.launches (the setting is in BENCH_SETTINGS_ADDED): which launch of its variant an attempt is.
ATTEMPT_ADDED: dict[str, Any] = {"launch": 0}
#: The commit campaign ran from, recorded since the version came from git.
ENVIRONMENT_ADDED: dict[str, Any] = {"campaign_commit": None}


def _without_added(doc: dict[str, Any]) -> dict[str, Any]:
    """``doc`` with the report, smoke and bench fields added since taken out, once they hold their defaults."""
    assert all(doc.pop(k) == v for k, v in REPORT_ADDED.items()), doc
    _pop_defaults(doc["environment"], ENVIRONMENT_ADDED)
    for restore in doc["restores"]:
        _pop_defaults(restore, RESTORE_ADDED)
    for attempt in doc["attempts"]:
        _pop_defaults(attempt, ATTEMPT_ADDED)
        _pop_defaults(attempt, LONGRUN_ATTEMPT_ADDED)
        _pop_defaults(attempt["timings"], TIMINGS_ADDED)
        if attempt.get("restore"):
            _pop_defaults(attempt["restore"], RESTORE_ADDED)
        bench = attempt.get("bench")
        if bench:
            _pop_defaults(bench, BENCH_RESULT_ADDED)
            _pop_defaults(bench["settings"], BENCH_SETTINGS_ADDED)
            for level in bench["levels"]:
                _pop_defaults(level, BENCH_LEVEL_ADDED)
        smoke = attempt.get("smoke") or {}
        assert all(smoke.pop(k) == v for k, v in SMOKE_RESULT_ADDED.items() if k in smoke), smoke
        for check in smoke.get("checks", []):
            assert all(check.pop(k) == v for k, v in SMOKE_CHECK_ADDED.items()), check
    return doc


def _stored() -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(STORED.read_text())
    return doc


def test_a_stored_report_reads_typed_and_writes_back_the_same_json() -> None:
    raw = _stored()
    report = RunReport.model_validate(raw)
    assert report.schema_version == SCHEMA_VERSION == 1
    benched = [a for a in report.attempts if a.bench is not None]
    assert benched and all(isinstance(a.bench, BenchResult) for a in benched)
    assert [lv.label for lv in benched[0].bench.levels] == ["c=1", "c=2"]  # type: ignore[union-attr]
    assert [g.label for g in benched[0].bench.settings.gates] == [  # type: ignore[union-attr]
        "error_rate <= 0.01",
        "output_throughput@c=2 >= 0.2x baseline",
    ]
    assert any(a.gates for a in report.attempts)
    assert [f.status for f in report.attribution] == ["explained"]
    assert report.attribution[0].cause == {"cuda_graph": True}
    env = report.environment
    assert env.host == "local" and env.gpu == "none" and env.recipe == "refserver"
    assert set(env.probes) == {"server_version", "kernel_hash"}
    # Nothing lost, nothing added: the typed tree serialises to exactly what was stored, once the smoke fields added
    # since (verdicts, log-probabilities, comparisons with the known-good) are set aside; they read back as defaults.
    assert _without_added(report.model_dump(mode="json")) == raw
    assert "hf_secretvalue123" not in STORED.read_text()


def test_older_shapes_of_the_untyped_parts_still_read() -> None:
    """An attribution that failed (a bare status/statement dict) and an environment never gathered (``{}``)."""
    raw = _stored()
    raw["attribution"] = [{"status": "error", "statement": "attribution failed: ValueError()"}]
    raw["environment"] = {}
    report = RunReport.model_validate(raw)
    assert report.attribution == [Finding(status="error", statement="attribution failed: ValueError()")]
    assert report.environment.host is None and report.environment.probes == {}


def test_show_reads_the_stored_report(tmp_path: Path) -> None:
    """`campaign show` over a run store holding the old report: the same JSON back, and the tables drawn."""
    raw = _stored()
    run_dir = tmp_path / "runs" / raw["run_id"]
    run_dir.mkdir(parents=True)
    shutil.copy(STORED, run_dir / "report.json")

    def show(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "campaign.cli", "--runs-dir", str(tmp_path / "runs"), "show", raw["run_id"], *args],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=120,
        )

    as_json = show("--json")
    assert as_json.returncode == 0, as_json.stderr
    assert _without_added(json.loads(as_json.stdout)) == raw
    shown = show()
    assert shown.returncode == 0, shown.stderr
    assert "#0 bench: c=1: " in shown.stdout and "tok/s; c=2: " in shown.stdout
    assert "unsupported_hardware iff cuda_graph=on" in shown.stdout
