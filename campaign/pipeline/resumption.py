"""The resume policy: a stored run continued (``--resume``) keeps its finished attempts and runs what is left.

``reopen`` checks the box against the record and reopens the run (an attempt its dead CLI left in flight becomes
``interrupted``); ``record`` notes the resume in the report once the plan is made (what is left is counted against
the checked plan); ``take_done`` lets a variant finished before the resume stand. Which variants are done is
``campaign.resume``'s rule.
"""

from __future__ import annotations

from campaign.config import PlannedVariant
from campaign.pipeline.events import Event
from campaign.pipeline.state import RunState
from campaign.records import Attempt, Final, Resume
from campaign.resume import remaining
from campaign.store import now_iso


def reopen(state: RunState) -> str:
    """Check the box against the record (what runs now) and reopen the run; returns what was found running."""
    report = state.report
    found = state.control.found_running()
    cur = state.control.current()
    if cur is not None and cur.run_id == report.run_id:
        found += f" (launched by attempt {cur.attempt} of this run)"
    for att in report.attempts:
        if att.outcome == "skipped" and att.ended_at is None and att.known_failure is None:
            att.outcome = "interrupted"
            att.ended_at = now_iso()
            att.note = att.note or "its CLI died during this attempt"
    from_status = report.status
    report.status = "running"
    report.ended_at = None
    report.signal = None
    report.final = Final()
    report.ended_early = None
    report.not_run = []
    report.resumes.append(Resume(at=now_iso(), from_status=from_status, found=found, remaining=[]))
    return found


def record(state: RunState, found: str) -> None:
    """The variants left to run, counted against the checked plan, noted on the resume and shown."""
    report = state.report
    left = remaining(report, state.planned)
    report.resumes[-1].remaining = left
    state.note(f"resuming {report.run_id}: {len(left)} variant(s) left; found {found}")


def take_done(state: RunState, pv: PlannedVariant, att: Attempt) -> None:
    """A variant a resumed run already finished: its outcome stands (the baseline's bench: the gates' ruler)."""
    state.emit(Event("note", att.index, pv.name, att.role, text=f"{pv.name}: {att.outcome} before the resume"))
    if pv.name == state.exp.baseline.name and att.bench is not None:
        state.baseline_bench = att.bench
