"""The diagnosis rules file (``campaign/signatures.yaml``), compiled: kinds, root-cause rules, causes and context.

The one home of a failure kind: its title, its hints, its retry class (``transient`` or ``deterministic``) and whether
a failure of it may leave the box damaged all live in the rules file, and ``campaign.retry`` reads them from here, so
adding a kind is one YAML entry (plus its log and test). A malformed file is a ``ConfigError`` naming the field.
"""

from __future__ import annotations

import dataclasses
import functools
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

import yaml

from campaign import logscan, needles
from campaign.diagnosis import family
from campaign.errors import ConfigError
from campaign.records import KnobValue

#: Kinds campaign's own checks produce (not only rules): the rules file must declare each of them.
CODE_KINDS = (
    "cuda_graph_capture_failed",
    "gpu_oom",
    "host_oom_killed",
    "torch_compile_error",
    "model_load_error",
    "startup_timeout",
    "wrong_output",
    "unresponsive",
    "config_not_applied",
    "below_gate",
    "bench_errors",
    "healthy",
    "unknown",
    "inconclusive",
)
#: Kinds that are verdicts about the log, not failures: they carry no retry class.
NOT_FAILURES = frozenset({"healthy"})
FAILURE_CLASSES = ("transient", "deterministic")


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
    """A failure kind: its title, its next-step hint per server family (``default`` for the rest), its retry class.

    ``failure_class``: ``transient`` (the same launch can pass on its next try) or ``deterministic``;
    ``transient_phases``: phases in which a deterministic kind is transient after all (a start that timed out after its
    ready line is health flapping); ``damaging``: after it the box must be proven again before the next launch.
    """

    title: str
    hints: dict[str, str]
    failure_class: str = "deterministic"
    transient_phases: frozenset[str] = frozenset()
    damaging: bool = False

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


@dataclass(frozen=True, eq=False)
class Signatures:
    """The whole rules file, compiled (compared by identity: one compiled file per ``signatures()`` call)."""

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
    #: A part of a server with several (a model, a shard, a rank, a worker) reported failed or unavailable.
    part_failed: tuple[re.Pattern[str], ...] = ()
    causes: dict[str, tuple[Cause, ...]] = field(default_factory=dict)
    #: Every pattern source, by scan category (the needle index is built from these).
    sources: dict[str, tuple[str, ...]] = field(default_factory=dict)
    bench_classes: tuple[BenchErrorClass, ...] = ()

    def with_ready(self, marker: str) -> Signatures:
        """These rules with a recipe's ready marker as proof of readiness too (one copy per marker)."""
        if marker in self.sources.get("ready", ()):
            return self
        cache: dict[str, Signatures] = self.__dict__.setdefault("_with_ready", {})
        if marker not in cache:
            ready = (*self.sources.get("ready", ()), marker)
            cache[marker] = dataclasses.replace(self, ready_any=_union(ready), sources={**self.sources, "ready": ready})
        return cache[marker]

    @functools.cached_property
    def categories(self) -> logscan.Categories:
        """The scan categories of these rules: kept lines, once-only markers, traceback frames."""
        index = needles.NeedleIndex()
        bits = {"ready": 2, "ready_alt": 4, "shape": 8, "frame": 16}
        for cat, pats in self.sources.items():
            if cat != "keep":
                for p in pats:
                    index.add(p, bits[cat])
        index.add(r'File "', bits["frame"])
        # Every kept pattern gets a bit of its own, so a needle hit can be confirmed against that pattern alone.
        keep_rx: dict[int, re.Pattern[str]] = {}
        keep, sensitive = 0, 0
        # The lines a server prints its own arguments on are kept too: a hint reads a knob's value from them.
        readers = [p for ps in family.reader_sources().values() for p in ps]
        for i, p in enumerate(dict.fromkeys([*self.sources.get("keep", ()), *readers])):
            bit = 1 << (5 + i)
            index.add(p, bit)
            keep_rx[bit] = re.compile(p, re.IGNORECASE)
            keep |= bit
            if needles.digit_sensitive(p):
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


def _kind(name: str, info: Any) -> KindInfo:
    """One entry under ``kinds:``; its retry class and ``damaging`` are required of every failure kind."""
    where = f"kinds.{name}"
    if not re.fullmatch(r"[a-z][a-z0-9_]*", name) or not isinstance(info, dict):
        raise ConfigError(
            "a kind is a snake_case name with {title, hint, class, damaging}", file="signatures.yaml", field=where
        )
    hints = info.get("hint") or {}
    if not isinstance(hints, dict):
        hints = {"default": hints}
    cls = info.get("class")
    damaging = info.get("damaging")
    if name not in NOT_FAILURES:
        if cls not in FAILURE_CLASSES:
            raise ConfigError(
                f"class must be one of {', '.join(FAILURE_CLASSES)} (got {cls!r})",
                file="signatures.yaml",
                field=f"{where}.class",
            )
        if not isinstance(damaging, bool):
            raise ConfigError("damaging must be true or false", file="signatures.yaml", field=f"{where}.damaging")
    phases = info.get("transient_in_phases") or []
    if not isinstance(phases, list):
        raise ConfigError("expected a list of phases", file="signatures.yaml", field=f"{where}.transient_in_phases")
    return KindInfo(
        title=str(info.get("title", name)),
        hints={str(k): str(v) for k, v in hints.items()},
        failure_class=str(cls or "deterministic"),
        transient_phases=frozenset(str(p) for p in phases),
        damaging=bool(damaging),
    )


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
    kinds = {str(name): _kind(str(name), info) for name, info in (data.get("kinds") or {}).items()}
    missing = [k for k in CODE_KINDS if k not in kinds]
    if missing:
        raise ConfigError(
            f"kinds {', '.join(missing)} are produced by campaign's own checks and must be declared",
            file="signatures.yaml",
            field="kinds",
        )
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
    lists = {n: listed(data.get(n), n) for n in ("crash", "death", "memory_pressure", "killed", "part_failed")}

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
    if "knobs" in data:
        raise ConfigError(
            "knob spellings live in the recipes (campaign/recipes/), not in the rules file",
            file="signatures.yaml",
            field="knobs",
        )
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
        part_failed=_union(lists["part_failed"]),
        causes={k: tuple(v) for k, v in causes.items()},
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
