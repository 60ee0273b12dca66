"""The hint of a diagnosis: the cause within its kind, and the steps in the recipe's flag spelling with values."""

from __future__ import annotations

import re
from collections.abc import Sequence

from campaign.diagnosis.case import FRAME_NAME, NO_PHASE, PHASE_ALIASES, Case, matches, phase_at
from campaign.diagnosis.family import flags_by_knob, knob_readers
from campaign.diagnosis.signatures import Cause, KindInfo, Step
from campaign.logscan import Line
from campaign.records import KnobValue


def knob_value(ctx: Case, knob: str) -> KnobValue:
    """The knob's value: the attempt's, else what the server printed of its own arguments."""
    if knob in ctx.knobs and ctx.knobs[knob] is not None:
        return ctx.knobs[knob]
    own = ctx.family.flags.get(knob) if ctx.family is not None else None
    for rx in knob_readers(own).get(knob, ()):
        for ln in ctx.lines:
            m = rx.search(ln.text)
            if m:
                text = m.group(1)
                try:
                    return int(text) if re.fullmatch(r"\d+", text) else float(text)
                except ValueError:
                    return text
    return None


def _flag(ctx: Case, knob: str) -> str:
    """The knob's flag in the recipe's spelling; without a recipe, the knob and every shipped recipe's flag for it."""
    if ctx.family is not None and knob in ctx.family.flags:
        return ctx.family.flags[knob]
    by_flag: dict[str, list[str]] = {}
    for server, flag in sorted(flags_by_knob().get(knob, {}).items()):
        by_flag.setdefault(flag, []).append(server)
    spelled = ", ".join(f"{'/'.join(servers)} {flag}" for flag, servers in by_flag.items())
    return f"{knob} ({spelled})" if spelled else knob


def _family_name(ctx: Case) -> str | None:
    """The key of per-server hints: the recipe's own name (a recipe given by path too), else what was passed."""
    return ctx.family.name if ctx.family is not None else ctx.server


def _fmt(value: float) -> str:
    # Four significant digits: 0.001 stays 0.001 (two fixed decimals showed it as "0."), 0.85 stays 0.85.
    return str(int(value)) if float(value).is_integer() and abs(value) >= 1 else f"{value:.4g}"


def _step_text(ctx: Case, step: Step) -> str | None:
    """One step in words: the flag, the direction, and from the current value to the next; None if no such flag."""
    if ctx.family is not None and step.knob not in ctx.family.flags:
        return None  # the recipe has no such knob: the other steps say what to do
    flag = _flag(ctx, step.knob)
    now = knob_value(ctx, step.knob)
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


def _cause(ctx: Case, kind: str, evidence: Sequence[Line], after_ready: bool) -> Cause | None:
    """The first cause of ``kind`` that applies to this log (a cause with no condition applies to any)."""
    at = evidence[0].number if evidence else None
    phase, _ = phase_at(ctx, at)
    if phase is None and ctx.phase and ctx.phase not in NO_PHASE:
        phase = PHASE_ALIASES.get(ctx.phase, ctx.phase)
    for c in ctx.sigs.causes.get(kind, ()):
        if c.after_ready:
            if after_ready:
                return c
            continue
        if c.knob_is and all(knob_value(ctx, k) == v for k, v in c.knob_is.items()):
            return c
        if c.evidence and any(matches(c.evidence, ln) or c.evidence[0].search(ln.text) for ln in ctx.lines):
            return c
        if c.phases and phase in c.phases:
            return c
        if not (c.knob_is or c.evidence or c.phases):
            return c
    return None


def hint_for(ctx: Case, kind: str, evidence: Sequence[Line], after_ready: bool) -> tuple[str, str]:
    """The hint and the cause's title ('' when the kind has no causes or none applies)."""
    info = ctx.sigs.kinds.get(kind) or KindInfo(title=kind, hints={})
    cause = _cause(ctx, kind, evidence, after_ready)
    if cause is None:
        return info.hint(_family_name(ctx)), ""
    text = cause.hint(_family_name(ctx)) or info.hint(_family_name(ctx))
    steps = [t for t in (_step_text(ctx, s) for s in cause.steps) if t]
    if steps:
        text = text.rstrip() + " Next: " + "; or ".join(steps) + "."
    if kind in ("stream_capture_isolation", "cuda_graph_capture_failed"):
        for ln in evidence:
            if m := FRAME_NAME.match(ln.message):
                text += f" What ran inside the capture: {m.group(1)} (log line {ln.number})."
                break
    return text, cause.title
