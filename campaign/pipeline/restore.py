"""Putting the box back: the known-good relaunched and proven, the hygiene check instead, and the run's last act.

After a failed attempt the experiment's ``restore`` policy (``after_failure``) says which: ``restore`` relaunches
the host's known-good and proves it again (readiness + smoke, no bench); ``hygiene`` only checks that nothing of
ours still runs. ``leave`` applies ``at_end`` when the run ends; ``restore_known_good`` is the whole of
``campaign restore``.
"""

from __future__ import annotations

from campaign.config import PlannedVariant
from campaign.errors import CampaignError, DirtyHost, RestoreFailed
from campaign.pipeline.attempt import run_attempt
from campaign.pipeline.events import Event
from campaign.pipeline.state import RunState
from campaign.readiness import health_status
from campaign.records import Attempt, Final, Restore
from campaign.retry import needs_proven_box
from campaign.store import KnownGood


def after_failure(state: RunState, failed: Attempt) -> Restore:
    """The known-good put back (``restore``) or the box checked clean (``hygiene``), as the ``restore`` policy says."""
    policy = state.exp.restore
    now = policy == "after_failure" or (
        policy == "when_needed" and needs_proven_box(failed.diagnosis.kind if failed.diagnosis else None)
    )
    return restore(state, failed) if now else hygiene(state, failed)


def hygiene(state: RunState, failed: Attempt) -> Restore:
    """No restore between variants: the box is only checked clean (nothing of ours runs) before the next one."""
    exp = state.exp
    stop = state.control.stop(None, grace_s=exp.timeouts.stop_grace_s)
    kind = failed.diagnosis.kind if failed.diagnosis else "unknown"
    result = Restore(
        outcome="not_needed",
        detail=f"restore: {exp.restore} ({kind} leaves the box usable); the box checked clean: {stop.detail}"
        + (f"; {stop.foreign}" if stop.foreign else ""),
    )
    failed.restore = result
    state.report.restores.append(result.model_copy(update={"attempt": failed.index}))
    state.save()
    state.emit(Event("note", failed.index, failed.variant, failed.role, text=result.detail or ""))
    return result


def restore(state: RunState, failed: Attempt) -> Restore:
    """Relaunch the host's known-good and prove it; record the outcome on ``failed`` and in the report."""
    exp = state.exp
    known = state.known_good()
    if known is None:
        # Nothing to put back: a box left clean is the known state (exit 1, the remaining variants still run); only
        # a stop that leaves it dirty fails the restore (N22b: this ended the run with exit 3 on a clean box).
        try:
            state.control.stop(None, grace_s=exp.timeouts.stop_grace_s)
        except DirtyHost as e:
            result = Restore(outcome="failed", detail=str(e))
        else:
            result = Restore(
                outcome="not_needed",
                detail=f"no known-good configuration of {exp.name} exists for this host yet; the failed server was "
                "stopped and the box left clean",
            )
    else:
        state.emit(Event("restore_start", variant=known.variant, text=f"restoring {known.variant}"))
        result = relaunch(state, known)
    failed.restore = result
    state.report.restores.append(result.model_copy(update={"attempt": failed.index}))
    state.save()
    state.emit(
        Event("restore_end", variant=result.variant, text=f"restore {result.outcome}: {result.detail}", restore=result)
    )
    return result


def relaunch(state: RunState, known: KnownGood) -> Restore:
    """Launch the known-good's exact spec and prove it (readiness + smoke, no bench)."""
    pv = PlannedVariant(name=known.variant, knobs={}, spec=known.spec)
    timeouts = state.exp.timeouts
    att = run_attempt(state, pv, "restore", ready_deadline=timeouts.restore_ready_s or timeouts.ready_s, bench=False)
    ok = att.outcome == "passed"
    return Restore(
        outcome="restored" if ok else "failed",
        variant=known.variant,
        spec_hash=known.spec_hash,
        attempt=att.index,
        ready_s=att.timings.launch_to_ready_s,
        cold_start_ready_s=_cold_start_ready_s(state, known),
        mode="relaunch",
        phases={
            "stop_s": att.timings.stop_s,
            "launch_to_ready_s": att.timings.launch_to_ready_s,
            "smoke_s": att.timings.smoke_s,
        },
        detail=(
            f"{known.variant} relaunched and proven (ready, smoke {att.smoke.passed if att.smoke else 0} right)"
            if ok
            else f"the known-good {known.variant} did not come back: {att.note or att.failed_phase}"
        ),
    )


def _cold_start_ready_s(state: RunState, known: KnownGood) -> float | None:
    """Launch to ready of the attempt that first proved ``known`` (what a restore is measured against)."""
    if known.run_id == state.report.run_id:
        attempts = state.report.attempts
    else:
        try:
            attempts = state.store.load_report(known.run_id).attempts
        except CampaignError:
            return None
    match = [a for a in attempts if a.index == known.attempt]
    return match[0].timings.launch_to_ready_s if match else None


def prove(state: RunState, pv: PlannedVariant, att: Attempt) -> None:
    """A variant that passed smoke and its gates becomes the known-good (the baseline's bench: the gates' ruler)."""
    proven = att.smoke is not None and att.smoke.ok and all(g.passed for g in att.gates)
    if proven:
        state.store.set_known_good(state.host.name, state.exp.name, pv.name, pv.spec, state.report.run_id, att.index)
    if pv.name == state.exp.baseline.name and att.bench is not None:
        state.baseline_bench = att.bench


def leave(state: RunState) -> None:
    """Apply ``at_end``: keep the known-good running (default), stop everything, or leave the last server."""
    exp, control, report = state.exp, state.control, state.report
    known = state.known_good()
    current = control.current()
    if exp.at_end == "stop":
        stop = control.stop(None, grace_s=exp.timeouts.stop_grace_s)
        detail = f"stopped (at_end: stop): {stop.detail}, no process of it left"
        report.final = Final(detail=detail + (f"; {stop.foreign}" if stop.foreign else ""), healthy=True)
        return
    if exp.at_end == "known_good" and known is not None:
        alive = current is not None and control.alive(current)
        if current is None or current.spec_hash != known.spec_hash or not alive:
            state.note(f"at_end: bringing back the known-good {known.variant}")
            relaunch(state, known)
    current = control.current()
    if current is None and known is None:
        report.final = Final(healthy=True, detail=f"left clean: no known-good of {exp.name} yet, nothing is running")
        return
    if current is None:
        report.final = Final(healthy=False, detail="nothing is running")
        return
    healthy = control.alive(current) and (
        health_status(state.host.url(current.port), state.loaded.recipe.health_path) == 200
    )
    report.final = Final(variant=current.variant, spec_hash=current.spec_hash, healthy=healthy)


def restore_known_good(state: RunState) -> None:
    """`campaign restore`: the known-good relaunched and proven is the whole run."""
    known = state.known_good()
    if known is None:
        raise RestoreFailed(f"the known-good record of {state.host.name} disappeared during the run")
    result = relaunch(state, known)
    state.report.restores.append(result)
    ok = result.outcome == "restored"
    state.report.status = "passed" if ok else "restore_failed"
    state.report.final = Final(
        variant=known.variant, spec_hash=known.spec_hash, healthy=ok, detail=None if ok else result.detail
    )


def put_back_unrecorded(state: RunState, err: CampaignError) -> None:
    """After a store error mid-run (a full disk, a locked index): the server under test is stopped and the
    known-good relaunched and proven where that still works, so no unproven variant is left serving; the run still
    ends unproven (its record is incomplete), and each step is a note."""
    try:
        known = state.store.known_good(state.host.name, state.exp.name)
    except CampaignError:
        known = None
    try:
        stop = state.control.stop(None, grace_s=state.exp.timeouts.stop_grace_s)
        state.note(f"after the store error ({err}): {stop.detail}")
        if known is not None:
            restore = relaunch(state, known)
            state.report.restores.append(restore)
            state.note(f"after the store error: restore {restore.outcome}: {restore.detail}")
    except CampaignError as again:
        state.note(f"after the store error, the box could not be put back: {again}")
