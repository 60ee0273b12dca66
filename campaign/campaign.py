# Over 500 lines: one pipeline over one run (attempt, isolate, restore, leave) whose steps share the run's state.
"""The pipeline: for each variant stop → launch → ready → smoke → bench → record; on failure diagnose → restore.

``Campaign.run()`` holds the host's lock for the whole run and returns the ``RunReport``; it never prints. Progress
goes out as ``Event`` values to the callback the CLI gives (the console draws them). Every attempt is written to the
store when it ends, so a crash of the CLI loses at most the attempt in flight.

Policies, in order of importance:
- The host's lock is taken before anything is written (a refused run leaves nothing in the store); runs the lock
  shows dead are reconciled as ``interrupted`` first.
- SIGINT, SIGTERM and SIGHUP (``interruption``): the first stops the variant under test and puts the known-good
  back; a second leaves at once, naming what still runs. Either way the run is recorded ``interrupted``.
- Before a launch, whoever holds the variant's port is looked up: a process campaign did not start is never
  signalled; the variant fails ``port_in_use`` naming it, and the run goes on to restore.
- A variant that passes readiness + smoke (+ bench gates) becomes the known-good of (host, experiment); isolation
  attempts never do (they are experiments about a failure, not candidates), nor does a run without smoke.
- A run that ends with the box not proven (a host lost for good included) ends with ``BoxUnproven`` (exit 3).
- After any failed attempt the box goes back to the known-good, which is proven again (readiness + smoke); a
  restore that fails ends the run (exit 3): continuing on a box in an unknown state would measure nothing.
- With ``isolate``, a failed variant triggers the extra attempts ``attribution.plan_isolation`` asks for before
  the restore, and ``attribution.attribute`` explains the failures over all attempts at the end.
"""

from __future__ import annotations

import shlex
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from campaign import __version__
from campaign.attribution import attribute, plan_isolation
from campaign.bench import run_bench
from campaign.config import Loaded, PlannedVariant, VariantConfig, plan, render, template_vars
from campaign.diagnose import diagnose
from campaign.effective import verify
from campaign.errors import BenchError, BoxUnproven, CampaignError, DirtyHost, HostLost, RestoreFailed
from campaign.estimate import attempt_cost, variant_cost
from campaign.fingerprint import fingerprint
from campaign.flags import checked_plan
from campaign.gates import check_gates
from campaign.golden import Reference
from campaign.hosts.base import Host
from campaign.interruption import Interrupted, Interruption, LeaveNow, checkpoint
from campaign.lock import HostLock, host_state_dir
from campaign.profile import ProfileTarget, profile_level
from campaign.readiness import clock_offset, health_status, wait_ready
from campaign.records import (
    Attempt,
    BenchEvent,
    BenchResult,
    BenchSettings,
    Diagnosis,
    Environment,
    Final,
    Finding,
    ProfileResult,
    ProfileSettings,
    Restore,
    Resume,
    Role,
    RunReport,
    Timings,
    show_value,
)
from campaign.redaction import Redactor, mask_spec, mask_tree
from campaign.resume import done_variants, finished, remaining
from campaign.retry import RetryBudget, failure_class, needs_proven_box
from campaign.server import Running, ServerControl
from campaign.smoke import burst_max, run_smoke
from campaign.store import KnownGood, Store, now_iso

EventKind = Literal[
    "run_start",
    "attempt_start",
    "stopped",
    "launched",
    "phase",
    "line",
    "ready",
    "smoke",
    "bench",
    "bench_progress",
    "attempt_end",
    "restore_start",
    "restore_end",
    "isolation",
    "note",
    "run_end",
]


@dataclass(frozen=True)
class Event:
    """One thing that happened during a run, for the live display. ``text`` is already free of secrets."""

    kind: EventKind
    attempt: int | None = None
    variant: str | None = None
    role: Role | None = None
    text: str = ""
    record: Attempt | None = None
    payload: Any = None
    #: The host it happened on, in a fleet (``campaign.fleet`` fills it in); None on one host.
    host: str | None = None


EventSink = Callable[[Event], None]


class Share(Protocol):
    """What one host's loop shares with the other hosts of a fleet (``campaign.fleet``)."""

    #: The fleet's run id: every host's part is recorded under it.
    run_id: str

    def claim(self, host: str, pv: PlannedVariant) -> bool:
        """Whether this host runs ``pv`` (True once, for one host; the baseline on every host)."""
        ...

    def next_index(self) -> int:
        """The next attempt index of the run, unique over all hosts."""
        ...


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
        self.loaded = loaded
        self.exp = loaded.experiment
        self.host = host
        self.store = store
        self.planned = plan(self.exp, loaded.recipe, only)
        self.only = only
        #: The server's version as its --help was read for (None until then, or when the recipe declares no help).
        self.server_version: str | None = None
        self.isolate = self.exp.isolate if isolate is None else isolate
        self.emit: EventSink = on_event or (lambda _e: None)
        self.control = ServerControl(host, self.exp.host.workdir, state_dir=self.exp.host.state_dir)
        #: In a fleet: the other hosts' share of the run (claims on variants, attempt indexes); None on one host.
        self.share = share
        known = store.known_good(host.name, self.exp.name)
        self.redact = Redactor([p.spec for p in self.planned] + ([known.spec] if known else []))
        self.bench_settings = self.exp.bench_settings()
        self.baseline_bench: BenchResult | None = None
        self._offset = 0.0
        # The baseline's knobs as rendered (recipe defaults such as the port filled in), whether or not it runs.
        self.baseline_knobs = render(loaded.recipe, self.exp.baseline, self.exp.baseline, self._vars()).knobs
        self._intr = Interruption()
        #: True once a server was launched: from then an error leaves the box unproven, not merely untouched.
        self._touched = False
        #: The stored run this one continues (``--resume``): its attempts are kept, its report is this run's.
        self.resumed = resume is not None
        #: Run variants that a stored run saw fail deterministically with the same spec (``--retry-known``).
        self.retry_known = retry_known
        self._t0 = time.monotonic()
        #: When each attempt of this run began (monotonic), by index: an attempt cut short is timed to its end.
        self._attempt_t0: dict[int, float] = {}
        self._history: list[RunReport] | None = None
        self.report = (
            resume.model_copy(deep=True)
            if resume is not None
            else RunReport(
                run_id=share.run_id if share is not None else store.new_run_id(self.exp.name),
                experiment=self.exp.name,
                config_path=str(loaded.path),
                host=host.name,
                recipe=loaded.recipe.name,
                started_at=now_iso(),
            )
        )

    # -- the run ------------------------------------------------------------------------------------

    def run(self, *, restore_only: bool = False, force: bool = False) -> RunReport:
        """Run every planned variant (or, with ``restore_only``, only prove the known-good); returns the report.

        ``force`` breaks a lock held by another CLI (recorded in the report). Raises ``LockHeld`` (nothing
        written), or ``BoxUnproven`` when an error left the box in a state nobody proved.
        """
        import yaml

        if restore_only and self.store.known_good(self.host.name, self.exp.name) is None:
            # Nothing to restore: say so before taking the lock or recording a run.
            raise RestoreFailed(
                f"no known-good configuration of {self.exp.name} is recorded for {self.host.name}",
                hint="run an experiment whose baseline passes first; it becomes the known-good",
            )
        report = self.report
        self.store.check()
        command = "restore" if restore_only else "run"
        lock = HostLock(self.host, report.run_id, self.exp.name, command, self.exp.host.state_dir or host_state_dir())
        error: BaseException | None = None
        lock_left = False
        with self._intr as intr:
            try:
                with intr.shielded():
                    lock.acquire(force=force)
            except Interrupted:
                lock.release()  # nothing was done yet: there is nothing to clean up or record
                raise
            try:
                if lock.replaced is not None:
                    report.lock_taken_over = {**lock.replaced, "how": lock.replaced_how}
                self.store.save_text(
                    report.run_id, "experiment.yaml", yaml.safe_dump(mask_tree(self.loaded.resolved), sort_keys=False)
                )
                if self.resumed:
                    self._record_resume()
                self.store.save_report(report)
                self.store.reconcile(self.host.name, self.control.found_running(), keep=report.run_id)
                self._offset = clock_offset(self.host)
                report.environment = self._environment()
                self.store.save_report(report)
                if not restore_only:
                    self._check_flags()
                self.emit(Event("run_start", text=f"run {report.run_id} on {self.host.name}"))
                if restore_only:
                    self._restore_only()
                else:
                    self._run_variants()
                    if report.status == "running" and report.ended_early is None:
                        self._relaunch_rounds()
                    if report.status == "running":
                        self._leave()
            except LeaveNow as e:
                intr.caught(e)
                self._left_now(e)
            except Interrupted as e:
                intr.caught(e)
                try:
                    self._on_interrupt(e)
                except LeaveNow as e2:
                    intr.caught(e2)
                    self._left_now(e2)
            except DirtyHost as e:
                report.status = "restore_failed"
                report.final = Final(healthy=False, detail=str(e))
                self._close_in_flight(f"cut short: {e}")
                error = e
            except CampaignError as e:
                report.status = "aborted"
                report.final = Final(healthy=False, detail=str(e))
                self._close_in_flight(f"cut short: {e}")
                error = e
            finally:
                intr.quiet()
                report.ended_at = now_iso()
                if report.status == "running":
                    report.status = "failed" if self._any_failed() else "passed"
                self._attribute()
                for finding in report.attribution:
                    self.emit(Event("note", text=f"attribution: {finding.statement}"))
                self.store.save_report(report)
                # The lock is given back whenever the host can still be reached, after any other error too (a
                # command that failed, a file that could not be read, one call that timed out). A host lost for
                # good gets no more calls: each would wait out another reconnect budget. Its lock is stale once
                # this CLI is gone, and the next command from this machine takes it over.
                lock_left = _lost(error) or not self._release(lock)
                self.emit(Event("run_end", text=report.status))
        if error is not None:
            if self._touched and isinstance(error, CampaignError) and error.exit_code < 3:
                raise BoxUnproven(
                    f"{error.message}; the box is left unproven ({self._last_known()})",
                    hint=f"when the host answers again, `campaign restore {report.config_path}` puts the known-good "
                    "back (it takes over the lock this run left)"
                    if lock_left
                    else f"`campaign restore {report.config_path}` puts the known-good back, or "
                    f"`campaign stop {report.config_path}` stops what runs",
                ) from error
            raise error
        return report

    def _release(self, lock: HostLock) -> bool:
        """Give the host's lock back; False (and a note) when the host would not let us: the lock is left behind."""
        try:
            lock.release()
        except CampaignError as e:
            self.emit(
                Event(
                    "note",
                    text=f"the lock on {self.host.name} could not be released ({e}); once this CLI is gone, the next "
                    "command from this machine takes it over",
                )
            )
            return False
        return True

    # -- interruption ------------------------------------------------------------------------------------

    def _on_interrupt(self, e: Interrupted) -> None:
        """The first signal: stop the variant under test, put the known-good back (or stop), record it all."""
        report = self.report
        report.signal = e.name
        report.status = "interrupted"
        self._close_in_flight(f"interrupted by {e.name}", copy_log=True)
        self.emit(
            Event(
                "note",
                text=f"{e.name}: stopping the server under test and putting the box back; "
                "a second signal leaves at once",
            )
        )
        report.final = Final(healthy=False, detail=f"interrupted by {e.name} while cleaning up")
        self.store.save_report(report)
        known = self.store.known_good(self.host.name, self.exp.name)
        try:
            if self.exp.at_end == "stop" or known is None:
                stop = self.control.stop(None, grace_s=self.exp.timeouts.stop_grace_s)
                why = "at_end: stop" if known is not None else f"no known-good of {self.exp.name} yet"
                report.final = Final(
                    healthy=True,
                    detail=f"interrupted by {e.name}: {stop.detail}; nothing left running ({why})"
                    + (f"; {stop.foreign}" if stop.foreign else ""),
                )
                return
            restore = self._relaunch(known)
            report.restores.append(restore)
        except CampaignError as err:
            report.final = Final(healthy=False, detail=f"interrupted by {e.name}; the box is left unproven: {err}")
            return
        ok = restore.outcome == "restored"
        cur = self.control.current()
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

    def _left_now(self, e: Interrupted) -> None:
        """A second signal: record what still runs and the command that fixes it, and leave."""
        report = self.report
        report.signal = report.signal or e.name
        report.status = "interrupted"
        self._close_in_flight(f"interrupted by {e.name}")
        config = report.config_path or self.exp.name
        try:
            still = self.control.found_running()
        except CampaignError as err:
            still = f"unknown (the host did not answer: {err})"
        report.final = Final(
            healthy=False,
            detail=f"left at once on a second signal ({e.name}); still running: {still}; "
            f"to fix: `campaign stop {config}` (or `campaign restore {config}` to put the known-good back)",
        )

    def _close_in_flight(self, note: str, *, copy_log: bool = False) -> None:
        for att in self.report.attempts:
            if att.outcome == "skipped" and att.ended_at is None:
                att.outcome = "interrupted"
                att.ended_at = now_iso()
                att.note = note
                # What was measured stands (ready, the phases that ended); the attempt's time runs to here.
                if att.index in self._attempt_t0:
                    att.timings.attempt_s = round(time.monotonic() - self._attempt_t0[att.index], 3)
                if copy_log and att.remote_dir:
                    log = self.redact.bytes(self.host.read_file(f"{att.remote_dir}/server.log"))
                    att.log_file = self.store.save_log(self.report.run_id, att.index, att.variant, log)

    def _last_known(self) -> str:
        last = next((a for a in reversed(self.report.attempts) if a.pgid is not None), None)
        if last is None:
            return "nothing was launched"
        return f"the last server launched was {last.variant}, pgid {last.pgid}, which may still run"

    def _run_variants(self) -> None:
        tried: list[dict[str, Any]] = []
        done = done_variants(self.report, self.planned) if self.resumed else {}
        for i, pv in enumerate(self.planned):
            checkpoint()
            if pv.name in done:
                self._take_done(pv, done[pv.name])
                tried.append(dict(pv.knobs))
                continue
            if self.share is not None and not self.share.claim(self.host.name, pv):
                continue  # another host of the fleet runs it
            if self._past_deadline(pv, [p.name for p in self.planned[i:] if p.name not in done]):
                return
            if self._known_failure(pv):
                continue
            att = self._attempt_with_retries(pv)
            tried.append(dict(pv.knobs))
            if att.outcome == "passed":
                self._prove(pv, att)
                continue
            if self.isolate:
                self._isolate(pv, tried)
            restore = self._restore(att) if self._restore_now(att) else self._hygiene(att)
            if restore.outcome == "failed":
                self.report.status = "restore_failed"
                self.report.final = Final(healthy=False, detail=restore.detail)
                return

    def _relaunch_rounds(self) -> None:
        """With ``bench.launches`` > 1, launch every passed variant again, round by round, each launch one sample.

        Rounds interleave the variants (a, b, a, b, ...) instead of launching each variant's copies back to back:
        a box drifts over minutes (load, clocks, caches), and back-to-back launches would put that drift into the
        difference between variants. A relaunch that fails is diagnosed and restored from like a failed variant,
        and its variant gets no further launches. A resumed run launches only the copies still missing.
        """
        settings = self.bench_settings
        if settings is None or settings.launches < 2:
            return
        live = [pv for pv in self.planned if self._passed_launches(pv) is not None]
        for launch in range(1, settings.launches):
            for pv in list(live):
                have = self._passed_launches(pv)
                if have is None:
                    live.remove(pv)
                    continue
                if have > launch:
                    continue
                if self._past_launch_deadline(pv, launch):
                    return
                again = self._attempt(pv, "relaunch", launch=launch)
                if again.outcome == "passed":
                    continue
                live.remove(pv)
                restore = self._restore(again) if self._restore_now(again) else self._hygiene(again)
                if restore.outcome == "failed":
                    self.report.status = "restore_failed"
                    self.report.final = Final(healthy=False, detail=restore.detail)
                    return

    def _passed_launches(self, pv: PlannedVariant) -> int | None:
        """How many launches of ``pv`` this run holds, all passed; None when it has none or one of them failed."""
        spec = pv.spec.spec_hash()
        mine = [
            a
            for a in self.report.attempts
            if a.variant == pv.name and a.role in ("variant", "relaunch") and a.spec_hash == spec and finished(a)
        ]
        last_variant = next((a for a in reversed(mine) if a.role == "variant"), None)
        if last_variant is None or last_variant.outcome != "passed":
            return None
        relaunches = [a for a in mine if a.role == "relaunch"]
        if any(a.outcome != "passed" for a in relaunches):
            return None
        return 1 + len(relaunches)

    def _past_launch_deadline(self, pv: PlannedVariant, launch: int) -> bool:
        """True (the run ends here, cleanly) when one more launch of ``pv`` would not finish before the deadline."""
        costs = [c for a in self.report.attempts if a.variant == pv.name and (c := attempt_cost(a)) is not None]
        cost = sum(costs) / len(costs) if costs else 0.0
        return self._ends_at_deadline(cost, f"launch {launch} of {pv.name}", f"relaunch rounds from {launch} not run")

    def _ends_at_deadline(self, cost: float, what: str, dropped: str) -> bool:
        """True, with the reason noted in the report, when ``what`` (``cost`` seconds) would end past the deadline."""
        deadline = self.exp.deadline
        elapsed = time.monotonic() - self._t0
        if deadline is None or elapsed + cost <= deadline:
            return False
        self.report.ended_early = (
            f"deadline {deadline:g} s: {what} would take about {cost:.0f} s with "
            f"{max(0.0, deadline - elapsed):.0f} s left; {dropped}"
        )
        self.emit(Event("note", text=self.report.ended_early))
        return True

    # -- long campaigns: resume, retries, known failures, the deadline ---------------------------------------------

    def _record_resume(self) -> None:
        """Check the box against the record (what runs now), reopen the run, and note the resume in its report."""
        report = self.report
        found = self.control.found_running()
        cur = self.control.current()
        if cur is not None and cur.run_id == report.run_id:
            found += f" (launched by attempt {cur.attempt} of this run)"
        for att in report.attempts:
            if att.outcome == "skipped" and att.ended_at is None and att.known_failure is None:
                att.outcome = "interrupted"
                att.ended_at = now_iso()
                att.note = att.note or "its CLI died during this attempt"
        left = remaining(report, self.planned)
        report.resumes.append(Resume(at=now_iso(), from_status=report.status, found=found, remaining=left))
        report.status = "running"
        report.ended_at = None
        report.signal = None
        report.final = Final()
        report.ended_early = None
        report.not_run = []
        self.emit(Event("note", text=f"resuming {report.run_id}: {len(left)} variant(s) left; found {found}"))

    def _take_done(self, pv: PlannedVariant, att: Attempt) -> None:
        """A variant a resumed run already finished: its outcome stands (the baseline's bench: the gates' ruler)."""
        self.emit(Event("note", att.index, pv.name, att.role, text=f"{pv.name}: {att.outcome} before the resume"))
        if pv.name == self.exp.baseline.name and att.bench is not None:
            self.baseline_bench = att.bench

    def _any_failed(self) -> bool:
        """Whether some variant's last attempt failed (a transient failure that passed on a retry does not count)."""
        last: dict[str, Attempt] = {}
        for a in self.report.attempts:
            if a.role != "restore" and a.outcome in ("passed", "failed"):
                last[f"{a.role}:{a.variant}"] = a
        return any(a.outcome == "failed" for a in last.values())

    def _attempt_with_retries(self, pv: PlannedVariant) -> Attempt:
        """Attempt ``pv``; a transient failure is attempted again within the budget, waiting longer each time."""
        att = self._attempt(pv, "variant")
        budget = RetryBudget(self.exp.retry)
        while att.outcome == "failed" and budget.left:
            kind = att.diagnosis.kind if att.diagnosis else None
            if failure_class(kind, att.failed_phase) != "transient":
                break
            delay = budget.delay_s()
            if self._retry_past_deadline(pv, delay):
                break
            self.emit(
                Event(
                    "note",
                    att.index,
                    pv.name,
                    att.role,
                    text=f"{pv.name}: {kind} is transient; retry {budget.used + 1} of {budget.config.budget} "
                    f"in {delay:g} s",
                )
            )
            time.sleep(delay)
            budget = budget.spend()
            first = att.index
            att = self._attempt(pv, "variant")
            att.retry_of = first
            self.store.save_report(self.report)
        return att

    def _retry_past_deadline(self, pv: PlannedVariant, delay: float) -> bool:
        """Whether a retry of ``pv`` after ``delay`` would end past the deadline (then it is not taken)."""
        deadline = self.exp.deadline
        if deadline is None:
            return False
        cost = next((c for a in reversed(self.report.attempts) if (c := attempt_cost(a)) is not None), 0.0)
        if time.monotonic() - self._t0 + delay + cost <= deadline:
            return False
        self.emit(Event("note", variant=pv.name, text=f"{pv.name}: no retry, it would end past the deadline"))
        return True

    def _known_failure(self, pv: PlannedVariant) -> bool:
        """Skip ``pv`` when a stored run saw its exact spec fail deterministically on this host (unless retry_known)."""
        if self.retry_known:
            return False
        spec_hash = pv.spec.spec_hash()
        stored = next(
            (
                f
                for f in self.store.stored_failures(self.host.name, spec_hash, exclude_run=self.report.run_id)
                if failure_class(f.kind, f.failed_phase) == "deterministic"
            ),
            None,
        )
        if stored is None:
            return False
        note = (
            f"known failure: this spec failed with {stored.kind or 'unknown'} in {stored.failed_phase} in run "
            f"{stored.ref} (fingerprint {stored.fingerprint}); skipped, --retry-known runs it again"
        )
        att = Attempt(
            index=self._next_index(),
            variant=pv.name,
            role="variant",
            host=self.host.name,
            knobs=dict(pv.knobs),
            spec=mask_spec(pv.spec),
            spec_hash=spec_hash,
            started_at=now_iso(),
            ended_at=now_iso(),
            note=note,
            known_failure=stored.ref,
        )
        self.report.attempts.append(att)
        self.store.save_report(self.report)
        self.emit(Event("attempt_start", att.index, pv.name, att.role, text="variant"))
        self.emit(Event("attempt_end", att.index, pv.name, att.role, text="skipped", record=att))
        self.emit(Event("note", att.index, pv.name, att.role, text=f"{pv.name}: {note}"))
        return True

    def _past_deadline(self, pv: PlannedVariant, left: list[str]) -> bool:
        """True (the run ends here, cleanly) when ``pv`` would not finish before the experiment's ``deadline``."""
        if self.exp.deadline is None:
            return False
        if self._history is None:
            self._history = self.store.reports_of(self.loaded.recipe.name, self.host.name)
        cost = variant_cost(self._history, pv, self.exp.name)
        if cost is None:
            # Nothing stored: this run's own attempts so far are the best guess.
            costs = [c for a in self.report.attempts if a.role == "variant" and (c := attempt_cost(a)) is not None]
            cost = sum(costs) / len(costs) if costs else 0.0
        dropped = f"{len(left)} variant(s) not run (`campaign run --resume {self.report.run_id}` runs them)"
        if not self._ends_at_deadline(cost, pv.name, dropped):
            return False
        self.report.not_run = left
        return True

    def _restore_now(self, failed: Attempt) -> bool:
        """Whether the experiment's ``restore`` policy puts the known-good back after ``failed`` (else: hygiene)."""
        policy = self.exp.restore
        if policy == "after_failure":
            return True
        if policy == "when_needed":
            return needs_proven_box(failed.diagnosis.kind if failed.diagnosis else None)
        return False

    def _hygiene(self, failed: Attempt) -> Restore:
        """No restore between variants: the box is only checked clean (nothing of ours runs) before the next one."""
        stop = self.control.stop(None, grace_s=self.exp.timeouts.stop_grace_s)
        kind = failed.diagnosis.kind if failed.diagnosis else "unknown"
        restore = Restore(
            outcome="not_needed",
            detail=f"restore: {self.exp.restore} ({kind} leaves the box usable); the box checked clean: {stop.detail}"
            + (f"; {stop.foreign}" if stop.foreign else ""),
        )
        failed.restore = restore
        self.report.restores.append(restore.model_copy(update={"attempt": failed.index}))
        self.store.save_report(self.report)
        self.emit(Event("note", failed.index, failed.variant, failed.role, text=restore.detail or ""))
        return restore

    def _cold_start_ready_s(self, known: KnownGood) -> float | None:
        """Launch to ready of the attempt that first proved ``known`` (what a restore is measured against)."""
        if known.run_id == self.report.run_id:
            attempts = self.report.attempts
        else:
            try:
                attempts = self.store.load_report(known.run_id).attempts
            except CampaignError:
                return None
        match = [a for a in attempts if a.index == known.attempt]
        return match[0].timings.launch_to_ready_s if match else None

    def _prove(self, pv: PlannedVariant, att: Attempt) -> None:
        """A variant that passed smoke and its gates becomes the known-good (the baseline's bench: the gates' ruler)."""
        proven = att.smoke is not None and att.smoke.ok and all(g.passed for g in att.gates)
        if proven:
            self.store.set_known_good(self.host.name, self.exp.name, pv.name, pv.spec, self.report.run_id, att.index)
        if pv.name == self.exp.baseline.name and att.bench is not None:
            self.baseline_bench = att.bench

    def _isolate(self, pv: PlannedVariant, tried: list[dict[str, Any]]) -> None:
        """Run the one-knob-back-to-baseline attempts that localise the failure of ``pv``."""
        baseline = self.baseline_knobs
        extra = plan_isolation(pv.knobs, baseline, tried)
        if not extra:
            return
        self.emit(Event("isolation", variant=pv.name, text=f"{len(extra)} isolation attempt(s) for {pv.name}"))
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
            ipv = render(self.loaded.recipe, variant, self.exp.baseline, self._vars(), self.server_version)
            tried.append(dict(knobs))
            self._attempt(ipv, "isolation")

    def _restore(self, failed: Attempt) -> Restore:
        """Relaunch the host's known-good and prove it; record the outcome on ``failed`` and in the report."""
        known = self.store.known_good(self.host.name, self.exp.name)
        if known is None:
            try:
                self.control.stop(None, grace_s=self.exp.timeouts.stop_grace_s)
            except DirtyHost as e:
                detail = str(e)
            else:
                detail = (
                    f"no known-good configuration of {self.exp.name} exists for this host yet; "
                    "the failed server was stopped"
                )
            restore = Restore(outcome="failed", detail=detail)
        else:
            self.emit(Event("restore_start", variant=known.variant, text=f"restoring {known.variant}"))
            restore = self._relaunch(known)
        failed.restore = restore
        self.report.restores.append(restore.model_copy(update={"attempt": failed.index}))
        self.store.save_report(self.report)
        self.emit(Event("restore_end", variant=restore.variant, text=f"restore {restore.outcome}: {restore.detail}"))
        return restore

    def _leave(self) -> None:
        """Apply ``at_end``: keep the known-good running (default), stop everything, or leave the last server."""
        policy = self.exp.at_end
        known = self.store.known_good(self.host.name, self.exp.name)
        current = self.control.current()
        if policy == "stop":
            stop = self.control.stop(None, grace_s=self.exp.timeouts.stop_grace_s)
            detail = f"stopped (at_end: stop): {stop.detail}, no process of it left"
            self.report.final = Final(detail=detail + (f"; {stop.foreign}" if stop.foreign else ""), healthy=True)
            return
        if policy == "known_good" and known is not None:
            alive = current is not None and self.control.alive(current)
            if current is None or current.spec_hash != known.spec_hash or not alive:
                self.emit(Event("note", text=f"at_end: bringing back the known-good {known.variant}"))
                self._relaunch(known)
        current = self.control.current()
        if current is None:
            self.report.final = Final(healthy=False, detail="nothing is running")
            return
        healthy = self.control.alive(current) and (
            health_status(self.host.url(current.port), self.loaded.recipe.health_path) == 200
        )
        self.report.final = Final(variant=current.variant, spec_hash=current.spec_hash, healthy=healthy)

    def _relaunch(self, known: KnownGood) -> Restore:
        """Launch the known-good's exact spec and prove it (readiness + smoke, no bench)."""
        pv = PlannedVariant(name=known.variant, knobs={}, spec=known.spec)
        deadline = self.exp.timeouts.restore_ready_s or self.exp.timeouts.ready_s
        att = self._attempt(pv, "restore", ready_deadline=deadline, bench=False)
        ok = att.outcome == "passed"
        return Restore(
            outcome="restored" if ok else "failed",
            variant=known.variant,
            spec_hash=known.spec_hash,
            attempt=att.index,
            ready_s=att.timings.launch_to_ready_s,
            cold_start_ready_s=self._cold_start_ready_s(known),
            detail=(
                f"{known.variant} relaunched and proven (ready, smoke {att.smoke.passed if att.smoke else 0} right)"
                if ok
                else f"the known-good {known.variant} did not come back: {att.note or att.failed_phase}"
            ),
        )

    def _restore_only(self) -> None:
        """`campaign restore`: the known-good relaunched and proven is the whole run."""
        known = self.store.known_good(self.host.name, self.exp.name)
        if known is None:
            raise RestoreFailed(f"the known-good record of {self.host.name} disappeared during the run")
        restore = self._relaunch(known)
        self.report.restores.append(restore)
        ok = restore.outcome == "restored"
        self.report.status = "passed" if ok else "restore_failed"
        self.report.final = Final(
            variant=known.variant, spec_hash=known.spec_hash, healthy=ok, detail=None if ok else restore.detail
        )

    # -- one attempt ------------------------------------------------------------------------------------

    def _attempt(
        self,
        pv: PlannedVariant,
        role: Role,
        *,
        ready_deadline: float | None = None,
        bench: bool = True,
        launch: int = 0,
    ) -> Attempt:
        """Stop what runs, launch ``pv``, wait for readiness, smoke, bench; diagnose a failure; store the attempt."""
        exp = self.exp
        index = self._next_index()
        att = Attempt(
            index=index,
            variant=pv.name,
            role=role,
            host=self.host.name,
            launch=launch,
            knobs=dict(pv.knobs),
            spec=mask_spec(pv.spec),
            spec_hash=pv.spec.spec_hash(),
            started_at=now_iso(),
        )
        self.report.attempts.append(att)
        self.emit(Event("attempt_start", index, pv.name, role, text=role))
        # The attempt's own record, filled in as each step ends: one cut short (a signal, an error) keeps what was
        # measured, and ``_close_in_flight`` dates its end.
        timings = att.timings
        t0 = self._attempt_t0[index] = time.monotonic()
        stop = self.control.stop(None, grace_s=exp.timeouts.stop_grace_s)
        timings.stop_s = round(time.monotonic() - t0, 3)
        checkpoint()
        if stop.stopped:
            self.emit(Event("stopped", index, pv.name, role, text=stop.detail))
        holders = self.control.port_holders(pv.spec.port)
        if holders.listening:
            timings.attempt_s = round(time.monotonic() - t0, 3)
            return self._port_taken(pv, att, timings, holders.describe())
        remote_dir = self.control.prepare(self.report.run_id, index, pv.name)
        att.remote_dir = remote_dir
        header = f"campaign: {exp.name} run {self.report.run_id} attempt {index} ({pv.name}), spec {att.spec_hash}"
        with self._intr.shielded():  # launched and recorded in current.json, or neither
            self._touched = True
            running = self.control.launch(
                pv.spec,
                remote_dir,
                run_id=self.report.run_id,
                attempt=index,
                variant=pv.name,
                header=header,
                experiment=exp.name,
            )
            att.pid, att.pgid = running.pid, running.pgid
        # Recorded at once: if this CLI dies now, the next command knows which attempt was in flight.
        self.store.save_report(self.report)
        self.emit(Event("launched", index, pv.name, role, text=f"pid {running.pid}, pgid {running.pgid}"))

        seen: list[tuple[int, str]] = []

        def on_line(n: int, text: str) -> None:
            seen.append((n, text))
            self.emit(Event("line", index, pv.name, role, text=self.redact(text)))

        def on_phase(name: str) -> None:
            self.emit(Event("phase", index, pv.name, role, text=name))

        ready = wait_ready(
            self.control,
            running,
            pv.spec,
            deadline_s=ready_deadline or exp.timeouts.ready_s,
            poll_s=exp.timeouts.poll_s,
            offset_s=self._offset,
            on_line=on_line,
            on_phase=on_phase,
        )
        att.phases = ready.phases
        att.exit_code = ready.exit_code
        timings.launch_to_ready_s = ready.launch_to_ready_s
        timings.ready_detect_lag_s = ready.ready_detect_lag_s
        timings.death_detect_lag_s = ready.death_detect_lag_s
        checkpoint()
        failed_phase: str | None = None
        if not ready.ready:
            failed_phase = ready.phase
            att.note = ready.detail
        else:
            self.emit(Event("ready", index, pv.name, role, text=f"ready in {ready.launch_to_ready_s:.2f} s"))
            failed_phase = self._verify_config(pv, att, seen) or self._check(
                pv, att, timings, running, bench and role != "restore"
            )
        att.timings = timings
        att.failed_phase = failed_phase
        att.outcome = "failed" if failed_phase else "passed"
        log = self.redact.bytes(self.host.read_file(running.log_path))
        att.log_file = self.store.save_log(self.report.run_id, index, pv.name, log)
        if failed_phase:
            exit_code = ready.exit_code
            if exit_code is None and not self.control.alive(running):
                # Gone after it was ready (in smoke or bench): its exit status says it died, not that it miscomputed.
                exit_code = self.control.exit_code(running.remote_dir)
                att.exit_code = exit_code
            # A config_not_applied diagnosis is already made, from the line that states the value in force.
            att.diagnosis = att.diagnosis or diagnose(
                log.decode(errors="replace"),
                exit_code=exit_code,
                phase=failed_phase,
                timings=timings,
                server=pv.spec.recipe,
                smoke=att.smoke,
                timed_out=ready.timed_out,
                knobs=att.knobs,
                bench=att.bench,
            )
            if att.note is None:
                att.note = att.diagnosis.summary
            # A failed server is stopped at once, whatever comes next: the box is never left on it.
            self.control.stop(running, grace_s=exp.timeouts.stop_grace_s)
        att.ended_at = now_iso()
        timings.attempt_s = round(time.monotonic() - t0, 3)
        self.store.save_report(self.report)
        self.emit(Event("attempt_end", index, pv.name, role, text=att.outcome, record=att))
        return att

    def _smoke_reference(self) -> Reference | None:
        """The host's known-good smoke outputs, which this attempt's are compared with (None before one is proven)."""
        known = self.store.known_good(self.host.name, self.exp.name)
        smoke = self.store.proven_smoke(known) if known is not None else None
        if known is None or smoke is None:
            return None
        return Reference(smoke, f"run {known.run_id} attempt {known.attempt} ({known.variant})")

    def _check_flags(self) -> None:
        """Every planned flag checked against the server's own --help (read once per version) before any stop."""
        check = checked_plan(self.loaded, self.host, self.store.root, self.only)
        if check.help is not None:
            self.server_version = check.help.version
            self.planned = check.planned
        for note in check.notes:
            self.emit(Event("note", text=note))

    def _verify_config(self, pv: PlannedVariant, att: Attempt, lines: list[tuple[int, str]]) -> str | None:
        """The knobs the log states checked against the asked ones; ``config`` (the failed phase) when one is not."""
        found = verify(self.loaded.recipe, pv.knobs, lines).diagnosis(pv.spec.recipe)
        if found is None:
            return None
        for e in found.evidence:
            e.text = self.redact(e.text)
        found.summary = self.redact(found.summary)
        att.diagnosis, att.note = found, found.summary
        self.emit(Event("note", att.index, pv.name, att.role, text=f"config not applied: {found.summary}"))
        return "config"

    def _port_taken(self, pv: PlannedVariant, att: Attempt, timings: Timings, holders: str) -> Attempt:
        """The variant's port is held by a process campaign did not start: fail it without touching that process."""
        summary = f"{holders}, a process campaign did not start; it was left alone and {pv.name} was not launched"
        att.timings = timings
        att.outcome = "failed"
        att.failed_phase = "launch"
        att.note = summary
        att.diagnosis = Diagnosis(
            kind="port_in_use",
            confidence=1.0,
            hint=f"stop that process yourself, or give {pv.name} another port (knobs: port)",
            summary=summary,
            fingerprint=fingerprint("port_in_use", [f"port {pv.spec.port} held by another process"]),
        )
        att.ended_at = now_iso()
        self.store.save_report(self.report)
        self.emit(Event("attempt_end", att.index, pv.name, att.role, text=att.outcome, record=att))
        return att

    def _check(self, pv: PlannedVariant, att: Attempt, timings: Timings, running: Running, bench: bool) -> str | None:
        """Smoke, then bench and gates; returns the failed phase or None."""
        exp = self.exp
        base_url = self.host.url(running.port)
        if exp.smoke.enabled:
            t = time.monotonic()
            smoke = run_smoke(
                base_url, exp.smoke, largest_batch=burst_max(exp.smoke, pv.knobs), reference=self._smoke_reference()
            )
            timings.smoke_s = round(time.monotonic() - t, 3)
            att.smoke = smoke
            self.emit(Event("smoke", att.index, pv.name, att.role, text=f"smoke: {smoke.summary()}"))
            if not smoke.ok:
                att.note = f"smoke: {smoke.summary()}"
                return "smoke"
        settings = self.bench_settings
        checkpoint()
        if bench and settings is not None:
            t = time.monotonic()

            def progress(ev: BenchEvent) -> None:
                self.emit(Event("bench_progress", att.index, pv.name, att.role, payload=ev))

            try:
                result = run_bench(base_url, settings, progress=progress)
            except BenchError as e:
                att.note = f"bench could not run: {e}"
                timings.bench_s = round(time.monotonic() - t, 3)
                return "bench"
            timings.bench_s = round(time.monotonic() - t, 3)
            att.bench = result
            self.emit(Event("bench", att.index, pv.name, att.role, payload=result))
            if not result.passed:
                att.note = (
                    f"bench: SLA search: no load met {settings.sla.describe()}"
                    if settings.sla is not None
                    else "bench: a level's error rate passed max_error_rate"
                )
                return "bench"
            if exp.profile is not None and att.role == "variant" and att.launch == 0:
                att.profile = self._profile(pv, att, running, settings, exp.profile)
            if settings.gates and att.role == "variant" and pv.name != exp.baseline.name:
                att.gates = check_gates(result, self.baseline_bench, settings.gates)
                failed = [g for g in att.gates if not g.passed]
                if failed:
                    att.note = "gate failed: " + "; ".join(g.detail for g in failed)
                    return "gates"
        return None

    def _profile(
        self, pv: PlannedVariant, att: Attempt, running: Running, bench: BenchSettings, settings: ProfileSettings
    ) -> ProfileResult:
        """One bench level again under the server's profiler; its traces copied into the run folder."""
        rel = f"profiles/{att.index:02d}-{pv.name}"
        target = ProfileTarget(
            self.host,
            self.host.url(running.port),
            running.remote_dir,
            self.exp.name,
            self.store.run_dir(self.report.run_id) / rel,
            rel,
        )
        found = profile_level(target, self.loaded.recipe.profile, self.loaded.recipe.name, settings, bench)
        self.emit(Event("note", att.index, pv.name, att.role, text=f"profile: {found.summary()}"))
        return found

    def _vars(self) -> dict[str, str]:
        return template_vars(self.exp)

    def _next_index(self) -> int:
        return self.share.next_index() if self.share is not None else len(self.report.attempts)

    def interrupt(self, signum: int) -> None:
        """A signal caught by the main thread, for this run in its own thread (a fleet's host loop)."""
        self._intr.deliver(signum)

    # -- report extras ------------------------------------------------------------------------------------

    def _attribute(self) -> None:
        if not (self.exp.matrix is not None or self.isolate):
            return
        if not any(a.outcome == "failed" for a in self.report.attempts if a.role != "restore"):
            return
        baseline = self.baseline_knobs
        try:
            findings = attribute(self.report.attempts, baseline)
        except Exception as e:  # attribution is an explanation; a bug there must not lose the run's report
            self.report.attribution = [Finding(status="error", statement=f"attribution failed: {e!r}")]
            return
        self.report.attribution = findings

    def _environment(self) -> Environment:
        """Host facts that make runs comparable: OS, Python, GPU and driver, campaign version."""
        res = self.host.run(
            "uname -srm; python3 -c 'import platform; print(platform.python_version())' 2>/dev/null || echo -; "
            "(command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi --query-gpu=name,driver_version "
            "--format=csv,noheader | head -1) || echo none",
            timeout=30,
        )
        lines = [*res.stdout.strip().splitlines(), "", "", ""]
        gpu, _, driver = lines[2].partition(",")
        probes: dict[str, str | None] = {}
        tmpl_vars = {**self.loaded.recipe.vars, **self._vars()}
        for name, template in self.loaded.recipe.probes.items():
            try:
                cmd = " ".join(shlex.quote(part.format(**tmpl_vars)) for part in template)
            except (KeyError, IndexError, ValueError):
                probes[name] = None
                continue
            # A probe that fails or hangs costs the run nothing but its figure.
            try:
                out = self.host.run(cmd + " 2>/dev/null", timeout=60)
            except CampaignError:
                probes[name] = None
                continue
            tail = out.stdout.strip().splitlines()
            probes[name] = tail[-1].strip() if out.ok and tail else None
        return Environment(
            host=self.host.name,
            os=lines[0],
            python=lines[1],
            gpu=gpu.strip() or "none",
            driver=driver.strip() or None,
            campaign_version=__version__,
            recipe=self.loaded.recipe.name,
            clock_offset_s=round(self._offset, 4),
            **probes,
        )


def _lost(error: BaseException | None) -> bool:
    """Whether ``error`` is, or was caused by, a host lost for good (``HostLost``: its reconnect budget ran out)."""
    seen: set[int] = set()
    while error is not None and id(error) not in seen:
        if isinstance(error, HostLost):
            return True
        seen.add(id(error))
        error = error.__cause__ or error.__context__
    return False


def _safe_name(name: str) -> str:
    return "".join(c if c.isalnum() or c in "._=,+-~" else "_" for c in name)[:120]


def restore_now(
    loaded: Loaded, host: Host, store: Store, *, on_event: EventSink | None = None, force: bool = False
) -> RunReport:
    """`campaign restore`: relaunch the experiment's known-good and prove it, recorded as a run of its own."""
    return Campaign(loaded, host, store, on_event=on_event).run(restore_only=True, force=force)
