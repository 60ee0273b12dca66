"""Relaunch rounds: with ``bench.launches`` > 1, every passed variant is launched again, each launch one sample.

Rounds interleave the variants (a, b, a, b, ...) instead of launching each variant's copies back to back: a box
drifts over minutes (load, clocks, caches), and back-to-back launches would put that drift into the difference
between variants. A relaunch that fails is diagnosed and restored from like a failed variant, and its variant
gets no further launches. A resumed run launches only the copies still missing.
"""

from __future__ import annotations

from campaign.config import PlannedVariant
from campaign.pipeline.attempt import run_attempt
from campaign.pipeline.deadline import past_launch_deadline
from campaign.pipeline.restore import after_failure
from campaign.pipeline.state import RunState
from campaign.records import Final
from campaign.resume import finished


def relaunch_rounds(state: RunState) -> None:
    """Launch every passed variant again, round by round, until ``bench.launches`` launches of each passed."""
    settings = state.bench_settings
    if settings is None or settings.launches < 2:
        return
    live = [pv for pv in state.planned if passed_launches(state, pv) is not None]
    for launch in range(1, settings.launches):
        for pv in list(live):
            have = passed_launches(state, pv)
            if have is None:
                live.remove(pv)
                continue
            if have > launch:
                continue
            if past_launch_deadline(state, pv, launch):
                return
            again = run_attempt(state, pv, "relaunch", launch=launch)
            if again.outcome == "passed":
                continue
            live.remove(pv)
            restore = after_failure(state, again)
            if restore.outcome == "failed":
                state.report.status = "restore_failed"
                state.report.final = Final(healthy=False, detail=restore.detail)
                return


def passed_launches(state: RunState, pv: PlannedVariant) -> int | None:
    """How many launches of ``pv`` this run holds, all passed; None when it has none or one of them failed."""
    spec = pv.spec.spec_hash()
    mine = [
        a
        for a in state.report.attempts
        if a.variant == pv.name and a.role in ("variant", "relaunch") and a.spec_hash == spec and finished(a)
    ]
    last_variant = next((a for a in reversed(mine) if a.role == "variant"), None)
    if last_variant is None or last_variant.outcome != "passed":
        return None
    relaunches = [a for a in mine if a.role == "relaunch"]
    if any(a.outcome != "passed" for a in relaunches):
        return None
    return 1 + len(relaunches)
