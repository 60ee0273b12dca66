"""A failed bench on a server whose log shows no failure: its request errors by class, or the load it missed."""

from __future__ import annotations

from campaign.diagnosis.case import MAX_EVIDENCE, Case
from campaign.diagnosis.rules import crash_lines, verdict
from campaign.fingerprint import fingerprint
from campaign.logscan import Line
from campaign.records import BenchResult, Diagnosis, Evidence


def _bench_errors(bench: BenchResult) -> tuple[dict[str, int], dict[str, str], int, int]:
    """The bench's unsuccessful requests by error name, one message each, and how many failed of how many sent."""
    counts: dict[str, int] = {}
    examples: dict[str, str] = {}
    failed = sent = 0
    for lv in bench.levels:
        sent += lv.sent
        failed += lv.failed + lv.incomplete
        for name, n in lv.errors.items():
            counts[name] = counts.get(name, 0) + n
            if lv.error_examples.get(name):
                examples.setdefault(name, lv.error_examples[name])
    return counts, examples, failed, sent


def bench_failure(ctx: Case, bench: BenchResult | None, ready: Line | None, where: str) -> Diagnosis:
    """A bench that failed on a server whose log shows no failure: its request errors, or the load it could not meet.

    Never ``healthy``: the attempt failed. Errors get ``bench_errors`` with their counts by name, the client's error
    samples as evidence (line 0: not a log line) next to the server's own error lines after the ready line, and a hint
    that says what each class of error seen usually means. A bench with no errors that failed (an SLA search whose
    lowest load missed) is ``below_gate``.
    """
    after = [ln for ln in ctx.lines if ready is None or ln.number > ready.number]
    near = crash_lines(ctx, after)[-3:]
    log_evidence = [*([ready] if ready else []), *near]
    if bench is None:
        return verdict(
            ctx,
            "bench_errors",
            0.4,
            log_evidence,
            f"{where}; the bench failed before it measured a level (no bench result: the attempt's note says why)",
        )
    counts, examples, failed, sent = _bench_errors(bench)
    if not counts:
        what = "no load met the SLA" if bench.sla is not None else "a bench level failed"
        return verdict(ctx, "below_gate", 0.8, log_evidence, f"{where}; it answered every bench request but {what}")
    ranked = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    listed = ", ".join(f"{name} {n}" for name, n in ranked)
    first = examples.get(ranked[0][0])
    d = verdict(
        ctx,
        "bench_errors",
        0.85,
        log_evidence,
        f"{where}; {failed} of {sent} bench requests failed: {listed}" + (f" ({first})" if first else ""),
    )
    samples = [
        Evidence(line=0, text=f"bench request error {name} ({n} of {sent}): {examples.get(name) or 'no message'}"[:400])
        for name, n in ranked[:3]
    ]
    d.evidence = [*samples, *d.evidence][:MAX_EVIDENCE]
    classes = [c for c in ctx.sigs.bench_classes if any(c.match.search(name) for name, _ in ranked)]
    meanings = " ".join(f"{c.title[:1].upper()}{c.title[1:]}: {c.hint}" for c in classes)
    d.hint = f"{d.hint} {meanings}".strip()
    d.fingerprint = fingerprint("bench_errors", [e.text for e in d.evidence])
    return d
