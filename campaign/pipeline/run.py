"""The run: for each variant stop → launch → ready → smoke → bench → record; on failure diagnose → restore.

``Campaign.run()`` holds the host's lock for the whole run and returns the ``RunReport``; it never prints. Progress
goes out as ``Event`` values to the callback the CLI gives (the console draws them). Every attempt is written to the
store when it ends, so a crash of the CLI loses at most the attempt in flight.

Policies, in order of importance:
- The host's lock is taken before anything is written (a refused run leaves nothing in the store); runs the lock
  shows dead are reconciled as ``interrupted`` first.
- The plan is made once, after the flag check (``plan.Plan.checked``), and handed to every step below.
- SIGINT, SIGTERM and SIGHUP (``interruption``): the first stops the variant under test and puts the known-good
  back; a second leaves at once, naming what still runs. Either way the run is recorded ``interrupted``
  (``interrupted``).
- Before a launch, whoever holds the variant's port is looked up: a process campaign did not start is never
  signalled; the variant fails ``port_in_use`` naming it, and the run goes on to restore (``attempt``).
- A variant that passes readiness + smoke (+ bench gates) becomes the known-good of (host, experiment); isolation
  attempts never do (they are experiments about a failure), nor does a run without smoke (``restore.prove``).
- A run that ends with the box not proven (a host lost for good included) ends with ``BoxUnproven`` (exit 3).
- After any failed attempt the box goes back to the known-good, which is proven again (readiness + smoke); a
  restore that fails ends the run (exit 3): continuing on a box in an unknown state would measure nothing.
- With ``isolate``, a failed variant triggers the extra attempts ``attribution.plan_isolation`` asks for before
  the restore (``isolation``), and ``attribution.attribute`` explains the failures over all attempts at the end.
- Long campaigns: the deadline (``deadline``), retries of transient failures (``retries``), known failures
  skipped (``known``), ``--resume`` (``resumption``), relaunch rounds (``rounds``).
"""

from __future__ import annotations

from typing import Any

import yaml

from campaign.config import Loaded
from campaign.errors import BoxUnproven, CampaignError, DirtyHost, HostLost, RestoreFailed, StoreError
from campaign.hosts.base import Host
from campaign.hosts.environment import probe_environment
from campaign.interruption import Interrupted, LeaveNow, checkpoint
from campaign.lock import HostLock, host_state_dir
from campaign.pipeline import resumption
from campaign.pipeline.deadline import past_deadline
from campaign.pipeline.events import Event, EventSink
from campaign.pipeline.interrupted import close_in_flight, last_known, left_now, on_interrupt
from campaign.pipeline.isolation import explain, isolate
from campaign.pipeline.known import known_failure
from campaign.pipeline.plan import Plan
from campaign.pipeline.restore import after_failure, leave, prove, put_back_unrecorded, restore_known_good
from campaign.pipeline.retries import attempt_with_retries
from campaign.pipeline.rounds import relaunch_rounds
from campaign.pipeline.state import RunState, Share
from campaign.readiness import clock_offset
from campaign.records import Attempt, Final, RunReport
from campaign.redaction import mask_tree
from campaign.resume import done_variants
from campaign.store import Store, now_iso


class Campaign:
    """One run of an experiment on a host."""

    def __init__(
        self,
        loaded: Loaded,
        host: Host,
        store: Store,
        *,
        only: tuple[str, ...] = (),
        isolate: bool | None = None,
        on_event: EventSink | None = None,
        resume: RunReport | None = None,
        retry_known: bool = False,
        share: Share | None = None,
    ) -> None:
        self.state = RunState(
            loaded,
            host,
            store,
            only=only,
            isolate=isolate,
            on_event=on_event,
            resume=resume,
            retry_known=retry_known,
            share=share,
        )

    @property
    def host(self) -> Host:
        """The host this run drives."""
        return self.state.host

    @property
    def report(self) -> RunReport:
        """The run's report as it stands."""
        return self.state.report

    def interrupt(self, signum: int) -> None:
        """A signal caught by the main thread, for this run in its own thread (a fleet's host loop)."""
        self.state.intr.deliver(signum)

    def run(self, *, restore_only: bool = False, force: bool = False) -> RunReport:
        """Run every planned variant (or, with ``restore_only``, only prove the known-good); returns the report.

        ``force`` breaks a lock held by another CLI (recorded in the report). Raises ``LockHeld`` (nothing
        written), or ``BoxUnproven`` when an error left the box in a state nobody proved.
        """
        state = self.state
        exp, host, store, report = state.exp, state.host, state.store, state.report
        if restore_only and state.known_good() is None:
            # Nothing to restore: say so before taking the lock or recording a run.
            raise RestoreFailed(
                f"no known-good configuration of {exp.name} is recorded for {host.name}",
                hint="run an experiment whose baseline passes first; it becomes the known-good",
            )
        store.check()
        command = "restore" if restore_only else "run"
        lock = HostLock(host, report.run_id, exp.name, command, exp.host.state_dir or host_state_dir())
        error: BaseException | None = None
        lock_left = False
        with state.intr as intr:
            lock.acquire(force=force)
            try:
                intr.checkpoint()  # a signal while the lock was taken: nothing was done yet, nothing to record
            except Interrupted:
                lock.release()
                raise
            try:
                if lock.replaced is not None:
                    report.lock_taken_over = {**lock.replaced, "how": lock.replaced_how}
                resolved = yaml.safe_dump(mask_tree(state.loaded.resolved), sort_keys=False)
                store.save_text(report.run_id, "experiment.yaml", resolved)
                found = resumption.reopen(state) if state.resumed else None
                state.save()
                store.reconcile(host.name, state.control.found_running(), keep=report.run_id)
                state.offset = clock_offset(host)
                recipe = state.loaded.recipe
                report.environment = probe_environment(
                    host,
                    recipe=recipe.name,
                    probes=recipe.probes,
                    values={**recipe.vars, **state.vars()},
                    clock_offset_s=state.offset,
                )
                state.save()
                if not restore_only:
                    self._make_plan()
                if found is not None:
                    resumption.record(state, found)
                state.emit(Event("run_start", text=f"run {report.run_id} on {host.name}"))
                if restore_only:
                    restore_known_good(state)
                else:
                    self._run_variants()
                    if report.status == "running" and report.ended_early is None:
                        relaunch_rounds(state)
                    if report.status == "running":
                        leave(state)
            except LeaveNow as e:
                intr.caught(e)
                left_now(state, e)
            except Interrupted as e:
                intr.caught(e)
                try:
                    on_interrupt(state, e)
                except LeaveNow as e2:
                    intr.caught(e2)
                    left_now(state, e2)
            except DirtyHost as e:
                report.status = "restore_failed"
                report.final = Final(healthy=False, detail=str(e))
                close_in_flight(state, f"cut short: {e}")
                error = e
            except CampaignError as e:
                report.status = "aborted"
                report.final = Final(healthy=False, detail=str(e))
                close_in_flight(state, f"cut short: {e}")
                error = e
                if isinstance(e, StoreError) and state.touched:
                    put_back_unrecorded(state, e)
            finally:
                intr.quiet()
                report.ended_at = now_iso()
                if report.status == "running":
                    report.status = "failed" if _any_failed(report) else "passed"
                explain(state)
                for finding in report.attribution:
                    state.note(f"attribution: {finding.statement}")
                try:
                    state.save()
                except StoreError as e:
                    # The record cannot be written (a full disk, a locked index): the lock is given back all the
                    # same, and the run ends saying so (exit 3 once a server was launched: nobody proved the box).
                    state.note(f"the run's record could not be written: {e}")
                    error = error or e
                # The lock is given back whenever the host can still be reached, after any other error too (a
                # command that failed, a file that could not be read, one call that timed out). A host lost for
                # good gets no more calls: each would wait out another reconnect budget. Its lock is stale once
                # this CLI is gone, and the next command from this machine takes it over.
                lock_left = _lost(error) or not self._release(lock)
                state.emit(Event("run_end", text=report.status))
        if error is not None:
            if state.touched and isinstance(error, CampaignError) and error.exit_code < 3:
                raise BoxUnproven(
                    f"{error.message}; the box is left unproven ({last_known(state)})",
                    hint=f"when the host answers again, `campaign restore {report.config_path}` puts the known-good "
                    "back (it takes over the lock this run left)"
                    if lock_left
                    else f"`campaign restore {report.config_path}` puts the known-good back, or "
                    f"`campaign stop {report.config_path}` stops what runs",
                ) from error
            raise error
        return report

    def _make_plan(self) -> None:
        """The plan, made once: every planned flag checked against the server's own --help before any stop."""
        state = self.state
        plan = Plan.checked(state.loaded, state.host, state.store.root, state.only)
        state.set_plan(plan)
        for note in plan.notes:
            state.note(note)

    def _release(self, lock: HostLock) -> bool:
        """Give the host's lock back; False (and a note) when the host would not let us: the lock is left behind."""
        try:
            lock.release()
        except CampaignError as e:
            self.state.note(
                f"the lock on {self.state.host.name} could not be released ({e}); once this CLI is gone, the next "
                "command from this machine takes it over"
            )
            return False
        return True

    def _run_variants(self) -> None:
        state = self.state
        planned, report = state.planned, state.report
        tried: list[dict[str, Any]] = []
        done = done_variants(report, planned) if state.resumed else {}
        for i, pv in enumerate(planned):
            checkpoint()
            if pv.name in done:
                resumption.take_done(state, pv, done[pv.name])
                tried.append(dict(pv.knobs))
                continue
            if state.share is not None and not state.share.claim(state.host.name, pv):
                continue  # another host of the fleet runs it
            if past_deadline(state, pv, [p.name for p in planned[i:] if p.name not in done]):
                return
            if known_failure(state, pv):
                continue
            att = attempt_with_retries(state, pv)
            tried.append(dict(pv.knobs))
            if att.outcome == "passed":
                prove(state, pv, att)
                continue
            if state.isolate:
                isolate(state, pv, tried)
            restore = after_failure(state, att)
            if restore.outcome == "failed":
                report.status = "restore_failed"
                report.final = Final(healthy=False, detail=restore.detail)
                return


def _any_failed(report: RunReport) -> bool:
    """Whether some variant's last attempt failed (a transient failure that passed on a retry does not count)."""
    last: dict[str, Attempt] = {}
    for a in report.attempts:
        if a.role != "restore" and a.outcome in ("passed", "failed"):
            last[f"{a.role}:{a.variant}"] = a
    return any(a.outcome == "failed" for a in last.values())


def _lost(error: BaseException | None) -> bool:
    """Whether ``error`` is, or was caused by, a host lost for good (``HostLost``: its reconnect budget ran out)."""
    seen: set[int] = set()
    while error is not None and id(error) not in seen:
        if isinstance(error, HostLost):
            return True
        seen.add(id(error))
        error = error.__cause__ or error.__context__
    return False


def restore_now(
    loaded: Loaded, host: Host, store: Store, *, on_event: EventSink | None = None, force: bool = False
) -> RunReport:
    """`campaign restore`: relaunch the experiment's known-good and prove it, recorded as a run of its own."""
    return Campaign(loaded, host, store, on_event=on_event).run(restore_only=True, force=force)
