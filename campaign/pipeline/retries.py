"""The retry policy: a transient failure (``retry.failure_class``) is attempted again within the experiment's budget.

Each retry waits longer (``retry.RetryBudget``), is not taken when it would end past the deadline, and names the
attempt it retries (``Attempt.retry_of``). A deterministic failure is never retried.
"""

from __future__ import annotations

from campaign.config import PlannedVariant
from campaign.pipeline.attempt import run_attempt
from campaign.pipeline.deadline import retry_past_deadline
from campaign.pipeline.events import Event
from campaign.pipeline.state import RunState
from campaign.records import Attempt
from campaign.retry import RetryBudget, failure_class


def attempt_with_retries(state: RunState, pv: PlannedVariant) -> Attempt:
    """Attempt ``pv``; a transient failure is attempted again within the budget, waiting longer each time."""
    att = run_attempt(state, pv, "variant")
    budget = RetryBudget(state.exp.retry)
    while att.outcome == "failed" and budget.left:
        kind = att.diagnosis.kind if att.diagnosis else None
        if failure_class(kind, att.failed_phase) != "transient":
            break
        delay = budget.delay_s()
        if retry_past_deadline(state, pv, delay):
            break
        state.emit(
            Event(
                "note",
                att.index,
                pv.name,
                att.role,
                text=f"{pv.name}: {kind} is transient; retry {budget.used + 1} of {budget.config.budget} "
                f"in {delay:g} s",
            )
        )
        state.intr.sleep(delay)  # a signal ends the wait at once
        budget = budget.spend()
        first = att.index
        att = run_attempt(state, pv, "variant")
        att.retry_of = first
        state.save()
    return att
