"""What each command does, as calls that return values: the CLI parses, calls one of these, and renders the value.

``Operations`` holds what every command shares (the run store folder); its methods open and close the hosts they
need, so a command never holds a connection longer than its call. Nothing here prints: progress goes to an
``on_event`` or ``progress`` callback, and every result is a record (``campaign.records``) or a value the console
draws.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import ExitStack, closing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from campaign import config as cfg
from campaign import outcome
from campaign.bench import run_bench
from campaign.box import box_status, doctor, stop_box
from campaign.compare import compare
from campaign.comparison import ALPHA, MIN_EFFECT, Comparison
from campaign.errors import HostError, StoreError, UsageError
from campaign.estimate import estimate
from campaign.flags import checked_plan
from campaign.fleet import Fleet, fleet_estimate
from campaign.hosts import Host, open_host
from campaign.pipeline import Campaign, EventSink, restore_now
from campaign.readiness import LogFollower
from campaign.records import (
    Attempt,
    BenchEvent,
    BenchResult,
    BenchSettings,
    FlagsChecked,
    FlagsUnchecked,
    Healing,
    HostStatus,
    PlanEntry,
    PlanEstimate,
    RequestRow,
    RunPlan,
    RunReport,
    StopReport,
)
from campaign.records.tune import TuneReport
from campaign.redaction import Redactor, mask_args, mask_env
from campaign.resume import check_resumable
from campaign.server import ServerControl
from campaign.statistics import Correction
from campaign.store import KnownGood, Store
from campaign.tune.search import Progress
from campaign.tune.tuner import tune

#: What a failed variant leads to, as a dry run says it.
ON_FAILURE = "diagnose, stop, relaunch the known-good and prove it (readiness + smoke)"
#: How often a followed log is polled.
FOLLOW_POLL_S = 0.2


def exit_code(report: RunReport) -> int:
    """The exit code a run's report means (``campaign.outcome``): 0, 1, 3, or 128 + N after signal N."""
    return outcome.exit_code(report)


@dataclass(frozen=True)
class Plan:
    """A dry run: the experiment loaded and every variant rendered, with the host's known-good (local hosts)."""

    loaded: cfg.Loaded
    planned: list[cfg.PlannedVariant]
    isolate: bool
    known_good: KnownGood | None
    #: Whether the planned flags were checked against the server's own --help on the host.
    flags: FlagsChecked | FlagsUnchecked
    #: Lines for a person about the check (``note: ...``, ``flags not checked: ...``).
    notes: list[str]
    #: The trial count and the estimated duration from stored timings of the recipe on the host.
    estimate: PlanEstimate | None = None

    @property
    def host_label(self) -> str:
        """``local``, ``ssh HOST`` or ``slurm PARTITION``; a fleet's: ``fleet of N: ssh A, ssh B``."""
        fleet = self.loaded.experiment.fleet
        labels = [host_label(h) for h in fleet]
        return labels[0] if len(labels) == 1 else f"fleet of {len(labels)}: " + ", ".join(labels)

    def document(self) -> RunPlan:
        """The plan as `--dry-run --json` prints it."""
        exp = self.loaded.experiment
        bench = exp.bench_settings()
        return RunPlan(
            experiment=exp.name,
            host=self.host_label,
            recipe=self.loaded.recipe.name,
            variants=[
                PlanEntry(
                    name=p.name,
                    knobs=p.knobs,
                    command=mask_args(p.spec.command),
                    shell=cfg.shell_line(p.spec.model_copy(update={"command": mask_args(p.spec.command)})),
                    env=mask_env(p.spec.env),
                    port=p.spec.port,
                    spec_hash=p.spec.spec_hash(),
                )
                for p in self.planned
            ],
            matrix=exp.matrix.model_dump() if exp.matrix else None,
            isolate=self.isolate,
            on_failure=ON_FAILURE,
            known_good=self.known_good.variant if self.known_good else None,
            at_end=exp.at_end,
            flags=self.flags,
            bench=bench.describe() if bench is not None else None,
            bench_trials=bench.trial_count() if bench is not None else None,
            estimate=self.estimate,
        )


def host_label(host: cfg.HostConfig) -> str:
    """How a plan names one host: ``local``, ``ssh HOST[:PORT]`` or ``slurm PARTITION``."""
    if host.kind == "slurm":
        return f"slurm {host.partition or 'default'}"
    return host.kind if host.kind == "local" else f"ssh {host.host}" + (f":{host.port}" if host.port else "")


@dataclass(frozen=True)
class Stopped:
    """What `campaign stop` did on which host."""

    host: str
    report: StopReport


@dataclass(frozen=True)
class Operations:
    """What the commands do, over one run store."""

    runs: Path

    @property
    def store(self) -> Store:
        """The run store."""
        return Store(self.runs)

    # -- experiments -----------------------------------------------------------------------------------------------

    def plan(
        self,
        config: str,
        sets: Sequence[str],
        variants: Sequence[str],
        isolate: bool | None,
        *,
        accept_new_host_key: bool = False,
    ) -> Plan:
        """Load and render an experiment, its flags checked against the host's server (read-only on the host).

        Nothing on the host changes; the store keeps only the server's --help. An unknown flag raises ConfigError;
        a host that cannot be reached leaves the flags unchecked, and the plan says so. The known-good is read for
        local hosts.
        """
        loaded = cfg.load(config, sets)
        exp = loaded.experiment
        # A fleet's plan is rendered as its first host runs it (the others differ by their own knobs and env).
        first = loaded.on_host(exp.host) if len(exp.fleet) > 1 else loaded
        only = tuple(variants)
        notes: list[str] = []
        flags: FlagsChecked | FlagsUnchecked
        host_name = exp.host.host if exp.host.kind == "ssh" else exp.host.kind
        try:
            with closing(open_host(exp.host, accept_new_host_key=accept_new_host_key)) as host:
                host_name = host.name
                check = checked_plan(first, host, self.runs, only)
        except HostError as e:
            planned = cfg.plan(first.experiment, loaded.recipe, only)
            notes.append(f"flags not checked: {e}")
            flags = FlagsUnchecked(detail=str(e))
        else:
            planned = check.planned
            notes += [f"note: {note}" for note in check.notes]
            if check.help is None:
                detail = check.notes[0] if check.notes else f"recipe {loaded.recipe.name} declares no help command"
                flags = FlagsUnchecked(detail=detail)
            else:
                h = check.help
                flags = FlagsChecked(server_version=h.version, source=h.source, notes=check.notes)
        known = self.store.known_good("local", exp.name) if exp.host.kind == "local" else None
        cost = estimate(
            self.store.reports_of(loaded.recipe.name, host_name), planned, experiment=exp.name, deadline_s=exp.deadline
        )
        if len(exp.fleet) > 1:
            cost = fleet_estimate(cost, len(exp.fleet), exp.baseline.name if exp.run_baseline else None)
        return Plan(loaded, planned, exp.isolate if isolate is None else isolate, known, flags, notes, cost)

    def run(
        self,
        config: str,
        sets: Sequence[str],
        variants: Sequence[str],
        isolate: bool | None,
        *,
        accept_new_host_key: bool = False,
        on_event: EventSink | None = None,
        force: bool = False,
        resume: str | None = None,
        retry_known: bool = False,
    ) -> RunReport:
        """Run an experiment on its host: every variant launched, proven or diagnosed, the box restored.

        ``force`` breaks a host lock held by another campaign (the report records whose it was). ``resume`` (a run
        id, a prefix, or ``last``: this experiment's newest run) continues a stored run: its finished attempts are
        kept and the variants left run into the same report. ``retry_known`` runs variants a stored run saw fail
        deterministically with the same spec.
        """
        loaded = cfg.load(config, sets)
        options: dict[str, Any] = {
            "only": tuple(variants),
            "isolate": isolate,
            "on_event": on_event,
            "retry_known": retry_known,
        }
        if len(loaded.experiment.fleet) > 1:
            if resume is not None:
                raise UsageError(
                    f"--resume does not continue a fleet run yet ({loaded.experiment.name} names "
                    f"{len(loaded.experiment.fleet)} hosts)",
                    hint="run the variants the report lists as not run with --variant NAME (repeat)",
                )
            with ExitStack() as stack:
                hosts = [
                    stack.enter_context(closing(open_host(h, accept_new_host_key=accept_new_host_key)))
                    for h in loaded.experiment.fleet
                ]
                return Fleet(loaded, hosts, self.store, **options).run(force=force)
        with closing(open_host(loaded.experiment.host, accept_new_host_key=accept_new_host_key)) as host:
            previous = self._resumable(loaded, host.name, resume, tuple(variants)) if resume is not None else None
            camp = Campaign(loaded, host, self.store, resume=previous, **options)
            return camp.run(force=force)

    def _resumable(self, loaded: cfg.Loaded, host: str, ref: str, only: tuple[str, ...]) -> RunReport:
        """The stored run ``ref`` names (``last``: the experiment's newest), checked to be this experiment's and
        to have variants left."""
        exp = loaded.experiment
        if ref == "last":
            mine = [r for r in self.store.list_runs() if r.experiment == exp.name and r.host == host]
            if not mine:
                raise UsageError(f"no stored run of {exp.name} on {host} to resume", hint="run it without --resume")
            ref = mine[0].run_id
        report = self.store.load_report(ref)
        check_resumable(report, exp.name, host, cfg.plan(exp, loaded.recipe, only))
        return report

    def restore(
        self, config: str, sets: Sequence[str], *, on_event: EventSink | None = None, force: bool = False
    ) -> RunReport:
        """Relaunch the experiment's known-good and prove it again, recorded as a run of its own."""
        loaded = cfg.load(config, sets)
        if len(loaded.experiment.fleet) > 1:
            raise UsageError(
                f"`campaign restore` puts one host's known-good back; {loaded.experiment.name} names "
                f"{len(loaded.experiment.fleet)} hosts",
                hint="restore a host of the fleet with an experiment naming that one host (`host:`); a fleet run "
                "itself puts each host's known-good back at its end (at_end: known_good)",
            )
        with closing(open_host(loaded.experiment.host)) as host:
            return restore_now(loaded, host, self.store, on_event=on_event, force=force)

    def tune(
        self,
        config: str,
        sets: Sequence[str],
        *,
        strategy: str,
        budget: str | None = None,
        resume: str | None = None,
        on_event: EventSink | None = None,
        on_progress: Callable[[Progress], None] | None = None,
    ) -> TuneReport:
        """Search the experiment's ``search:`` space through the loop and keep a proven winner (``campaign.tune``)."""
        loaded = cfg.load(config, sets)
        if len(loaded.experiment.fleet) > 1:
            raise UsageError(f"`campaign tune` runs on one host; {loaded.experiment.name} names a fleet")
        with closing(open_host(loaded.experiment.host)) as host:
            return tune(
                loaded,
                host,
                self.store,
                strategy=strategy,
                budget=budget,
                resume=resume,
                on_event=on_event,
                on_progress=on_progress,
            )

    # -- host state ------------------------------------------------------------------------------------------------

    def status(self, config: str, sets: Sequence[str]) -> list[HostStatus]:
        """What runs on each of the experiment's hosts now (whose, alive, healthy, since when), its lock, its
        known-good: one entry per host (one for ``host:``)."""
        loaded = cfg.load(config, sets)
        out = []
        for entry in loaded.experiment.fleet:
            with closing(open_host(entry)) as host:
                out.append(box_status(loaded.on_host(entry), host, self.store))
        return out

    def stop(self, config: str, sets: Sequence[str], *, force: bool = False) -> list[Stopped]:
        """Stop what campaign runs on each of the experiment's hosts (under its lock) and verify each is clean."""
        loaded = cfg.load(config, sets)
        out = []
        for entry in loaded.experiment.fleet:
            with closing(open_host(entry)) as host:
                done = stop_box(loaded.on_host(entry), host, self.store, force=force)
                out.append(Stopped(done.host, done.stop))
        return out

    def doctor(self) -> Healing:
        """Rebuild the run store's index from its run folders; prune rows whose folder is gone."""
        return doctor(self.store)

    # -- the store -------------------------------------------------------------------------------------------------

    def report(self, ref: str) -> RunReport:
        """One stored run's report (``ref``: an id, a unique prefix, or ``last``)."""
        return self.store.load_report(ref)

    def stored_log(self, ref: str, attempt: int | None) -> bytes:
        """The log copy of an attempt (the last one by default) of a stored run."""
        report, att = self._attempt(ref, attempt)
        if att.log_file is None:
            raise StoreError(
                f"attempt {att.index} of {report.run_id} has no stored log (it is still running?)",
                hint="use --follow to tail it on the host",
            )
        return (self.runs / report.run_id / att.log_file).read_bytes()

    def follow_log(self, ref: str, attempt: int | None) -> Iterator[str]:
        """The live log of an attempt on its host, line by line, until the server's group is gone."""
        report, att = self._attempt(ref, attempt)
        loaded = cfg.load(str(self.runs / report.run_id / "experiment.yaml"))
        entry, opened = self._host_of(loaded, att)
        with closing(opened) as host:
            control = ServerControl(host, entry.workdir, state_dir=entry.state_dir)
            follower = LogFollower(host, f"{att.remote_dir}/server.log")
            # The stored records are masked; the launch script on the host knows the secrets to mask in the log.
            redact = Redactor.from_script(host.read_file(f"{att.remote_dir}/launch.sh").decode(errors="replace"))
            while True:
                note = follower.reopened()
                if note is not None:
                    yield note
                for _n, line in follower.poll():
                    yield redact(line)
                if att.pgid is None or not control.alive(att.pgid):
                    for _n, line in follower.flush():
                        yield redact(line)
                    return
                time.sleep(FOLLOW_POLL_S)

    @staticmethod
    def _host_of(loaded: cfg.Loaded, att: Attempt) -> tuple[cfg.HostConfig, Host]:
        """The host entry an attempt ran on, opened (a fleet's: the entry whose host has the attempt's name)."""
        fleet = loaded.experiment.fleet
        if len(fleet) == 1 or att.host is None:
            return fleet[0], open_host(fleet[0])
        for entry in fleet:
            host = open_host(entry)
            if host.name == att.host:
                return entry, host
            host.close()
        raise UsageError(f"attempt {att.index} ran on {att.host}, which the run's experiment no longer names")

    def _attempt(self, ref: str, index: int | None) -> tuple[RunReport, Attempt]:
        report = self.store.load_report(ref)
        if not report.attempts:
            raise UsageError(f"run {report.run_id} has no attempts")
        if index is None:
            return report, report.attempts[-1]
        matches = [a for a in report.attempts if a.index == index]
        if not matches:
            raise UsageError(
                f"run {report.run_id} has no attempt {index}",
                hint="attempts: " + ", ".join(f"{a.index} ({a.variant})" for a in report.attempts),
            )
        return report, matches[0]

    # -- measuring and comparing ------------------------------------------------------------------------------------

    def bench(
        self,
        url: str,
        options: Mapping[str, Any],
        *,
        model: str | None = None,
        progress: Callable[[BenchEvent], None] | None = None,
        output: Path | None = None,
        export: Path | None = None,
    ) -> BenchResult:
        """Load the server at ``url`` with the bench ``options`` (``BenchSettings`` fields) and return the result.

        ``output`` receives the result's JSON, ``export`` one JSON line per measured request (both with secrets
        masked); a file that cannot be written is a usage error before any request is sent.
        """
        try:
            settings = BenchSettings.model_validate(dict(options), context={"plan": True})
        except ValidationError as e:
            err = e.errors(include_url=False)[0]
            field = ".".join(str(p) for p in err["loc"]) or "options"
            raise UsageError(f"{field}: {str(err['msg']).removeprefix('Value error, ')}") from None
        for path in (output, export):
            if path is not None and not path.parent.is_dir():
                raise UsageError(f"{path}: its folder does not exist", hint="create it, or write somewhere else")
        try:
            rows = export.open("w", encoding="utf-8") if export is not None else None
        except OSError as e:
            raise UsageError(f"{export}: cannot write it ({e.strerror})") from None
        try:

            def on_request(row: RequestRow) -> None:
                assert rows is not None
                rows.write(row.model_dump_json() + "\n")

            result = run_bench(
                url, settings, model=model, progress=progress, on_request=on_request if rows is not None else None
            )
        finally:
            if rows is not None:
                rows.close()
        if output is not None:
            try:
                output.write_text(result.model_dump_json(indent=2) + "\n", encoding="utf-8")
            except OSError as e:
                raise UsageError(f"{output}: cannot write it ({e.strerror})") from None
        return result

    def compare(
        self,
        refs: Sequence[str],
        *,
        all_fields: bool = False,
        baseline: str | None = None,
        correction: Correction = "holm",
        alpha: float = ALPHA,
        min_effect: float = MIN_EFFECT,
    ) -> Comparison:
        """Compare stored runs: configuration and environment differences, metrics with significance.

        ``baseline`` is ``RUN:VARIANT`` (RUN an id, a prefix or ``last``): the column every other is compared with.
        """
        store = self.store
        reference: tuple[str, str] | None = None
        if baseline is not None:
            run, sep, variant = baseline.partition(":")
            if not sep or not run or not variant:
                raise UsageError(f"--baseline {baseline!r}: expected RUN:VARIANT, e.g. last:baseline")
            reference = (store.resolve(run), variant)
        reports = [store.load_report(r) for r in refs]
        return compare(
            reports,
            all_fields=all_fields,
            baseline=reference,
            correction=correction,
            alpha=alpha,
            min_effect=min_effect,
        )
