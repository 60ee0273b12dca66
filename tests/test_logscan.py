"""The log scan's needle prefilter: it may look at too many lines, never too few."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from campaign.diagnose import diagnose, scan_text, signatures
from campaign.logscan import make_line
from campaign.needles import key, needles, requirements

DATA = Path(__file__).parent / "data"
CORPUS = [json.loads(line) for line in (DATA / "corpus" / "excerpts.jsonl").read_text().splitlines() if line.strip()]
LINES = sorted({ln for r in CORPUS for ln in r["excerpt"].split("\n") if ln.strip()})


def _kept_patterns() -> list[str]:
    return list(dict.fromkeys(signatures().sources["keep"]))


def test_every_shipped_pattern_has_a_needle_of_three_characters() -> None:
    for cat, patterns in signatures().sources.items():
        for p in patterns:
            found = needles(p)
            assert found is not None and min(len(n) for n in found) >= 3, (cat, p)


def test_no_line_a_kept_pattern_matches_is_missed_by_its_needles() -> None:
    # Over every line of the real corpus: wherever a pattern matches, one of each of its requirements is in the key.
    compiled = [(p, re.compile(p, re.IGNORECASE), requirements(p)) for p in _kept_patterns()]
    for raw in LINES:
        line = make_line(1, raw)
        line_key = key(line.text)
        for p, rx, groups in compiled:
            if rx.search(line.message) or rx.search(line.text):
                missing = [sorted(g) for g in groups if not any(n in line_key for n in g)]
                assert not missing, (p, raw[:200], missing)


def test_the_scan_keeps_every_line_a_rule_matches() -> None:
    sigs = signatures()
    for record in CORPUS[:120]:
        lines = [make_line(i, t) for i, t in enumerate(record["excerpt"].split("\n"), start=1) if t.strip()]
        kept = {ln.number for ln in scan_text(record["excerpt"]).lines}
        for rule in sigs.rules:
            for ln in lines:
                if any(p.search(ln.message) for p in rule.patterns):
                    assert ln.number in kept, (rule.id, record["id"], ln.text[:200])


@pytest.mark.parametrize("size", [1, 4095, 4096, 1 << 20])
def test_block_boundaries_do_not_change_the_verdict_or_the_line_numbers(size: int) -> None:
    from campaign import logscan

    log = "x\n" * 5000 + "RuntimeError: CUDA error: an illegal memory access was encountered\n" + "y\n" * 10
    scanner = logscan.Scanner(signatures().categories)
    for block in logscan.blocks_of(log, size):
        scanner.feed(block)
    kept = scanner.finish().lines
    assert [ln.number for ln in kept if "illegal" in ln.text] == [5001]
    assert diagnose(log).evidence[0].line == 5001


def test_a_process_tag_on_every_line_neither_hides_nor_shifts_the_cause() -> None:
    # vLLM tags each line of a multiprocess server with its process ("(EngineCore_DP0 pid=230) "); the scan blanks the
    # tag in its keys (so it cannot make every line a needle hit) and must still find, number and quote the cause.
    lines = [f"(EngineCore_DP0 pid=230) INFO 12-01 10:00:{i % 60:02d} [core.py:{i}] step {i}" for i in range(500)]
    lines.append(
        "(EngineCore_DP0 pid=230) ERROR 12-01 10:01:00 [core.py:850] torch.OutOfMemoryError: CUDA out of memory."
    )
    d = diagnose("\n".join(lines) + "\n")
    assert d.kind == "gpu_oom"
    assert d.evidence[0].line == 501
    assert d.evidence[0].text.startswith("(EngineCore_DP0 pid=230) ERROR")
