"""A fleet: one run of an experiment spread over several hosts at once, recorded as one run with one report.

Each host runs the loop a run on one host runs (``pipeline.Campaign``), in a thread of its own: its own lock, its
own known-good and restores, its own readiness, smoke and bench. The threads spend their time waiting on the hosts
(SSH calls, health polls, benches), so one process drives them all. What they share is this module's ``Fleet``:

- **The baseline on every host.** Hosts differ (GPU, driver, clocks, what else runs there), so a variant is judged
  only against the baseline of the host it ran on: each host runs the baseline first, and takes variants only once
  its baseline passed (readiness, smoke, bench). A host whose baseline fails takes none; the others run its share.
  The baseline's bench is the ruler of that host's gates, its smoke outputs the reference of that host's smoke.
- **Variants go to whichever host is free.** In plan order, each to the first host that asks for one (a queue, not a
  fixed split: a slower host takes fewer). A variant runs once in the run, on one host; its isolation attempts,
  its retries and the restore after it failed stay on that host.
- **One report.** Each host's loop keeps its part (its attempts, restores, final state); every write of a part goes
  through ``Fleet.save``, which merges the parts into the run's one ``report.json`` under a lock. Attempt indexes
  are unique over the run, and each attempt names its ``host``; ``RunReport.hosts`` holds each host's ending.
- **Signals.** The main thread waits for the hosts' threads and catches SIGINT/SIGTERM/SIGHUP; each is handed to
  every host's loop (``Interruption.deliver``): the first stops the variant under test on every host and puts each
  one's known-good back, a second leaves at once, each host recording what still runs there.
- **A host that cannot be had** (its lock held by another campaign, or lost before its loop launched anything)
  takes no part: the others run the variants, and its entry in ``hosts`` says why. When no host can be had, the
  error is raised as on one host. A host that cannot be reached when the command connects fails the command.

Not for fleets (refused with a message): ``--resume`` of a fleet run, and ``campaign restore`` (one host's
known-good; ``status`` and ``stop`` answer for every host). docs/long-campaigns.md has the rest.
"""

from __future__ import annotations

import dataclasses
import signal
import threading
from collections.abc import Sequence

from campaign.config import Loaded, PlannedVariant, chosen
from campaign.errors import CampaignError, HostError, LockHeld
from campaign.hosts.base import Host
from campaign.interruption import Interrupted, Interruption
from campaign.pipeline import Campaign, Event, EventSink
from campaign.records import Environment, Final, HostRun, PlanEstimate, RunReport, RunStatus
from campaign.store import Store, now_iso

#: How a fleet's status is made from its hosts': the first of these that some host has.
_WORST: tuple[RunStatus, ...] = ("interrupted", "restore_failed", "aborted", "failed", "passed")
#: How often the main thread looks up from waiting on the hosts (signals are taken at once regardless).
_JOIN_S = 0.2


class _PartStore(Store):
    """The run store as a host's loop sees it: writing its report means writing its part of the fleet's."""

    def __init__(self, root: Store, fleet: Fleet) -> None:
        super().__init__(root.root)
        self._fleet = fleet

    def save_report(self, report: RunReport) -> None:
        """Merge this host's part into the fleet's report and write that (one writer at a time)."""
        self._fleet.save()


class Fleet:
    """One run of an experiment on every host it names, in parallel (see the module docstring)."""

    def __init__(
        self,
        loaded: Loaded,
        hosts: Sequence[Host],
        store: Store,
        *,
        only: tuple[str, ...] = (),
        isolate: bool | None = None,
        on_event: EventSink | None = None,
        retry_known: bool = False,
    ) -> None:
        exp = loaded.experiment
        if len(hosts) != len(exp.fleet):
            raise ValueError("one open host per entry of the experiment's hosts")
        self.loaded = loaded
        self.exp = exp
        self.store = store
        self.run_id = store.new_run_id(exp.name)
        self._emit = on_event or (lambda _e: None)
        self._events = threading.Lock()
        self._board = threading.Lock()
        self._writes = threading.Lock()
        self._claimed: dict[str, str] = {}
        self._next_index = 0
        #: Why a host took no part (its lock held, say), by host name.
        self._refused: dict[str, CampaignError] = {}
        #: What ended a host's loop with an error, by host name (raised once every host is done).
        self._errors: dict[str, BaseException] = {}
        #: The variants the run runs, by name, in plan order (each host renders its own plan: its knobs differ).
        self.variants = [c.name for c in chosen(exp, only)]
        self._part_store = part_store = _PartStore(store, self)
        self.parts = [
            Campaign(
                loaded.on_host(entry),
                host,
                part_store,
                only=only,
                isolate=isolate,
                on_event=self._sink(host.name),
                retry_known=retry_known,
                share=self,
            )
            for entry, host in zip(exp.fleet, hosts, strict=True)
        ]
        self.report = RunReport(
            run_id=self.run_id,
            experiment=exp.name,
            config_path=str(loaded.path),
            host=", ".join(h.name for h in hosts),
            recipe=loaded.recipe.name,
            started_at=now_iso(),
            hosts=[HostRun(host=h.name) for h in hosts],
        )

    # -- what the hosts' loops share (pipeline.Share) ------------------------------------------------------------

    def claim(self, host: str, pv: PlannedVariant) -> bool:
        """The baseline runs on every host; any other variant once, on the first host with a proven baseline."""
        if pv.name == self.exp.baseline.name:
            return True
        with self._board:
            if self.exp.run_baseline and self._baseline_attempt(self._part(host)) is None:
                return False
            if pv.name in self._claimed:
                return False
            self._claimed[pv.name] = host
            return True

    def next_index(self) -> int:
        """The next attempt index of the run, unique over every host."""
        with self._board:
            index, self._next_index = self._next_index, self._next_index + 1
            return index

    def save(self) -> None:
        """Write the fleet's report, merged from every host's part as it stands now."""
        with self._writes:
            Store.save_report(self.store, self._merged())

    # -- the run -----------------------------------------------------------------------------------------------------

    def run(self, *, force: bool = False) -> RunReport:
        """Run every host's loop at once and wait for all; returns the one report.

        Raises, once every host is done and the report is written: the error that ended a host's loop (the worst,
        by exit code), or ``LockHeld`` / the host's error when no host could be had at all.
        """
        self.store.check()
        self._part_store.heal()  # once, here: not by two hosts' threads at the same moment
        names = ", ".join(c.host.name for c in self.parts)
        self._say(Event("run_start", text=f"fleet run {self.run_id} on {len(self.parts)} hosts: {names}"))
        done = [threading.Event() for _ in self.parts]
        threads = [
            threading.Thread(target=self._host_loop, args=(c, force, d), name=f"host {c.host.name}", daemon=True)
            for c, d in zip(self.parts, done, strict=True)
        ]
        with Interruption() as intr:
            for t in threads:
                t.start()
            # The handler only records a signal (campaign.interruption): this loop hands each one to every host's
            # loop, whose next checkpoint raises it in that host's thread. The wait wakes at once on a signal.
            handed = 0
            while not all(d.is_set() for d in done):
                intr.wait(_JOIN_S)
                while handed < intr.count:
                    handed += 1
                    signum = intr.first if handed == 1 else intr.last
                    for camp in self.parts:
                        camp.interrupt(signum or signal.SIGINT)
            intr.quiet()
        for t in threads:
            t.join()
        self.report.ended_at = now_iso()
        if len(self._refused) == len(self.parts):
            if (self.store.root / self.run_id / "report.json").is_file():
                self.save()  # a host wrote its part before it was lost: the run is recorded ended
            raise next(iter(self._refused.values()))
        self.save()
        self._say(Event("run_end", text=self.report.status))
        if self._errors:
            raise _worst_error(self._errors)
        return self.report

    def _host_loop(self, camp: Campaign, force: bool, done: threading.Event) -> None:
        try:
            self._host_run_loop(camp, force)
        finally:
            done.set()

    def _host_run_loop(self, camp: Campaign, force: bool) -> None:
        name = camp.host.name
        try:
            camp.run(force=force)
        except (LockHeld, HostError) as e:
            if camp.report.attempts:
                self._errors[name] = e
            else:
                self._refused[name] = e  # it never started: the other hosts run its share
                self._say(Event("note", text=f"{name} takes no part: {e.message}", host=name))
        except Interrupted as e:  # before its loop began (taking the lock): nothing to clean up there
            camp.report.status = "interrupted"
            camp.report.signal = e.name
            camp.report.final = Final(healthy=True, detail=f"interrupted by {e.name} before anything was done")
        except BaseException as e:  # recorded and raised in the main thread once every host is done
            self._errors[name] = e

    def _sink(self, host: str) -> EventSink:
        def emit(ev: Event) -> None:
            self._say(dataclasses.replace(ev, host=host))

        return emit

    def _say(self, ev: Event) -> None:
        with self._events:  # one host's event at a time: the display is not drawn from two threads at once
            self._emit(ev)

    # -- the report ---------------------------------------------------------------------------------------------------

    def _part(self, host: str) -> Campaign:
        return next(c for c in self.parts if c.host.name == host)

    def _baseline_attempt(self, camp: Campaign) -> int | None:
        base = self.exp.baseline.name
        passed = [
            a.index
            for a in list(camp.report.attempts)
            if a.role == "variant" and a.variant == base and a.outcome == "passed"
        ]
        return passed[0] if passed else None

    def _host_run(self, camp: Campaign) -> HostRun:
        part = camp.report
        name = camp.host.name
        run = HostRun(
            host=name,
            status=part.status,
            final=part.final,
            environment=part.environment,
            baseline_attempt=self._baseline_attempt(camp),
            signal=part.signal,
            lock_taken_over=part.lock_taken_over,
            ended_early=part.ended_early,
        )
        if name in self._refused:
            run.status = "aborted"
            run.final = Final(healthy=True, detail="not touched")
            run.note = f"took no part: {self._refused[name].message}"
        elif self.exp.run_baseline and run.baseline_attempt is None and part.attempts and part.status != "running":
            run.note = "the baseline did not pass here: no variant was judged on this host"
        return run

    def _merged(self) -> RunReport:
        """The fleet's report from every host's part (called under the write lock)."""
        report = self.report
        parts = [c.report for c in self.parts]
        report.attempts = sorted((a for p in parts for a in list(p.attempts)), key=lambda a: a.index)
        report.restores = sorted(
            (r for p in parts for r in list(p.restores)), key=lambda r: -1 if r.attempt is None else r.attempt
        )
        report.attribution = [f for p in parts for f in p.attribution]
        report.hosts = [self._host_run(c) for c in self.parts]
        report.environment = next((p.environment for p in parts if p.environment.host), Environment())
        report.signal = next((p.signal for p in parts if p.signal), None)
        report.lock_taken_over = next((p.lock_taken_over for p in parts if p.lock_taken_over), None)
        if report.ended_at is not None:
            self._conclude(report)
        return report

    def _conclude(self, report: RunReport) -> None:
        """Status, final state and what was left unrun, once every host is done."""
        ran = [h for h in report.hosts if h.host not in self._refused]
        if not ran:
            report.status = "aborted"
            why = "; ".join(f"{h.host} {h.note}" for h in report.hosts if h.note)
            report.final = Final(healthy=True, detail=f"no host could be had: {why}")
            return
        statuses = {h.status for h in ran}
        report.status = next((s for s in _WORST if s in statuses), "aborted")
        finals = [h.final for h in ran]
        variants = {f.variant for f in finals}
        report.final = Final(
            variant=variants.pop() if len(variants) == 1 else None,
            spec_hash=finals[0].spec_hash if len({f.spec_hash for f in finals}) == 1 else None,
            healthy=all(f.healthy for f in finals),
            detail="; ".join(f"{h.host}: {_describe(h.final)}" for h in report.hosts),
        )
        attempted = {a.variant for a in report.attempts if a.role == "variant"}
        report.not_run = [name for name in self.variants if name not in attempted]
        early = [f"{h.host}: {h.ended_early}" for h in ran if h.ended_early]
        report.ended_early = "; ".join(early) or None


def _describe(final: Final) -> str:
    """One host's final state in a few words."""
    if final.variant is not None:
        state = "healthy" if final.healthy else "not healthy"
        return f"{final.variant} {state}" + (f" ({final.detail})" if final.detail else "")
    return final.detail or ("nothing running" if final.healthy else "unproven")


def _worst_error(errors: dict[str, BaseException]) -> BaseException:
    """The error to end the fleet's command with: a bug of ours first, else the highest exit code; named by host."""
    bugs = [e for e in errors.values() if not isinstance(e, CampaignError)]
    if bugs:
        return bugs[0]
    host, worst = max(
        ((h, e) for h, e in errors.items() if isinstance(e, CampaignError)), key=lambda he: he[1].exit_code
    )
    worst.message = f"{host}: {worst.message}"
    return worst


def fleet_estimate(one: PlanEstimate, hosts: int, baseline: str | None) -> PlanEstimate:
    """A one-host estimate spread over ``hosts``, as a fleet runs it: what the run would take, start to end.

    Every host pays the run's overhead and its own baseline; the other variants go, in plan order, to the host
    that is free first. Each variant costs what the one-host estimate says, on whichever host it lands (the
    stored timings are the first host's). A variant with no cost known counts as nothing, as on one host.
    """
    costs = {v.variant: v.seconds or 0.0 for v in one.variants}
    start = one.overhead_s + (costs.get(baseline, 0.0) if baseline is not None else 0.0)
    free = [start] * hosts
    past: list[str] = []
    for v in one.variants:
        if v.variant == baseline:
            continue
        i = free.index(min(free))
        free[i] += costs[v.variant]
        if one.deadline_s is not None and free[i] > one.deadline_s:
            past.append(v.variant)
    total = round(max(free), 1) if one.total_s is not None else None
    trials = one.trials + (hosts - 1 if baseline is not None and baseline in costs else 0)
    return one.model_copy(update={"total_s": total, "trials": trials, "hosts": hosts, "past_deadline": past})
