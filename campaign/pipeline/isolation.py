"""Isolation (``--isolate``): after a variant fails, the one-knob-back-to-baseline attempts that localise the cause.

``attribution.plan_isolation`` says which knob sets to try; each runs as an ``isolation`` attempt (never a
known-good candidate: it is an experiment about a failure). ``attribute`` explains the failures over all attempts
when the run ends.
"""

from __future__ import annotations

from typing import Any

from campaign.attribution import attribute, plan_isolation
from campaign.config import PlannedVariant, VariantConfig, render
from campaign.pipeline.attempt import run_attempt
from campaign.pipeline.events import Event
from campaign.pipeline.state import RunState
from campaign.records import Finding, show_value


def isolate(state: RunState, pv: PlannedVariant, tried: list[dict[str, Any]]) -> None:
    """Run the one-knob-back-to-baseline attempts that localise the failure of ``pv``."""
    extra = plan_isolation(pv.knobs, state.baseline_knobs, tried)
    if not extra:
        return
    state.emit(Event("isolation", variant=pv.name, text=f"{len(extra)} isolation attempt(s) for {pv.name}"))
    exp = state.exp
    version = state.plan.server_version if state.plan is not None else None
    for knobs in extra:
        changed = [f"{k}={show_value(v)}" for k, v in knobs.items() if pv.knobs.get(k) != v]
        name = f"{pv.name}~{'~'.join(changed) or 'same'}"
        # Raw args and env of the failed variant stay: only the knob under test moves.
        raw = pv.config
        variant = VariantConfig(
            name=_safe_name(name),
            knobs=knobs,
            args=raw.args if raw is not None else [],
            env=raw.env if raw is not None else {},
        )
        ipv = render(state.loaded.recipe, variant, exp.baseline, state.vars(), version)
        tried.append(dict(knobs))
        run_attempt(state, ipv, "isolation")


def explain(state: RunState) -> None:
    """With a matrix or ``--isolate``, attribute the run's failures to knobs (``report.attribution``)."""
    report = state.report
    if not (state.exp.matrix is not None or state.isolate):
        return
    if not any(a.outcome == "failed" for a in report.attempts if a.role != "restore"):
        return
    try:
        findings = attribute(report.attempts, state.baseline_knobs)
    except Exception as e:  # attribution is an explanation; a bug there must not lose the run's report
        report.attribution = [Finding(status="error", statement=f"attribution failed: {e!r}")]
        return
    report.attribution = findings


def _safe_name(name: str) -> str:
    return "".join(c if c.isalnum() or c in "._=,+-~" else "_" for c in name)[:120]
