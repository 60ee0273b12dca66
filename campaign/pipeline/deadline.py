"""The deadline policy: a step that would end past the experiment's ``deadline`` is not begun, and the report says so.

Costs come from stored timings of the recipe on the host (``estimate``), else from this run's own attempts. The
run ends cleanly at the first variant, retry or relaunch that would not finish in time; ``ended_early`` says why
and ``not_run`` lists what a ``--resume`` would still run.
"""

from __future__ import annotations

import time

from campaign.config import PlannedVariant
from campaign.estimate import attempt_cost, variant_cost
from campaign.pipeline.events import Event
from campaign.pipeline.state import RunState


def past_deadline(state: RunState, pv: PlannedVariant, left: list[str]) -> bool:
    """True (the run ends here, cleanly) when ``pv`` would not finish before the experiment's ``deadline``."""
    if state.exp.deadline is None:
        return False
    if state.history is None:
        state.history = state.store.reports_of(state.loaded.recipe.name, state.host.name)
    cost = variant_cost(state.history, pv, state.exp.name)
    if cost is None:
        # Nothing stored: this run's own attempts so far are the best guess.
        costs = [c for a in state.report.attempts if a.role == "variant" and (c := attempt_cost(a)) is not None]
        cost = sum(costs) / len(costs) if costs else 0.0
    dropped = f"{len(left)} variant(s) not run (`campaign run --resume {state.report.run_id}` runs them)"
    if not ends_at_deadline(state, cost, pv.name, dropped):
        return False
    state.report.not_run = left
    return True


def past_launch_deadline(state: RunState, pv: PlannedVariant, launch: int) -> bool:
    """True (the run ends here, cleanly) when one more launch of ``pv`` would not finish before the deadline."""
    costs = [c for a in state.report.attempts if a.variant == pv.name and (c := attempt_cost(a)) is not None]
    cost = sum(costs) / len(costs) if costs else 0.0
    return ends_at_deadline(state, cost, f"launch {launch} of {pv.name}", f"relaunch rounds from {launch} not run")


def retry_past_deadline(state: RunState, pv: PlannedVariant, delay: float) -> bool:
    """Whether a retry of ``pv`` after ``delay`` would end past the deadline (then it is not taken)."""
    deadline = state.exp.deadline
    if deadline is None:
        return False
    cost = next((c for a in reversed(state.report.attempts) if (c := attempt_cost(a)) is not None), 0.0)
    if time.monotonic() - state.t0 + delay + cost <= deadline:
        return False
    state.emit(Event("note", variant=pv.name, text=f"{pv.name}: no retry, it would end past the deadline"))
    return True


def ends_at_deadline(state: RunState, cost: float, what: str, dropped: str) -> bool:
    """True, with the reason noted in the report, when ``what`` (``cost`` seconds) would end past the deadline."""
    deadline = state.exp.deadline
    elapsed = time.monotonic() - state.t0
    if deadline is None or elapsed + cost <= deadline:
        return False
    state.report.ended_early = (
        f"deadline {deadline:g} s: {what} would take about {cost:.0f} s with "
        f"{max(0.0, deadline - elapsed):.0f} s left; {dropped}"
    )
    state.note(state.report.ended_early)
    return True
