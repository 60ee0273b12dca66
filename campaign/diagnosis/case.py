"""The case under judgement: a scanned log with the attempt's facts, and how rules and phases read its lines."""

from __future__ import annotations

import bisect
import itertools
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from campaign.diagnosis.family import Family
from campaign.diagnosis.signatures import Rule, Signatures
from campaign.fingerprint import normalise
from campaign.logscan import Line, Scan
from campaign.records import KnobValue

PHASE_ALIASES = {"capture": "graph_capture", "cuda_graph": "graph_capture", "graph": "graph_capture"}
#: Phases that say nothing about where startup got (the loop's name for "no marker seen yet").
NO_PHASE = {"launch", ""}
FRAME_NAME = re.compile(r'^\s*File "([^"]+", line \d+, in \w+)')
CODE_LINE = re.compile(r'^\s*(raise |return |File "|[\w.]+ = |\^+$)')
MAX_EVIDENCE = 6
FRAME_LOOKBACK = 30
#: Where a traceback's frames end: its exception line, or the header of the next traceback.
TRACEBACK_END = re.compile(r"^(\w+\.)*\w*(Error|Exception|Exit|Interrupt)\b|^Traceback \(most recent|^During handling")


def matches(patterns: Sequence[re.Pattern[str]], line: Line) -> bool:
    # The message (prefixes peeled) is what rules are written against: "^Killed$", "^usage:".
    return any(p.search(line.message) for p in patterns)


def is_innermost(frame: Line, everything: Sequence[Line]) -> bool:
    """Whether no deeper frame of the same traceback follows ``frame`` (as far as the kept lines show).

    Every kept line carries the last frame printed above it; one after ``frame``, before its traceback ends (an
    exception line, a new traceback), that names a later frame means the stack went deeper than ``frame``.
    """
    # Kept lines are in log order: start right after ``frame`` (a long log keeps tens of thousands of them).
    start = bisect.bisect_right(everything, frame.number, key=lambda ln: ln.number)
    for ln in itertools.islice(everything, start, None):
        if ln.number - frame.number > FRAME_LOOKBACK:
            break
        if ln.frame is not None and ln.frame.number > frame.number:
            return False
        if TRACEBACK_END.match(ln.message):
            break
    return True


def rule_lines(rule: Rule, lines: Sequence[Line], everything: Sequence[Line]) -> list[Line]:
    if rule.requires and not all(any(p.search(ln.text) for ln in everything) for p in rule.requires):
        return []
    hits = []
    for ln in lines:
        if ln.quiet and not rule.any_level:
            continue
        if matches(rule.patterns, ln) and not matches(rule.exclude, ln):
            if rule.innermost and FRAME_NAME.match(ln.message) and not is_innermost(ln, everything):
                continue
            hits.append(ln)
    return hits if len(hits) >= rule.min_hits else []


def signal_of(exit_code: int | None) -> int | None:
    """The signal that ended the process: shell style 128+N, or Python's negative return codes."""
    if exit_code is None:
        return None
    if exit_code < 0:
        return -exit_code
    if 128 < exit_code < 128 + 65:
        return exit_code - 128
    return None


def distinct(lines: Sequence[Line], limit: int) -> list[Line]:
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
class Case:
    """One log under judgement: its scan, the rules, and what the loop knows of the attempt."""

    scan: Scan
    sigs: Signatures
    server: str | None
    exit_code: int | None
    timed_out: bool
    phase: str | None
    knobs: Mapping[str, KnobValue]
    #: The recipe's family (ready marker, flags); None for a log judged by the generic patterns alone.
    family: Family | None = None
    #: The rule that decided, and its first evidence line (for scoring: which patterns a verdict rests on).
    trace: list[tuple[Rule, Line]] = field(default_factory=list)

    @property
    def lines(self) -> list[Line]:
        """The kept lines, in log order."""
        return self.scan.lines


def phase_at(ctx: Case, number: int | None = None) -> tuple[str | None, Line | None]:
    """The furthest startup phase the log reached (by line ``number``, if given), and the line that shows it."""
    best: tuple[int, str, Line] | None = None
    for ln in ctx.lines:
        if number is not None and ln.number > number:
            break
        for rank, (name, markers) in enumerate(ctx.sigs.phases):
            if matches(markers, ln) and (best is None or rank >= best[0]):
                best = (rank, name, ln)
    if best is None:
        return None, None
    return best[1], best[2]


def ready_line(ctx: Case) -> Line | None:
    """The first line that proves the server ready.

    With a recipe, its own ready marker (the scan looks for it) or a line of serving; without one, an HTTP server's
    start counts too, unless the log is shaped like a server that starts HTTP before its own warm-up request, which
    can still fail (the rules file's ``warmup_after_http`` shape).
    """
    if ctx.family is not None or ctx.scan.shaped:
        return ctx.scan.ready
    found = [ln for ln in (ctx.scan.ready, ctx.scan.ready_alt) if ln is not None]
    return min(found, key=lambda ln: ln.number) if found else None
