# Over 500 lines: the signatures parser and the verdict share one rule model; signatures.py is the next cut.
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

import bisect
import functools
import itertools
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, TypedDict, Unpack

import yaml

from campaign import logscan
from campaign.errors import ConfigError, UsageError
from campaign.fingerprint import fingerprint, normalise
from campaign.logscan import Line, Scan
from campaign.records import BenchResult, Diagnosis, Evidence, KnobValue, SmokeResult, Timings

#: Every kind ``diagnose`` can return. ``unknown`` is a failure whose log names no cause campaign knows;
#: ``inconclusive`` a log that proves neither a failure nor a healthy start.
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
    "config_not_applied",
    "below_gate",
    "bench_errors",
    "healthy",
    "unknown",
    "inconclusive",
)

_PHASE_ALIASES = {"capture": "graph_capture", "cuda_graph": "graph_capture", "graph": "graph_capture"}
_AFTER_READY_PHASES = {"smoke", "bench", "gates"}
#: Phases that say nothing about where startup got (the loop's name for "no marker seen yet").
_NO_PHASE = {"launch", ""}
_FRAME_NAME = re.compile(r'^\s*File "([^"]+", line \d+, in \w+)')
_CODE = re.compile(r'^\s*(raise |return |File "|[\w.]+ = |\^+$)')
_MAX_EVIDENCE = 6
_FRAME_LOOKBACK = 30
#: Where a traceback's frames end: its exception line, or the header of the next traceback.
_TRACEBACK_END = re.compile(r"^(\w+\.)*\w*(Error|Exception|Exit|Interrupt)\b|^Traceback \(most recent|^During handling")
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
    #: The rule applies only when at least this many lines match (a waiting loop, not one "waiting" line).
    min_hits: int = 1
    #: A traceback frame line counts only when it is the innermost frame of its traceback (where the exception was
    #: raised), not a wrapper the stack merely passed through.
    innermost: bool = False
    example: str = ""
    #: The rule's patterns as written (``patterns`` is their compiled alternation).
    sources: tuple[str, ...] = ()


@dataclass(frozen=True)
class Step:
    """One concrete change a hint proposes: a knob, a direction, and how far."""

    knob: str
    change: str  # "raise" or "lower"
    by: float | None = None
    factor: float | None = None
    limit: float | None = None


@dataclass(frozen=True)
class Cause:
    """A cause within a kind: when it applies and what to do about it."""

    id: str
    kind: str
    title: str
    hints: dict[str, str]
    evidence: tuple[re.Pattern[str], ...] = ()
    phases: frozenset[str] = frozenset()
    after_ready: bool = False
    knob_is: dict[str, KnobValue] = field(default_factory=dict)
    steps: tuple[Step, ...] = ()
    example: str = ""

    def hint(self, server: str | None) -> str:
        """The cause's hint text in ``server``'s spelling, or the generic one."""
        return self.hints.get(server or "", self.hints.get("default", ""))


@dataclass(frozen=True)
class KindInfo:
    """A failure kind's title and its next-step hint per server recipe (``default`` for the rest)."""

    title: str
    hints: dict[str, str]

    def hint(self, server: str | None) -> str:
        """The hint in ``server``'s flag spelling, or the generic one."""
        return self.hints.get(server or "", self.hints.get("default", ""))


@dataclass(frozen=True)
class BenchErrorClass:
    """A class of bench request errors (``bench_error_classes`` in the rules file): which names, what they mean."""

    id: str
    match: re.Pattern[str]
    title: str
    hint: str


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
    causes: dict[str, tuple[Cause, ...]] = field(default_factory=dict)
    #: knob -> server -> flag.
    knob_flags: dict[str, dict[str, str]] = field(default_factory=dict)
    #: knob -> regexes whose group 1 is the knob's value as the server printed its arguments.
    knob_readers: dict[str, tuple[re.Pattern[str], ...]] = field(default_factory=dict)
    #: Every pattern source, by scan category (the needle index is built from these).
    sources: dict[str, tuple[str, ...]] = field(default_factory=dict)
    bench_classes: tuple[BenchErrorClass, ...] = ()

    @functools.cached_property
    def categories(self) -> logscan.Categories:
        """The scan categories of these rules: kept lines, once-only markers, traceback frames."""
        index = logscan.NeedleIndex()
        bits = {"ready": 2, "ready_alt": 4, "shape": 8, "frame": 16}
        for cat, pats in self.sources.items():
            if cat != "keep":
                for p in pats:
                    index.add(p, bits[cat])
        index.add(r'File "', bits["frame"])
        # Every kept pattern gets a bit of its own, so a needle hit can be confirmed against that pattern alone.
        keep_rx: dict[int, re.Pattern[str]] = {}
        keep, sensitive = 0, 0
        for i, p in enumerate(dict.fromkeys(self.sources.get("keep", ()))):
            bit = 1 << (5 + i)
            index.add(p, bit)
            keep_rx[bit] = re.compile(p, re.IGNORECASE)
            keep |= bit
            if logscan.digit_sensitive(p):
                sensitive |= bit
        return logscan.Categories(
            keep=keep,
            keep_rx=keep_rx,
            digit_sensitive=sensitive,
            ready=bits["ready"],
            ready_alt=bits["ready_alt"],
            shape=bits["shape"],
            frame=bits["frame"],
            ready_rx=self.ready_any,
            ready_alt_rx=self.ready_not_sglang,
            shape_rx=self.sglang_shape,
            index=index,
        )


def _check(p: str, where: str) -> None:
    try:
        re.compile(p)
    except re.error as e:
        raise ConfigError(f"bad regular expression {p!r}: {e}", file="signatures.yaml", field=where) from e


def _entries(raw: Any, where: str, drop: frozenset[str]) -> list[str]:
    """The patterns of a list, less those in ``drop``; a malformed list is a ``ConfigError`` naming the field."""
    if raw is None:
        return []
    if not isinstance(raw, list) or not all(isinstance(p, str) for p in raw):
        raise ConfigError("expected a list of regular expressions", file="signatures.yaml", field=where)
    for p in raw:
        _check(p, where)
    return [p for p in raw if p not in drop]


def _union(patterns: Sequence[str]) -> tuple[re.Pattern[str], ...]:
    """One regex per list: the alternation of the list's patterns (one search per line instead of one per pattern)."""
    if not patterns:
        return ()
    return (re.compile("|".join(f"(?:{p})" for p in patterns), re.IGNORECASE),)


def _each(patterns: Sequence[str]) -> tuple[re.Pattern[str], ...]:
    """One regex per pattern, for lists whose every member must match (a rule's ``all``)."""
    return tuple(re.compile(p, re.IGNORECASE) for p in patterns)


def _steps(raw: Any, where: str) -> tuple[Step, ...]:
    out = []
    for i, s in enumerate(raw or []):
        if not isinstance(s, dict) or s.get("change") not in ("raise", "lower") or not isinstance(s.get("knob"), str):
            raise ConfigError(
                "a step is {knob: NAME, change: raise|lower, by|factor: N, limit: N}",
                file="signatures.yaml",
                field=f"{where}[{i}]",
            )
        out.append(
            Step(
                knob=s["knob"],
                change=s["change"],
                by=float(s["by"]) if "by" in s else None,
                factor=float(s["factor"]) if "factor" in s else None,
                limit=float(s["limit"]) if "limit" in s else None,
            )
        )
    return tuple(out)


def parse_signatures(text: str, *, drop: frozenset[str] = frozenset()) -> Signatures:
    """Compile the text of a signatures file; a malformed file is a ``ConfigError`` naming the field.

    ``drop``: patterns (as written) to leave out, wherever they appear: the rules as they would be without them
    (scripts/score_diagnose.py's leave-one-repository-out score drops the patterns only one repository supports).
    """
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
    keep: list[str] = []
    rules = []
    for i, raw in enumerate(data.get("rules") or []):
        where = f"rules[{i}]"
        kind = raw.get("kind")
        if kind not in kinds:
            raise ConfigError(f"rule kind {kind!r} is not declared under kinds", file="signatures.yaml", field=where)
        patterns = _entries(raw.get("patterns"), f"{where}.patterns", drop)
        requires = _entries(raw.get("all"), f"{where}.all", frozenset())
        exclude = _entries(raw.get("exclude"), f"{where}.exclude", frozenset())
        keep += patterns + requires
        if not patterns:
            continue
        rules.append(
            Rule(
                id=str(raw.get("id", where)),
                kind=kind,
                confidence=float(raw.get("confidence", 0.8)),
                patterns=_union(patterns),
                exclude=_union(exclude),
                requires=_each(requires),
                any_level=bool(raw.get("any_level", False)),
                weak=bool(raw.get("weak", False)),
                min_hits=int(raw.get("min_hits", 1)),
                innermost=bool(raw.get("innermost", False)),
                example=str(raw.get("example", "")),
                sources=tuple(patterns),
            )
        )

    def listed(raw: Any, where: str) -> list[str]:
        return _entries(raw, where, drop)

    wrappers = data.get("wrappers") or {}
    ready = data.get("ready") or {}
    capture_w = listed(wrappers.get("capture"), "wrappers.capture")
    engine_w = listed(wrappers.get("engine"), "wrappers.engine")
    phases = [(name, listed(markers, f"phases.{name}")) for name, markers in (data.get("phases") or {}).items()]
    ready_any = listed(ready.get("any"), "ready.any")
    ready_ns = listed(ready.get("not_sglang"), "ready.not_sglang")
    shape = listed(data.get("sglang_shape"), "sglang_shape")
    lists = {n: listed(data.get(n), n) for n in ("crash", "death", "memory_pressure", "killed")}

    causes: dict[str, list[Cause]] = {}
    for kind, items in (data.get("causes") or {}).items():
        if kind not in kinds:
            raise ConfigError(f"causes of undeclared kind {kind!r}", file="signatures.yaml", field=f"causes.{kind}")
        for j, c in enumerate(items or []):
            where = f"causes.{kind}[{j}]"
            evidence = listed(c.get("evidence"), f"{where}.evidence")
            keep += evidence
            hints = c.get("hint") or {}
            causes.setdefault(kind, []).append(
                Cause(
                    id=str(c.get("id", where)),
                    kind=kind,
                    title=str(c.get("title", "")),
                    hints={k: str(v) for k, v in (hints if isinstance(hints, dict) else {"default": hints}).items()},
                    evidence=_union(evidence),
                    phases=frozenset(str(p) for p in (c.get("phase") or [])),
                    after_ready=bool(c.get("after_ready", False)),
                    knob_is=dict(c.get("knob_is") or {}),
                    steps=_steps(c.get("steps"), f"{where}.steps"),
                    example=str(c.get("example", "")),
                )
            )
    bench_classes = []
    for j, c in enumerate(data.get("bench_error_classes") or []):
        where = f"bench_error_classes[{j}]"
        if not isinstance(c, dict) or not isinstance(c.get("match"), str):
            raise ConfigError("a bench error class is {id, match, title, hint}", file="signatures.yaml", field=where)
        _check(c["match"], f"{where}.match")
        bench_classes.append(
            BenchErrorClass(
                id=str(c.get("id", where)),
                match=re.compile(c["match"]),
                title=str(c.get("title", "")),
                hint=str(c.get("hint", "")),
            )
        )
    knobs = data.get("knobs") or {}
    knob_flags = {k: {s: str(f) for s, f in (v.get("flags") or {}).items()} for k, v in knobs.items()}
    readers_raw = {k: listed(v.get("read"), f"knobs.{k}.read") for k, v in knobs.items()}
    keep += [p for ps in readers_raw.values() for p in ps]
    keep += capture_w + engine_w + [p for _, ps in phases for p in ps] + [p for ps in lists.values() for p in ps]
    return Signatures(
        kinds=kinds,
        rules=tuple(rules),
        capture_wrappers=_union(capture_w),
        engine_wrappers=_union(engine_w),
        phases=tuple((name, _union(ps)) for name, ps in phases),
        ready_any=_union(ready_any),
        ready_not_sglang=_union(ready_ns),
        sglang_shape=_union(shape),
        crash=_union(lists["crash"]),
        death=_union(lists["death"]),
        memory_pressure=_union(lists["memory_pressure"]),
        killed=_union(lists["killed"]),
        causes={k: tuple(v) for k, v in causes.items()},
        knob_flags=knob_flags,
        knob_readers={k: _each(v) for k, v in readers_raw.items()},
        sources={
            "keep": tuple(keep),
            "ready": tuple(ready_any),
            "ready_alt": tuple(ready_ns),
            "shape": tuple(shape),
        },
        bench_classes=tuple(bench_classes),
    )


def rules_text() -> str:
    """The text of the bundled rules file (``campaign/signatures.yaml``)."""
    return resources.files("campaign").joinpath("signatures.yaml").read_text(encoding="utf-8")


@functools.cache
def signatures(drop: frozenset[str] = frozenset()) -> Signatures:
    """The rules shipped with campaign (package data ``campaign/signatures.yaml``), compiled once per ``drop``."""
    return parse_signatures(rules_text(), drop=drop)


def _matches(patterns: Sequence[re.Pattern[str]], line: Line) -> bool:
    # The message (prefixes peeled) is what rules are written against: "^Killed$", "^usage:".
    return any(p.search(line.message) for p in patterns)


def _is_innermost(frame: Line, everything: Sequence[Line]) -> bool:
    """Whether no deeper frame of the same traceback follows ``frame`` (as far as the kept lines show).

    Every kept line carries the last frame printed above it; one after ``frame``, before its traceback ends (an
    exception line, a new traceback), that names a later frame means the stack went deeper than ``frame``.
    """
    # Kept lines are in log order: start right after ``frame`` (a long log keeps tens of thousands of them).
    start = bisect.bisect_right(everything, frame.number, key=lambda ln: ln.number)
    for ln in itertools.islice(everything, start, None):
        if ln.number - frame.number > _FRAME_LOOKBACK:
            break
        if ln.frame is not None and ln.frame.number > frame.number:
            return False
        if _TRACEBACK_END.match(ln.message):
            break
    return True


def _rule_lines(rule: Rule, lines: Sequence[Line], everything: Sequence[Line]) -> list[Line]:
    if rule.requires and not all(any(p.search(ln.text) for ln in everything) for p in rule.requires):
        return []
    hits = []
    for ln in lines:
        if ln.quiet and not rule.any_level:
            continue
        if _matches(rule.patterns, ln) and not _matches(rule.exclude, ln):
            if rule.innermost and _FRAME_NAME.match(ln.message) and not _is_innermost(ln, everything):
                continue
            hits.append(ln)
    return hits if len(hits) >= rule.min_hits else []


def _signal(exit_code: int | None) -> int | None:
    """The signal that ended the process: shell style 128+N, or Python's negative return codes."""
    if exit_code is None:
        return None
    if exit_code < 0:
        return -exit_code
    if 128 < exit_code < 128 + 65:
        return exit_code - 128
    return None


def _distinct(lines: Sequence[Line], limit: int) -> list[Line]:
    """The first ``limit`` lines that say different things (one OOM line per TP rank is one line of evidence)."""
    seen: set[str] = set()
    out = []
    for ln in lines:
        k = normalise(ln.text)
        if k not in seen:
            seen.add(k)
            out.append(ln)
        if len(out) == limit:
            break
    return out


@dataclass
class _Context:
    scan: Scan
    sigs: Signatures
    server: str | None
    exit_code: int | None
    timed_out: bool
    phase: str | None
    knobs: Mapping[str, KnobValue]
    #: The rule that decided, and its first evidence line (for scoring: which patterns a verdict rests on).
    trace: list[tuple[Rule, Line]] = field(default_factory=list)

    @property
    def lines(self) -> list[Line]:
        return self.scan.lines


def _phase_at(ctx: _Context, number: int | None = None) -> tuple[str | None, Line | None]:
    """The furthest startup phase the log reached (by line ``number``, if given), and the line that shows it."""
    best: tuple[int, str, Line] | None = None
    for ln in ctx.lines:
        if number is not None and ln.number > number:
            break
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
    return ctx.scan.shaped


def _ready_line(ctx: _Context) -> Line | None:
    if _is_sglang_shaped(ctx):
        return ctx.scan.ready
    found = [ln for ln in (ctx.scan.ready, ctx.scan.ready_alt) if ln is not None]
    return min(found, key=lambda ln: ln.number) if found else None


def _knob_value(ctx: _Context, knob: str) -> KnobValue:
    """The knob's value: the attempt's, else what the server printed of its own arguments."""
    if knob in ctx.knobs and ctx.knobs[knob] is not None:
        return ctx.knobs[knob]
    for rx in ctx.sigs.knob_readers.get(knob, ()):
        for ln in ctx.lines:
            m = rx.search(ln.text)
            if m:
                text = m.group(1)
                try:
                    return int(text) if re.fullmatch(r"\d+", text) else float(text)
                except ValueError:
                    return text
    return None


def _flag(ctx: _Context, knob: str) -> str:
    flags = ctx.sigs.knob_flags.get(knob, {})
    if ctx.server in flags:
        return flags[ctx.server]
    spelled = ", ".join(f"{s} {f}" for s, f in sorted(flags.items()) if s != "refserver")
    return f"{knob} ({spelled})" if spelled else knob


def _fmt(value: float) -> str:
    # Four significant digits: 0.001 stays 0.001 (two fixed decimals showed it as "0."), 0.85 stays 0.85.
    return str(int(value)) if float(value).is_integer() and abs(value) >= 1 else f"{value:.4g}"


def _step_text(ctx: _Context, step: Step) -> str | None:
    """One step in words: the flag, the direction, and from the current value to the next; None if no such flag."""
    flags = ctx.sigs.knob_flags.get(step.knob, {})
    if ctx.server in ("sglang", "vllm", "refserver") and flags and ctx.server not in flags:
        return None  # the server has no such knob: the other steps say what to do
    flag = _flag(ctx, step.knob)
    now = _knob_value(ctx, step.knob)
    up = step.change == "raise"
    if isinstance(now, bool) or not isinstance(now, int | float):
        factor = step.factor or (2.0 if up else 0.5)
        how = f"by about {_fmt(step.by)}" if step.by else f"to about {_fmt(factor)}x its value"
        cap = f", to at most {_fmt(step.limit)}" if step.limit is not None and up else ""
        return f"{step.change} {flag} {how}{cap}".rstrip()
    if step.by is not None:
        nxt = now + step.by if up else now - step.by
    else:
        nxt = now * (step.factor or (2.0 if up else 0.5))
    nxt = max(1, round(nxt)) if isinstance(now, int) else round(nxt, 2)
    if step.limit is not None:
        nxt = min(nxt, step.limit) if up else max(nxt, step.limit)
    if (up and nxt <= now) or (not up and nxt >= now):
        return f"{flag} is already {_fmt(now)}, as far as that step goes"
    return f"{step.change} {flag} from {_fmt(now)} to {_fmt(nxt)}"


def _cause(ctx: _Context, kind: str, evidence: Sequence[Line], after_ready: bool) -> Cause | None:
    """The first cause of ``kind`` that applies to this log (a cause with no condition applies to any)."""
    at = evidence[0].number if evidence else None
    phase, _ = _phase_at(ctx, at)
    if phase is None and ctx.phase and ctx.phase not in _NO_PHASE:
        phase = _PHASE_ALIASES.get(ctx.phase, ctx.phase)
    for c in ctx.sigs.causes.get(kind, ()):
        if c.after_ready:
            if after_ready:
                return c
            continue
        if c.knob_is and all(_knob_value(ctx, k) == v for k, v in c.knob_is.items()):
            return c
        if c.evidence and any(_matches(c.evidence, ln) or c.evidence[0].search(ln.text) for ln in ctx.lines):
            return c
        if c.phases and phase in c.phases:
            return c
        if not (c.knob_is or c.evidence or c.phases):
            return c
    return None


def _hint(ctx: _Context, kind: str, evidence: Sequence[Line], after_ready: bool) -> tuple[str, str]:
    """The hint and the cause's title ('' when the kind has no causes or none applies)."""
    info = ctx.sigs.kinds.get(kind) or KindInfo(title=kind, hints={})
    cause = _cause(ctx, kind, evidence, after_ready)
    if cause is None:
        return info.hint(ctx.server), ""
    text = cause.hint(ctx.server) or info.hint(ctx.server)
    steps = [t for t in (_step_text(ctx, s) for s in cause.steps) if t]
    if steps:
        text = text.rstrip() + " Next: " + "; or ".join(steps) + "."
    if kind in ("stream_capture_isolation", "cuda_graph_capture_failed"):
        for ln in evidence:
            if m := _FRAME_NAME.match(ln.message):
                text += f" What ran inside the capture: {m.group(1)} (log line {ln.number})."
                break
    return text, cause.title


def _diagnosis(
    ctx: _Context,
    kind: str,
    confidence: float,
    evidence: Sequence[Line],
    summary: str,
    *,
    after_ready: bool = False,
) -> Diagnosis:
    info = ctx.sigs.kinds.get(kind) or KindInfo(title=kind, hints={})
    # Kept in the order given: the cause first, then the context (frame, wrapper) that places it.
    ordered = list({ln.number: ln for ln in evidence}.values())[:_MAX_EVIDENCE]
    items = [Evidence(line=ln.number, text=ln.text.strip()[:400]) for ln in ordered]
    hint, cause = _hint(ctx, kind, ordered, after_ready)
    title = f"{info.title} ({cause})" if cause else info.title
    return Diagnosis(
        kind=kind,
        evidence=items,
        hint=hint,
        confidence=round(confidence, 2),
        fingerprint=fingerprint(kind, [e.text for e in items]),
        summary=f"{title}: {summary}" if summary else title,
    )


def _first_cause(
    ctx: _Context, lines: Sequence[Line], *, include_weak: bool, skip: frozenset[str] = frozenset()
) -> Diagnosis | None:
    for rule in ctx.sigs.rules:
        if (rule.weak and not include_weak) or rule.kind in skip:
            continue
        hits = _rule_lines(rule, lines, ctx.lines)
        if not hits:
            continue
        # The exception line says it better than the source line echoed above it ("raise RuntimeError(...)").
        primary = _distinct(sorted(hits, key=lambda ln: (_CODE.match(ln.message) is not None, ln.number)), 3)
        context = []
        frame = primary[0].frame
        if frame is not None and primary[0].number - frame.number <= _FRAME_LOOKBACK:
            context.append(frame)
        wrapper = next((ln for ln in lines if _matches(ctx.sigs.capture_wrappers + ctx.sigs.engine_wrappers, ln)), None)
        if wrapper is not None:
            context.append(wrapper)
        evidence = primary + sorted(context, key=lambda ln: ln.number)
        ctx.trace.append((rule, primary[0]))
        confidence = rule.confidence * (0.8 if len(hits) == 1 and rule.weak else 1.0)
        after_ready = bool(lines) and lines is not ctx.lines
        return _diagnosis(
            ctx,
            rule.kind,
            confidence,
            evidence,
            f"line {primary[0].number}: {primary[0].message[:200]}",
            after_ready=after_ready,
        )
    return None


def _crash_lines(ctx: _Context, lines: Sequence[Line] | None = None) -> list[Line]:
    return [ln for ln in (ctx.lines if lines is None else lines) if not ln.quiet and _matches(ctx.sigs.crash, ln)]


def _not_ready(ctx: _Context) -> Diagnosis:
    """No readiness in the log: a root-cause rule, else what the context says."""
    cause = _first_cause(ctx, ctx.lines, include_weak=False)
    if cause is not None:
        return cause
    sig = _signal(ctx.exit_code)
    crashes = _crash_lines(ctx)
    exited = ctx.exit_code is not None and ctx.exit_code != 0
    crashed = bool(crashes) or exited
    derived, phase_line = _phase_at(ctx)
    phase = _PHASE_ALIASES.get(ctx.phase, ctx.phase) if ctx.phase not in _NO_PHASE and ctx.phase else derived
    wrappers = [ln for ln in ctx.lines if _matches(ctx.sigs.capture_wrappers, ln)]
    in_capture = phase == "graph_capture"
    capture_begin = phase_line if derived == "graph_capture" else None
    failing = crashed or ctx.timed_out

    if wrappers or (in_capture and failing):
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
        how = "crashed" if crashed else "ran past the deadline"
        where = f" (line {evidence[0].number})" if evidence else ""
        return _diagnosis(
            ctx,
            "cuda_graph_capture_failed",
            0.7 if wrappers else 0.55,
            evidence,
            f"startup {how} during CUDA-graph capture{where}",
        )

    # The whole line too: zsh's "[1]    16261 killed     python3 ..." loses its job number to prefix peeling.
    killed = [
        ln for ln in ctx.lines if _matches(ctx.sigs.killed, ln) or any(p.search(ln.text) for p in ctx.sigs.killed)
    ]
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
    if weak is not None and not crashes:
        return weak
    if ctx.timed_out and not crashes:
        evidence = [phase_line] if phase_line else []
        last = f" after reaching phase {phase!r}" if phase else ""
        return _diagnosis(ctx, "startup_timeout", 0.5, evidence, f"startup ran past the readiness deadline{last}")

    if crashed:
        evidence = crashes[-3:]
        guess = {"load": "model_load_error", "compile": "torch_compile_error"}.get(phase or "")
        if guess:
            return _diagnosis(
                ctx, guess, 0.3, evidence, f"crashed during phase {phase!r}; the error text names no known cause"
            )
        exit_text = f" (exit status {ctx.exit_code})" if ctx.exit_code is not None else ""
        return _diagnosis(ctx, "unknown", 0.2, evidence, f"the process failed{exit_text} with no recognised cause")

    evidence = [phase_line] if phase_line else []
    reached = (
        f"the last phase reached is {phase!r} (line {phase_line.number})"
        if phase and phase_line
        else (f"the loop's last phase is {phase!r}" if phase else "no startup phase marker either")
    )
    return _diagnosis(
        ctx, "inconclusive", 0.0, evidence, f"no readiness marker and no failure evidence in the log; {reached}"
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


def _after_ready(ctx: _Context, ready: Line | None) -> Diagnosis | None:
    """The failure after the ready line, or None when the server stayed up as far as the log shows."""
    after = [ln for ln in ctx.lines if ready is None or ln.number > ready.number]
    died = [ln for ln in after if _matches(ctx.sigs.death, ln)]
    # A recorded exit after ready is a death even with status 0: a server gone mid-smoke did not miscompute.
    exited = ctx.exit_code is not None and (ctx.exit_code != 0 or (ctx.phase or "") in _AFTER_READY_PHASES)
    served_last = max((ln.number for ln in ctx.scan.serving if _matches(ctx.sigs.ready_any, ln)), default=0)
    strong = _first_cause(ctx, after, include_weak=False, skip=frozenset(_NOT_FATAL_AFTER_READY)) if after else None
    tracebacks = [ln for ln in after if not ln.quiet and "Traceback (most recent call last)" in ln.text]
    # A rule hit or a traceback after which the server served again did not take it down; a death line always does.
    survived = strong is not None and bool(strong.evidence) and served_last > strong.evidence[0].line
    crashed_late = bool(tracebacks) and served_last < tracebacks[-1].number
    if not (died or exited or (strong is not None and not survived) or crashed_late):
        return None
    if strong is not None:
        return strong
    # A server that became ready did not time out starting, whatever a later line says.
    cause = _first_cause(ctx, after, include_weak=False, skip=frozenset({"startup_timeout"}))
    if cause is not None:
        return cause
    evidence = died[:2] or (_crash_lines(ctx, after)[-3:]) or _crash_lines(ctx)[-2:]
    if any(_matches(ctx.sigs.killed, ln) for ln in died) or _signal(ctx.exit_code) == 9:
        return _diagnosis(ctx, "host_oom_killed", 0.45, evidence, "the server was killed after it became ready")
    return _diagnosis(ctx, "unknown", 0.2, evidence, "the server died after it became ready, with no recognised cause")


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


def _bench_failure(ctx: _Context, bench: BenchResult | None, ready: Line | None, where: str) -> Diagnosis:
    """A bench that failed on a server whose log shows no failure: its request errors, or the load it could not meet.

    Never ``healthy``: the attempt failed. Errors get ``bench_errors`` with their counts by name, the client's error
    samples as evidence (line 0: not a log line) next to the server's own error lines after the ready line, and a hint
    that says what each class of error seen usually means. A bench with no errors that failed (an SLA search whose
    lowest load missed) is ``below_gate``.
    """
    after = [ln for ln in ctx.lines if ready is None or ln.number > ready.number]
    near = _crash_lines(ctx, after)[-3:]
    log_evidence = [*([ready] if ready else []), *near]
    if bench is None:
        return _diagnosis(
            ctx,
            "bench_errors",
            0.4,
            log_evidence,
            f"{where}; the bench failed before it measured a level (no bench result: the attempt's note says why)",
        )
    counts, examples, failed, sent = _bench_errors(bench)
    if not counts:
        what = "no load met the SLA" if bench.sla is not None else "a bench level failed"
        return _diagnosis(ctx, "below_gate", 0.8, log_evidence, f"{where}; it answered every bench request but {what}")
    ranked = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    listed = ", ".join(f"{name} {n}" for name, n in ranked)
    first = examples.get(ranked[0][0])
    d = _diagnosis(
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
    d.evidence = [*samples, *d.evidence][:_MAX_EVIDENCE]
    classes = [c for c in ctx.sigs.bench_classes if any(c.match.search(name) for name, _ in ranked)]
    meanings = " ".join(f"{c.title[:1].upper()}{c.title[1:]}: {c.hint}" for c in classes)
    d.hint = f"{d.hint} {meanings}".strip()
    d.fingerprint = fingerprint("bench_errors", [e.text for e in d.evidence])
    return d


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
    ctx = _Context(scan, sigs or signatures(), server, exit_code, timed_out, phase, knobs or {})
    if trace is not None:
        ctx.trace = trace
    post_ready_phase = (phase or "") in _AFTER_READY_PHASES
    # A smoke result exists only if the loop saw the server ready, whatever the log shows.
    loop_saw_ready = (
        smoke is not None or bench is not None or (timings is not None and timings.launch_to_ready_s is not None)
    )
    unreadable = _unreadable(scan)
    if unreadable is not None and not (exit_code or timed_out or post_ready_phase or loop_saw_ready):
        return _diagnosis(ctx, "inconclusive", 0.0, [], unreadable)
    ready = _ready_line(ctx)
    # A ready line whose health check never answered before the deadline is a stall, not a healthy server.
    log_ready = ready is not None and not (timed_out and not loop_saw_ready)
    became_ready = log_ready or post_ready_phase or loop_saw_ready
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
        return _diagnosis(ctx, "wrong_output", 0.9 if decisive else 0.5, [ready] if ready else [], smoke.summary())

    evidence = [ready] if ready else []
    where = f"ready at line {ready.number}" if ready else "the loop saw it ready"
    if phase == "gates":
        return _diagnosis(ctx, "below_gate", 0.9, evidence, f"{where}; it answered right but missed a bench gate")
    # A failed attempt is never healthy: the log shows none, so the loop's own measurement says what failed.
    if phase == "bench" or (bench is not None and not bench.passed):
        return _bench_failure(ctx, bench, ready, where)
    if phase == "smoke":
        return _diagnosis(ctx, "wrong_output", 0.3, evidence, f"{where}; the smoke test failed (no smoke result given)")
    return _diagnosis(ctx, "healthy", 0.9, evidence, where)


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


def diagnose(log: str, **options: Unpack[DiagnoseOptions]) -> Diagnosis:
    """Why an attempt failed (or ``healthy``): kind, evidence lines (1-based), a hint in ``server``'s flag spelling.

    ``exit_code`` follows the shell (128+N for signal N; negative Python return codes are accepted too); None means
    the process had not exited. ``timed_out`` means the readiness deadline passed with the process still alive.
    ``smoke`` with wrong answers on a healthy log gives ``wrong_output``. ``knobs`` (the attempt's) let the hint name
    the current value of the knob to change and a next value.
    """
    return diagnose_scan(scan_text(log), **options)


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
    sigs = sigs or signatures()
    try:
        scan = scan_file(path, sigs)
    except FileNotFoundError as e:
        raise UsageError(f"log file not found: {path}", hint="pass the path of a server log") from e
    except IsADirectoryError as e:
        raise UsageError(f"{path} is a directory, not a log file") from e
    except OSError as e:
        raise UsageError(f"cannot read log file {path}: {e.strerror or e}") from e
    return diagnose_scan(scan, sigs=sigs, trace=trace, **options)
