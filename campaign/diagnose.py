"""Diagnosis: from a server's log (and exit status, phase, timings, smoke result, knobs) to a failure's root cause.

Pure: ``diagnose`` reads nothing but its arguments and the rules in ``campaign/signatures.yaml``; ``diagnose_file``
is the thin edge that streams a log from disk. The log is scanned once (``campaign.logscan``), keeping only lines some
rule could be about, so a log of hundreds of megabytes costs seconds and a bounded amount of memory. How it is judged:

1. What the log can say at all. An empty, binary or undecodable log, with no exit status or deadline to go on, is
   ``inconclusive`` with the reason.
2. Readiness, proven. ``healthy`` needs a ready marker (SGLang's ready line, served requests, or, for servers that are
   not SGLang-shaped, the HTTP server start) and no failure after it: a dying engine, a bind failure, a fatal CUDA
   error or a traceback after the ready line wins, unless the server demonstrably served again after it. A failed
   smoke test on a healthy log is ``wrong_output``; a healthy server that failed a bench gate is ``below_gate``.
3. Root-cause rules, first match wins, in the order of ``signatures.yaml``: the order says which message is the cause
   and which is the messenger ("Capture cuda graph failed: <OOM>" is an OOM; "Killed" after an earlier error is that
   error). Warning- and info-level lines are not causes unless a rule says so.
4. Fallbacks from context when no rule matched: a crash inside CUDA-graph capture is ``cuda_graph_capture_failed``;
   a bare ``Killed`` (or SIGKILL) is ``host_oom_killed``; a deadline or a waiting loop is ``startup_timeout``; a crash
   with no known cause is ``unknown``; no readiness and no failure evidence is ``inconclusive`` with the last phase
   reached (never healthy).
5. The cause within the kind (``causes`` in the rules file) picks the hint: an OOM while sizing the KV pool asks for
   more static memory, one during capture for less. Where the attempt's knobs (or the log's own server arguments)
   give the current value, the hint names it and a concrete next value.

``timed_out=True`` is how the campaign loop says the readiness deadline passed with the process still alive; ``phase``
is the startup phase it stalled or died in (``load``, ``kv``, ``compile``, ``graph_capture``, ``server``; ``smoke``
and ``bench`` mean the server had become ready).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TypedDict, Unpack

from campaign import logscan
from campaign.diagnosis.bench import bench_failure
from campaign.diagnosis.case import NO_PHASE, PHASE_ALIASES, Case, matches, phase_at, ready_line, signal_of
from campaign.diagnosis.decisive import last_exception
from campaign.diagnosis.family import family_of
from campaign.diagnosis.rules import crash_lines, first_cause, verdict
from campaign.diagnosis.signatures import Rule, Signatures, parse_signatures, rules_text, signatures
from campaign.errors import UsageError
from campaign.logscan import Line, Scan
from campaign.records import BenchResult, Diagnosis, KnobValue, SmokeResult, Timings

__all__ = [
    "diagnose",
    "diagnose_file",
    "diagnose_scan",
    "parse_signatures",
    "rules_text",
    "scan_file",
    "scan_text",
    "signatures",
]

_AFTER_READY_PHASES = {"smoke", "bench", "gates"}
#: A warning that says the server fell back from a failed capture (and goes on) rather than failing.
_FALLBACK = re.compile(r"\bfall(s|ing)? ?back\b|\bfallback\b|\b(will|to) (run|use) (in )?eager\b", re.IGNORECASE)
#: More than this share of replaced characters and the log is not text campaign can read.
_UNDECODABLE_SHARE = 0.2
_BINARY_SHARE = 0.05
#: Kinds whose rule hit after the ready line is not, by itself, the server dying (a refused request's ValueError; a
#: client's TimeoutError: a server that became ready did not time out starting).
_NOT_FATAL_AFTER_READY = {"bad_args", "model_load_error", "import_or_dependency_error", "startup_timeout"}


class DiagnoseOptions(TypedDict, total=False):
    """The keyword arguments ``diagnose`` and ``diagnose_file`` share."""

    exit_code: int | None
    phase: str | None
    timings: Timings | None
    server: str | None
    smoke: SmokeResult | None
    timed_out: bool
    knobs: Mapping[str, KnobValue] | None
    bench: BenchResult | None


def _not_ready(ctx: Case, parts: Sequence[Line] = ()) -> Diagnosis:
    """No readiness in the log (or a part of the server failed): a root-cause rule, else what the context says."""
    cause = first_cause(ctx, ctx.lines, include_weak=False)
    if cause is not None:
        return cause
    sig = signal_of(ctx.exit_code)
    crashes = sorted({ln.number: ln for ln in [*crash_lines(ctx), *parts]}.values(), key=lambda ln: ln.number)
    exited = ctx.exit_code is not None and ctx.exit_code != 0
    crashed = bool(crashes) or exited
    derived, phase_line = phase_at(ctx)
    phase = PHASE_ALIASES.get(ctx.phase, ctx.phase) if ctx.phase not in NO_PHASE and ctx.phase else derived
    # A warning that capture fell back (to eager, to another mode) is the server coping, not capture failing.
    wrappers = [
        ln
        for ln in ctx.lines
        if matches(ctx.sigs.capture_wrappers, ln) and not (ln.quiet and _FALLBACK.search(ln.message))
    ]
    in_capture = phase == "graph_capture"
    capture_begin = phase_line if derived == "graph_capture" else None
    failing = crashed or ctx.timed_out

    if wrappers or (in_capture and failing):
        evidence = [*wrappers[:2]] + ([capture_begin] if capture_begin else []) + crashes[-2:]
        pressure = [ln for ln in ctx.lines if matches(ctx.sigs.memory_pressure, ln)]
        if pressure and not wrappers and not crashes:
            # Capture allocates graph memory pools last: at >=95% static memory it is the usual OOM point.
            return verdict(
                ctx,
                "gpu_oom",
                0.4,
                [*evidence, pressure[0]],
                f"capture began with almost no memory headroom (line {pressure[0].number}); no error text survived",
            )
        how = "crashed" if crashed else "ran past the deadline"
        where = f" (line {evidence[0].number})" if evidence else ""
        return verdict(
            ctx,
            "cuda_graph_capture_failed",
            0.7 if wrappers else 0.55,
            evidence,
            f"startup {how} during CUDA-graph capture{where}",
        )

    # The whole line too: zsh's "[1]    16261 killed     python3 ..." loses its job number to prefix peeling.
    killed = [ln for ln in ctx.lines if matches(ctx.sigs.killed, ln) or any(p.search(ln.text) for p in ctx.sigs.killed)]
    if killed or sig == 9:
        # A kill after an exception of the process's own is its end, not its cause (a worker that raised, then was
        # reaped): the exception is the decisive error.
        raised = last_exception(ctx, before=killed[-1].number if killed else None)
        if raised is not None:
            return _unknown(ctx, raised, [*killed[-1:]], "a termination followed it")
        engine = [ln for ln in ctx.lines if matches(ctx.sigs.engine_wrappers, ln)]
        return verdict(
            ctx,
            "host_oom_killed",
            0.45,
            killed[-1:] + engine[:1],
            "the process was killed (SIGKILL) and the log shows no other cause; the kernel OOM killer is the usual one",
        )

    weak = first_cause(ctx, ctx.lines, include_weak=True)
    if weak is not None and not crashes:
        return weak
    if ctx.timed_out and not crashes:
        evidence = [phase_line] if phase_line else []
        last = f" after reaching phase {phase!r}" if phase else ""
        return verdict(ctx, "startup_timeout", 0.5, evidence, f"startup ran past the readiness deadline{last}")

    if crashed:
        evidence = crashes[-3:]
        guess = {"load": "model_load_error", "compile": "torch_compile_error"}.get(phase or "")
        if guess:
            return verdict(
                ctx, guess, 0.3, evidence, f"crashed during phase {phase!r}; the error text names no known cause"
            )
        exit_text = f" (exit status {ctx.exit_code})" if ctx.exit_code is not None else ""
        raised = last_exception(ctx)
        if raised is not None:
            return _unknown(ctx, raised, evidence, f"the process failed{exit_text}")
        return verdict(ctx, "unknown", 0.2, evidence, f"the process failed{exit_text} with no recognised cause")

    evidence = [phase_line] if phase_line else []
    reached = (
        f"the last phase reached is {phase!r} (line {phase_line.number})"
        if phase and phase_line
        else (f"the loop's last phase is {phase!r}" if phase else "no startup phase marker either")
    )
    return verdict(
        ctx, "inconclusive", 0.0, evidence, f"no readiness marker and no failure evidence in the log; {reached}"
    )


def _unknown(ctx: Case, raised: Line, context: Sequence[Line], how: str) -> Diagnosis:
    """A failure whose decisive error is an exception no rule knows: quoted, with the generic next step."""
    return verdict(
        ctx,
        "unknown",
        0.3,
        [raised, *context],
        f"the decisive error is line {raised.number}: {raised.message[:200]} ({how}; no rule names its cause)",
    )


def _unreadable(scan: Scan) -> str | None:
    """Why the log cannot be read as text, or None when it can."""
    if scan.bytes_read and scan.binary_bytes > _BINARY_SHARE * scan.bytes_read:
        return f"the log is binary ({scan.binary_bytes} of {scan.bytes_read} bytes are control bytes)"
    if scan.chars and scan.replaced > _UNDECODABLE_SHARE * scan.chars:
        return f"the log is not {scan.encoding} text ({scan.replaced} of {scan.chars} characters undecodable)"
    if not scan.has_text:
        return "the log is empty"
    return None


def _after_ready(ctx: Case, ready: Line | None) -> Diagnosis | None:
    """The failure after the ready line, or None when the server stayed up as far as the log shows."""
    after = [ln for ln in ctx.lines if ready is None or ln.number > ready.number]
    died = [ln for ln in after if matches(ctx.sigs.death, ln)]
    # A recorded exit after ready is a death even with status 0: a server gone mid-smoke did not miscompute.
    exited = ctx.exit_code is not None and (ctx.exit_code != 0 or (ctx.phase or "") in _AFTER_READY_PHASES)
    served_last = max((ln.number for ln in ctx.scan.serving if matches(ctx.sigs.ready_any, ln)), default=0)
    strong = first_cause(ctx, after, include_weak=False, skip=frozenset(_NOT_FATAL_AFTER_READY)) if after else None
    tracebacks = [ln for ln in after if not ln.quiet and "Traceback (most recent call last)" in ln.text]
    # A rule hit or a traceback after which the server served again did not take it down; a death line always does.
    survived = strong is not None and bool(strong.evidence) and served_last > strong.evidence[0].line
    crashed_late = bool(tracebacks) and served_last < tracebacks[-1].number
    if not (died or exited or (strong is not None and not survived) or crashed_late):
        return None
    if strong is not None:
        return strong
    # A server that became ready did not time out starting, whatever a later line says.
    cause = first_cause(ctx, after, include_weak=False, skip=frozenset({"startup_timeout"}))
    if cause is not None:
        return cause
    evidence = died[:2] or (crash_lines(ctx, after)[-3:]) or crash_lines(ctx)[-2:]
    if any(matches(ctx.sigs.killed, ln) for ln in died) or signal_of(ctx.exit_code) == 9:
        return verdict(ctx, "host_oom_killed", 0.45, evidence, "the server was killed after it became ready")
    return verdict(ctx, "unknown", 0.2, evidence, "the server died after it became ready, with no recognised cause")


def diagnose_scan(
    scan: Scan,
    *,
    sigs: Signatures | None = None,
    exit_code: int | None = None,
    phase: str | None = None,
    timings: Timings | None = None,
    server: str | None = None,
    smoke: SmokeResult | None = None,
    timed_out: bool = False,
    knobs: Mapping[str, KnobValue] | None = None,
    bench: BenchResult | None = None,
    trace: list[tuple[Rule, Line]] | None = None,
) -> Diagnosis:
    """The verdict on a scanned log (``diagnose`` and ``diagnose_file`` scan, then call this).

    ``bench``: the attempt's bench result (the loop passes it with ``phase="bench"``), for the request errors' counts.
    ``trace``, if given, receives the rule that decided and its first evidence line.
    """
    family = family_of(server)
    ctx = Case(scan, _rules_for(sigs, server), server, exit_code, timed_out, phase, knobs or {}, family)
    if trace is not None:
        ctx.trace = trace
    post_ready_phase = (phase or "") in _AFTER_READY_PHASES
    # A smoke result exists only if the loop saw the server ready, whatever the log shows.
    loop_saw_ready = (
        smoke is not None or bench is not None or (timings is not None and timings.launch_to_ready_s is not None)
    )
    unreadable = _unreadable(scan)
    if unreadable is not None and not (exit_code or timed_out or post_ready_phase or loop_saw_ready):
        return verdict(ctx, "inconclusive", 0.0, [], unreadable)
    ready = ready_line(ctx)
    # A ready line whose health check never answered before the deadline is a stall, not a healthy server.
    log_ready = ready is not None and not (timed_out and not loop_saw_ready)
    became_ready = log_ready or post_ready_phase or loop_saw_ready
    # A server of several parts (models, shards, ranks, workers) is ready only when every part it reports is: one
    # ready part does not make a failed one ready.
    parts = [
        ln
        for ln in ctx.lines
        if matches(ctx.sigs.part_failed, ln) or any(p.search(ln.text) for p in ctx.sigs.part_failed)
    ]
    if parts and not loop_saw_ready:
        return _not_ready(ctx, parts)
    if not became_ready:
        return _not_ready(ctx)

    failed = _after_ready(ctx, ready if log_ready else None)
    if failed is not None:
        return failed

    if smoke is not None and not smoke.ok:
        # A wrong answer or an output off the known-good's is decisive; cut replies and HTTP errors less so.
        wrong = [c for c in smoke.failed_checks() if c.error is None]
        off = [c for c in (smoke.agreement, smoke.logprobs) if c is not None and not c.passed]
        decisive = bool(wrong or off)
        return verdict(ctx, "wrong_output", 0.9 if decisive else 0.5, [ready] if ready else [], smoke.summary())

    evidence = [ready] if ready else []
    where = f"ready at line {ready.number}" if ready else "the loop saw it ready"
    if phase == "gates":
        return verdict(ctx, "below_gate", 0.9, evidence, f"{where}; it answered right but missed a bench gate")
    # A failed attempt is never healthy: the log shows none, so the loop's own measurement says what failed.
    if phase == "bench" or (bench is not None and not bench.passed):
        return bench_failure(ctx, bench, ready, where)
    if phase == "smoke":
        return verdict(ctx, "wrong_output", 0.3, evidence, f"{where}; the smoke test failed (no smoke result given)")
    return verdict(ctx, "healthy", 0.9, evidence, where)


def _rules_for(sigs: Signatures | None, server: str | None) -> Signatures:
    """The rules a log of ``server`` is judged by: the recipe's ready marker added to the generic proofs."""
    base = sigs or signatures()
    family = family_of(server)
    return base.with_ready(family.ready_marker) if family is not None else base


def scan_text(log: str, sigs: Signatures | None = None) -> Scan:
    """One pass over a log held in memory."""
    sigs = sigs or signatures()
    scanner = logscan.Scanner(sigs.categories)
    for block in logscan.blocks_of(log):
        scanner.feed(block)
    scan = scanner.finish()
    # Text handed over as str was decoded by the caller: what its head holds says whether it was text at all.
    head = log[: 1 << 20]
    scan.chars = scan.bytes_read = len(head)
    scan.binary_bytes = logscan.binary_count(head.encode("utf-8", "replace"))
    scan.replaced = head.count("\ufffd")
    return scan


def scan_file(path: Path, sigs: Signatures | None = None) -> Scan:
    """One streaming pass over a log file (UTF-8, or UTF-16 with a byte-order mark; bad bytes replaced)."""
    sigs = sigs or signatures()
    scanner = logscan.Scanner(sigs.categories)
    for block in logscan.read_blocks(path, scanner.scan):
        scanner.feed(block)
    return scanner.finish()


def diagnose(log: str, *, sigs: Signatures | None = None, **options: Unpack[DiagnoseOptions]) -> Diagnosis:
    """Why an attempt failed (or ``healthy``): kind, evidence lines (1-based), a hint in ``server``'s flag spelling.

    ``exit_code`` follows the shell (128+N for signal N; negative Python return codes are accepted too); None means
    the process had not exited. ``timed_out`` means the readiness deadline passed with the process still alive.
    ``smoke`` with wrong answers on a healthy log gives ``wrong_output``. ``knobs`` (the attempt's) let the hint name
    the current value of the knob to change and a next value. ``sigs``: other rules than the shipped ones.
    """
    rules = _rules_for(sigs, options.get("server"))
    return diagnose_scan(scan_text(log, rules), sigs=rules, **options)


def diagnose_file(
    path: Path,
    *,
    sigs: Signatures | None = None,
    trace: list[tuple[Rule, Line]] | None = None,
    **options: Unpack[DiagnoseOptions],
) -> Diagnosis:
    """``diagnose`` on a log file, streamed; a missing file is a ``UsageError``.

    ``sigs``: other rules than the shipped ones (the scoring's held-out folds); ``trace`` as for ``diagnose_scan``.
    """
    sigs = _rules_for(sigs, options.get("server"))
    try:
        scan = scan_file(path, sigs)
    except FileNotFoundError as e:
        raise UsageError(f"log file not found: {path}", hint="pass the path of a server log") from e
    except IsADirectoryError as e:
        raise UsageError(f"{path} is a directory, not a log file") from e
    except OSError as e:
        raise UsageError(f"cannot read log file {path}: {e.strerror or e}") from e
    return diagnose_scan(scan, sigs=sigs, trace=trace, **options)
