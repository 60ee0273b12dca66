"""A run cut short: what the first signal, a second signal, or an error leaves recorded (``campaign.interruption``).

The first signal stops the variant under test and puts the known-good back (or stops, with ``at_end: stop`` or no
known-good yet); a second leaves at once, recording what still runs and the command that fixes it. Either way the
attempt in flight is closed ``interrupted`` with what it measured so far.
"""

from __future__ import annotations

import time

from campaign.errors import CampaignError
from campaign.interruption import Interrupted
from campaign.pipeline.restore import relaunch
from campaign.pipeline.state import RunState
from campaign.readiness import log_copy
from campaign.records import Final
from campaign.store import now_iso


def on_interrupt(state: RunState, e: Interrupted) -> None:
    """The first signal: stop the variant under test, put the known-good back (or stop), record it all."""
    report, exp, control = state.report, state.exp, state.control
    report.signal = e.name
    report.status = "interrupted"
    close_in_flight(state, f"interrupted by {e.name}", copy_log=True)
    state.note(f"{e.name}: stopping the server under test and putting the box back; a second signal leaves at once")
    report.final = Final(healthy=False, detail=f"interrupted by {e.name} while cleaning up")
    state.save()
    known = state.known_good()
    try:
        if exp.at_end == "stop" or known is None:
            stop = control.stop(None, grace_s=exp.timeouts.stop_grace_s)
            why = "at_end: stop" if known is not None else f"no known-good of {exp.name} yet"
            report.final = Final(
                healthy=True,
                detail=f"interrupted by {e.name}: {stop.detail}; nothing left running ({why})"
                + (f"; {stop.foreign}" if stop.foreign else ""),
            )
            return
        restore = relaunch(state, known)
        report.restores.append(restore)
    except CampaignError as err:
        report.final = Final(healthy=False, detail=f"interrupted by {e.name}; the box is left unproven: {err}")
        return
    ok = restore.outcome == "restored"
    cur = control.current()
    report.final = Final(
        variant=known.variant if ok else None,
        spec_hash=known.spec_hash if ok else None,
        healthy=ok,
        detail=(
            f"interrupted by {e.name}: the server under test was stopped; {restore.detail}"
            + (f"; running: {cur.describe()}" if ok and cur else "")
            if ok
            else f"interrupted by {e.name}; {restore.detail}: the box is left unproven"
        ),
    )


def left_now(state: RunState, e: Interrupted) -> None:
    """A second signal: record what still runs and the command that fixes it, and leave."""
    report = state.report
    report.signal = report.signal or e.name
    report.status = "interrupted"
    close_in_flight(state, f"interrupted by {e.name}")
    config = report.config_path or state.exp.name
    try:
        still = state.control.found_running()
    except CampaignError as err:
        still = f"unknown (the host did not answer: {err})"
    report.final = Final(
        healthy=False,
        detail=f"left at once on a second signal ({e.name}); still running: {still}; "
        f"to fix: `campaign stop {config}` (or `campaign restore {config}` to put the known-good back)",
    )


def close_in_flight(state: RunState, note: str, *, copy_log: bool = False) -> None:
    """The attempt in flight closed ``interrupted`` (its time run to here), its log copied when ``copy_log``."""
    for att in state.report.attempts:
        if att.outcome == "skipped" and att.ended_at is None:
            att.outcome = "interrupted"
            att.ended_at = now_iso()
            att.note = note
            # What was measured stands (ready, the phases that ended); the attempt's time runs to here.
            if att.index in state.attempt_t0:
                att.timings.attempt_s = round(time.monotonic() - state.attempt_t0[att.index], 3)
            if copy_log and att.remote_dir:
                log = state.redact.bytes(log_copy(state.host, f"{att.remote_dir}/server.log"))
                att.log_file = state.store.save_log(state.report.run_id, att.index, att.variant, log)


def last_known(state: RunState) -> str:
    """What the run last launched, for an error that leaves the box unproven."""
    last = next((a for a in reversed(state.report.attempts) if a.pgid is not None), None)
    if last is None:
        return "nothing was launched"
    return f"the last server launched was {last.variant}, pgid {last.pgid}, which may still run"
