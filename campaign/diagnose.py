"""Diagnosis: from a server's log (plus exit status, phase, timings, smoke result) to the root cause of a failure.

Pure: ``diagnose`` reads nothing but its arguments and the rules in ``campaign/signatures.yaml``; ``diagnose_file`` is
the thin edge that reads a log from disk. How a log is judged, in order:

1. Readiness. A log that shows the server ready (SGLang's ready line, served requests, or, for servers that are not
   SGLang-shaped, the HTTP server start) is ``healthy`` unless something after that point shows the process dying or an
   exit status says it died. A failed smoke test on a healthy log is ``wrong_output``; a healthy server that failed
   a bench gate (the loop's phase ``gates``) is ``below_gate``: slower than the gate allows, not broken.
2. Root-cause rules, first match wins, in the order of ``signatures.yaml``: the order says which message is the cause
   and which is the messenger ("Capture cuda graph failed: <OOM>" is an OOM; "Killed" after an earlier error is that
   error). Warning- and info-level lines are not causes unless a rule says so.
3. Fallbacks from context when no rule matched: SGLang's capture banner or a crash/stall inside CUDA-graph capture is
   ``cuda_graph_capture_failed``; a bare ``Killed`` (or SIGKILL) is ``host_oom_killed``; a stall in any other phase is
   ``startup_timeout``; a crash with no known cause is ``unknown`` (or the kind its phase points to, with low
   confidence).

``timed_out=True`` is how the campaign loop says the readiness deadline passed with the process still alive; ``phase``
is the startup phase it stalled or died in (``load``, ``kv``, ``compile``, ``graph_capture``, ``server``; ``smoke``
and ``bench`` mean the server had become ready).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, TypedDict, Unpack

import yaml

from campaign.errors import ConfigError, UsageError
from campaign.fingerprint import ANSI, fingerprint, normalise, strip_prefix
from campaign.records import Diagnosis, Evidence, SmokeResult, Timings

#: Every kind ``diagnose`` can return. ``unknown`` is a failure whose log names no cause campaign knows.
KINDS = (
    "cuda_graph_capture_failed",
    "stream_capture_isolation",
    "gpu_oom",
    "host_oom_killed",
    "port_in_use",
    "nccl_error",
    "triton_compile_error",
    "torch_compile_error",
    "illegal_memory_access",
    "import_or_dependency_error",
    "unsupported_hardware",
    "model_load_error",
    "startup_timeout",
    "bad_args",
    "wrong_output",
    "below_gate",
    "healthy",
    "unknown",
)

_PHASE_ALIASES = {"capture": "graph_capture", "cuda_graph": "graph_capture", "graph": "graph_capture"}
_AFTER_READY_PHASES = {"smoke", "bench", "gates"}
#: Phases that say nothing about where startup got (the loop's name for "no marker seen yet").
_NO_PHASE = {"launch", ""}
_QUIET_LEVELS = {"DEBUG", "INFO", "WARNING", "WARN", "W", "I"}
_LEVEL = re.compile(r"(?:^|[\s\]|(])\[?(DEBUG|INFO|WARNING|WARN|ERROR|CRITICAL|FATAL)\]?(?=[\s:|\]]|$)")
_LEVEL_KV = re.compile(r"\blevel=(\w+)")
_LEVEL_GLOG = re.compile(r"(?:^|\]:?)\[([WIEF]) |(?:^|\]:?)([WIEF])\d{4} ")
_FRAME = re.compile(r'^\s*File "[^"]+", line \d+')
_CODE = re.compile(r'^\s*(raise |return |File "|[\w.]+ = |\^+$)')
_MAX_EVIDENCE = 6
_MAX_LINE = 8000
_FRAME_LOOKBACK = 30


class DiagnoseOptions(TypedDict, total=False):
    """The keyword arguments ``diagnose`` and ``diagnose_file`` share."""

    exit_code: int | None
    phase: str | None
    timings: Timings | None
    server: str | None
    smoke: SmokeResult | None
    timed_out: bool


@dataclass(frozen=True)
class Rule:
    """One root-cause rule from signatures.yaml."""

    id: str
    kind: str
    confidence: float
    patterns: tuple[re.Pattern[str], ...]
    exclude: tuple[re.Pattern[str], ...] = ()
    #: Every one of these must match some line of the log before the rule applies.
    requires: tuple[re.Pattern[str], ...] = ()
    any_level: bool = False
    weak: bool = False
    example: str = ""


@dataclass(frozen=True)
class KindInfo:
    """A failure kind's title and its next-step hint per server recipe (``default`` for the rest)."""

    title: str
    hints: dict[str, str]

    def hint(self, server: str | None) -> str:
        """The hint in ``server``'s flag spelling, or the generic one."""
        return self.hints.get(server or "", self.hints.get("default", ""))


@dataclass(frozen=True)
class Signatures:
    """The whole rules file, compiled."""

    kinds: dict[str, KindInfo]
    rules: tuple[Rule, ...]
    capture_wrappers: tuple[re.Pattern[str], ...]
    engine_wrappers: tuple[re.Pattern[str], ...]
    #: (phase, markers) in the order of a healthy start.
    phases: tuple[tuple[str, tuple[re.Pattern[str], ...]], ...]
    ready_any: tuple[re.Pattern[str], ...]
    ready_not_sglang: tuple[re.Pattern[str], ...]
    sglang_shape: tuple[re.Pattern[str], ...]
    crash: tuple[re.Pattern[str], ...]
    death: tuple[re.Pattern[str], ...]
    memory_pressure: tuple[re.Pattern[str], ...]
    killed: tuple[re.Pattern[str], ...]


@dataclass(frozen=True)
class _Line:
    number: int
    text: str
    message: str
    quiet: bool


def _compile(patterns: Any, where: str) -> tuple[re.Pattern[str], ...]:
    """One regex per list: the alternation of the list's patterns (one search per line instead of one per pattern)."""
    if patterns is None:
        return ()
    if not isinstance(patterns, list) or not all(isinstance(p, str) for p in patterns):
        raise ConfigError("expected a list of regular expressions", file="signatures.yaml", field=where)
    for p in patterns:
        try:
            re.compile(p)
        except re.error as e:
            raise ConfigError(f"bad regular expression {p!r}: {e}", file="signatures.yaml", field=where) from e
    if not patterns:
        return ()
    return (re.compile("|".join(f"(?:{p})" for p in patterns), re.IGNORECASE),)


def _each(patterns: Any, where: str) -> tuple[re.Pattern[str], ...]:
    """One regex per pattern, for lists whose every member must match (a rule's ``all``)."""
    return tuple(rx for p in (patterns or []) for rx in _compile([p], where))


def parse_signatures(text: str) -> Signatures:
    """Compile the text of a signatures file; a malformed file is a ``ConfigError`` naming the field."""
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ConfigError(f"not valid YAML: {e}", file="signatures.yaml") from e
    if not isinstance(data, dict):
        raise ConfigError("expected a mapping at the top level", file="signatures.yaml")
    kinds: dict[str, KindInfo] = {}
    for name, info in (data.get("kinds") or {}).items():
        if name not in KINDS:
            raise ConfigError(f"unknown kind {name!r}", file="signatures.yaml", field=f"kinds.{name}")
        hints = info.get("hint") or {}
        kinds[name] = KindInfo(title=str(info.get("title", name)), hints={k: str(v) for k, v in hints.items()})
    rules = []
    for i, raw in enumerate(data.get("rules") or []):
        where = f"rules[{i}]"
        kind = raw.get("kind")
        if kind not in kinds:
            raise ConfigError(f"rule kind {kind!r} is not declared under kinds", file="signatures.yaml", field=where)
        rules.append(
            Rule(
                id=str(raw.get("id", where)),
                kind=kind,
                confidence=float(raw.get("confidence", 0.8)),
                patterns=_compile(raw.get("patterns"), f"{where}.patterns"),
                exclude=_compile(raw.get("exclude"), f"{where}.exclude"),
                requires=_each(raw.get("all"), f"{where}.all"),
                any_level=bool(raw.get("any_level", False)),
                weak=bool(raw.get("weak", False)),
                example=str(raw.get("example", "")),
            )
        )
    wrappers = data.get("wrappers") or {}
    ready = data.get("ready") or {}
    return Signatures(
        kinds=kinds,
        rules=tuple(rules),
        capture_wrappers=_compile(wrappers.get("capture"), "wrappers.capture"),
        engine_wrappers=_compile(wrappers.get("engine"), "wrappers.engine"),
        phases=tuple(
            (name, _compile(markers, f"phases.{name}")) for name, markers in (data.get("phases") or {}).items()
        ),
        ready_any=_compile(ready.get("any"), "ready.any"),
        ready_not_sglang=_compile(ready.get("not_sglang"), "ready.not_sglang"),
        sglang_shape=_compile(data.get("sglang_shape"), "sglang_shape"),
        crash=_compile(data.get("crash"), "crash"),
        death=_compile(data.get("death"), "death"),
        memory_pressure=_compile(data.get("memory_pressure"), "memory_pressure"),
        killed=_compile(data.get("killed"), "killed"),
    )


@functools.cache
def signatures() -> Signatures:
    """The rules shipped with campaign (package data ``campaign/signatures.yaml``), compiled once."""
    text = resources.files("campaign").joinpath("signatures.yaml").read_text(encoding="utf-8")
    return parse_signatures(text)


def _level_is_quiet(message: str) -> bool:
    """True when the line's logging level is below ERROR.

    A harness that re-logs the server's output nests levels ("- INFO - ERROR 08-13 ... engine.py:400] CUDA error"):
    the line is quiet only when every level word in its head is.
    """
    head = message[:100]
    levels = [next(g for g in m.groups() if g) for rx in (_LEVEL, _LEVEL_KV, _LEVEL_GLOG) for m in rx.finditer(head)]
    return bool(levels) and all(level.upper() in _QUIET_LEVELS for level in levels)


def _lines(log: str) -> list[_Line]:
    out = []
    # Split on "\n" only so line numbers match what an editor shows; progress bars redraw with "\r" inside a line.
    for i, raw in enumerate(log.split("\n"), start=1):
        # A progress bar redrawn for an hour is one "line" of megabytes: its tail is what it last said.
        if len(raw) > _MAX_LINE:
            raw = raw[: _MAX_LINE // 2] + raw[-_MAX_LINE // 2 :]
        text = ANSI.sub("", raw).rstrip("\r")
        if not text.strip():
            continue
        out.append(_Line(i, text, strip_prefix(text), _level_is_quiet(text)))
    return out


def _matches(patterns: Sequence[re.Pattern[str]], line: _Line) -> bool:
    # The message (prefixes peeled) is what rules are written against: "^Killed$", "^usage:".
    return any(p.search(line.message) for p in patterns)


def _rule_lines(rule: Rule, lines: Sequence[_Line]) -> list[_Line]:
    if rule.requires and not all(any(p.search(ln.text) for ln in lines) for p in rule.requires):
        return []
    hits = []
    for ln in lines:
        if ln.quiet and not rule.any_level:
            continue
        if _matches(rule.patterns, ln) and not _matches(rule.exclude, ln):
            hits.append(ln)
    return hits


def _signal(exit_code: int | None) -> int | None:
    """The signal that ended the process: shell style 128+N, or Python's negative return codes."""
    if exit_code is None:
        return None
    if exit_code < 0:
        return -exit_code
    if 128 < exit_code < 128 + 65:
        return exit_code - 128
    return None


def _distinct(lines: Sequence[_Line], limit: int) -> list[_Line]:
    """The first ``limit`` lines that say different things (one OOM line per TP rank is one line of evidence)."""
    seen: set[str] = set()
    out = []
    for ln in lines:
        key = normalise(ln.text)
        if key not in seen:
            seen.add(key)
            out.append(ln)
        if len(out) == limit:
            break
    return out


def _frame_above(lines: Sequence[_Line], number: int) -> _Line | None:
    """The innermost traceback frame printed just above line ``number``: where the error was raised."""
    best = None
    for ln in lines:
        if ln.number >= number:
            break
        if number - ln.number <= _FRAME_LOOKBACK and _FRAME.match(ln.message):
            best = ln
    return best


@dataclass
class _Context:
    lines: list[_Line]
    sigs: Signatures
    server: str | None
    exit_code: int | None
    timed_out: bool
    phase: str | None


def _furthest_phase(ctx: _Context) -> tuple[str | None, _Line | None]:
    """The furthest startup phase the log reached, and the line that shows it."""
    best: tuple[int, str, _Line] | None = None
    for ln in ctx.lines:
        for rank, (name, markers) in enumerate(ctx.sigs.phases):
            if _matches(markers, ln) and (best is None or rank >= best[0]):
                best = (rank, name, ln)
    if best is None:
        return None, None
    return best[1], best[2]


def _is_sglang_shaped(ctx: _Context) -> bool:
    if ctx.server in ("sglang", "refserver"):
        return True
    if ctx.server == "vllm":
        return False
    return any(_matches(ctx.sigs.sglang_shape, ln) for ln in ctx.lines)


def _ready_line(ctx: _Context) -> _Line | None:
    markers = ctx.sigs.ready_any if _is_sglang_shaped(ctx) else ctx.sigs.ready_any + ctx.sigs.ready_not_sglang
    # Ready lines are info-level by nature, so the level filter of the cause rules does not apply here.
    return next((ln for ln in ctx.lines if _matches(markers, ln)), None)


def _diagnosis(ctx: _Context, kind: str, confidence: float, evidence: Sequence[_Line], summary: str) -> Diagnosis:
    info = ctx.sigs.kinds.get(kind) or KindInfo(title=kind, hints={})
    # Kept in the order given: the cause first, then the context (frame, wrapper) that places it.
    ordered = list({ln.number: ln for ln in evidence}.values())[:_MAX_EVIDENCE]
    items = [Evidence(line=ln.number, text=ln.text.strip()[:400]) for ln in ordered]
    return Diagnosis(
        kind=kind,
        evidence=items,
        hint=info.hint(ctx.server),
        confidence=round(confidence, 2),
        fingerprint=fingerprint(kind, [e.text for e in items]),
        summary=f"{info.title}: {summary}" if summary else info.title,
    )


def _first_cause(ctx: _Context, lines: Sequence[_Line], *, include_weak: bool) -> Diagnosis | None:
    for rule in ctx.sigs.rules:
        if rule.weak and not include_weak:
            continue
        hits = _rule_lines(rule, lines)
        if not hits:
            continue
        # The exception line says it better than the source line echoed above it ("raise RuntimeError(...)").
        primary = _distinct(sorted(hits, key=lambda ln: (_CODE.match(ln.message) is not None, ln.number)), 3)
        context = []
        frame = _frame_above(ctx.lines, primary[0].number)
        if frame is not None:
            context.append(frame)
        wrapper = next((ln for ln in lines if _matches(ctx.sigs.capture_wrappers + ctx.sigs.engine_wrappers, ln)), None)
        if wrapper is not None:
            context.append(wrapper)
        evidence = primary + sorted(context, key=lambda ln: ln.number)
        confidence = rule.confidence * (0.8 if len(hits) == 1 and rule.weak else 1.0)
        return _diagnosis(ctx, rule.kind, confidence, evidence, f"line {primary[0].number}: {primary[0].message[:200]}")
    return None


def _crash_lines(ctx: _Context) -> list[_Line]:
    return [ln for ln in ctx.lines if not ln.quiet and _matches(ctx.sigs.crash, ln)]


def _not_ready(ctx: _Context) -> Diagnosis:
    """No readiness in the log: a root-cause rule, else what the context says."""
    cause = _first_cause(ctx, ctx.lines, include_weak=False)
    if cause is not None:
        return cause
    sig = _signal(ctx.exit_code)
    crashes = _crash_lines(ctx)
    crashed = bool(crashes) or (ctx.exit_code is not None and ctx.exit_code != 0)
    derived, phase_line = _furthest_phase(ctx)
    phase = _PHASE_ALIASES.get(ctx.phase, ctx.phase) if ctx.phase not in _NO_PHASE and ctx.phase else derived
    wrappers = [ln for ln in ctx.lines if _matches(ctx.sigs.capture_wrappers, ln)]
    in_capture = phase == "graph_capture"
    capture_begin = phase_line if derived == "graph_capture" else None

    if wrappers or in_capture:
        evidence = [*wrappers[:2]] + ([capture_begin] if capture_begin else []) + crashes[-2:]
        pressure = [ln for ln in ctx.lines if _matches(ctx.sigs.memory_pressure, ln)]
        if pressure and not wrappers and not crashes:
            # Capture allocates graph memory pools last: at >=95% static memory it is the usual OOM point.
            return _diagnosis(
                ctx,
                "gpu_oom",
                0.4,
                [*evidence, pressure[0]],
                f"capture began with almost no memory headroom (line {pressure[0].number}); no error text survived",
            )
        how = "crashed" if crashed else ("ran past the deadline" if ctx.timed_out else "stalled")
        where = f" (line {evidence[0].number})" if evidence else ""
        return _diagnosis(
            ctx,
            "cuda_graph_capture_failed",
            0.7 if wrappers else 0.55,
            evidence,
            f"startup {how} during CUDA-graph capture{where}; no more specific cause in the log",
        )

    killed = [ln for ln in ctx.lines if _matches(ctx.sigs.killed, ln)]
    if killed or sig == 9:
        engine = [ln for ln in ctx.lines if _matches(ctx.sigs.engine_wrappers, ln)]
        return _diagnosis(
            ctx,
            "host_oom_killed",
            0.45,
            killed[-1:] + engine[:1],
            "the process was killed (SIGKILL) and the log shows no other cause; the kernel OOM killer is the usual one",
        )

    weak = _first_cause(ctx, ctx.lines, include_weak=True)
    if not crashed and (weak is not None or ctx.timed_out or phase is not None):
        if weak is not None:
            return weak
        evidence = [phase_line] if phase_line else []
        how = "ran past the readiness deadline" if ctx.timed_out else "stopped without an error"
        last = f" after reaching phase {phase!r}" if phase else ""
        return _diagnosis(ctx, "startup_timeout", 0.5 if ctx.timed_out else 0.4, evidence, f"startup {how}{last}")

    if crashed:
        evidence = crashes[-3:]
        guess = {"load": "model_load_error", "compile": "torch_compile_error"}.get(phase or "")
        if guess:
            return _diagnosis(
                ctx, guess, 0.3, evidence, f"crashed during phase {phase!r}; the error text names no known cause"
            )
        exit_text = f" (exit status {ctx.exit_code})" if ctx.exit_code is not None else ""
        return _diagnosis(ctx, "unknown", 0.2, evidence, f"the process failed{exit_text} with no recognised cause")

    return _diagnosis(ctx, "healthy", 0.3, [], "no failure evidence in the log (no readiness marker either)")


def diagnose(
    log: str,
    *,
    exit_code: int | None = None,
    phase: str | None = None,
    timings: Timings | None = None,
    server: str | None = None,
    smoke: SmokeResult | None = None,
    timed_out: bool = False,
) -> Diagnosis:
    """Why an attempt failed (or ``healthy``): kind, evidence lines (1-based), a hint in ``server``'s flag spelling.

    ``exit_code`` follows the shell (128+N for signal N; negative Python return codes are accepted too); None means
    the process had not exited. ``timed_out`` means the readiness deadline passed with the process still alive.
    ``smoke`` with wrong answers on a healthy log gives ``wrong_output``.
    """
    ctx = _Context(_lines(log), signatures(), server, exit_code, timed_out, phase)
    ready = _ready_line(ctx)
    post_ready_phase = (phase or "") in _AFTER_READY_PHASES
    # A smoke result exists only if the loop saw the server ready, whatever the log shows.
    loop_saw_ready = smoke is not None or (timings is not None and timings.launch_to_ready_s is not None)
    # A ready line whose health check never answered before the deadline is a stall, not a healthy server.
    log_ready = ready is not None and not (timed_out and not loop_saw_ready)
    became_ready = log_ready or post_ready_phase or loop_saw_ready
    if not became_ready:
        return _not_ready(ctx)

    after = [ln for ln in ctx.lines if ready is None or ln.number > ready.number]
    died = [ln for ln in after if _matches(ctx.sigs.death, ln)]
    exited = exit_code is not None and exit_code != 0
    if died or exited:
        cause = _first_cause(ctx, after, include_weak=False)
        if cause is not None:
            return cause
        evidence = died[:2] or _crash_lines(ctx)[-2:]
        if any(_matches(ctx.sigs.killed, ln) for ln in died) or _signal(exit_code) == 9:
            return _diagnosis(ctx, "host_oom_killed", 0.45, evidence, "the server was killed after it became ready")
        return _diagnosis(
            ctx, "unknown", 0.2, evidence, "the server died after it became ready, with no recognised cause"
        )

    if smoke is not None and not smoke.ok:
        wrong = [c for c in smoke.checks if not c.passed and c.error is None]
        detail = f"{smoke.passed}/{smoke.total} smoke checks passed"
        if wrong:
            first = wrong[0]
            detail += f"; asked {first.question!r}, expected {first.expected}, got {first.reply!r}"
        return _diagnosis(ctx, "wrong_output", 0.9 if wrong else 0.5, [ready] if ready else [], detail)

    evidence = [ready] if ready else []
    where = f"ready at line {ready.number}" if ready else "the loop saw it ready"
    if phase == "gates":
        return _diagnosis(ctx, "below_gate", 0.9, evidence, f"{where}; it answered right but missed a bench gate")
    if phase in _AFTER_READY_PHASES and phase != "smoke":
        where += f"; the server log shows no failure, the attempt failed in phase {phase!r}"
    return _diagnosis(ctx, "healthy", 0.9, evidence, where)


def diagnose_file(path: Path, **options: Unpack[DiagnoseOptions]) -> Diagnosis:
    """``diagnose`` on a log file (UTF-8, undecodable bytes replaced); a missing file is a ``UsageError``."""
    try:
        data = Path(path).read_bytes()
    except FileNotFoundError as e:
        raise UsageError(f"log file not found: {path}", hint="pass the path of a server log") from e
    except IsADirectoryError as e:
        raise UsageError(f"{path} is a directory, not a log file") from e
    except OSError as e:
        raise UsageError(f"cannot read log file {path}: {e.strerror or e}") from e
    return diagnose(data.decode("utf-8", errors="replace"), **options)
