"""What the steps of one run share: the experiment, the host, the store, the report, the plan once it is made.

A run (``run.Campaign``) makes one ``RunState`` and hands it to every step below it: the attempt
(``attempt``), the restore (``restore``) and the policies (``deadline``, ``retries``, ``known``, ``resumption``,
``rounds``, ``isolation``). Nothing here runs a step; it holds what they read and write.
"""

from __future__ import annotations

import time
from typing import Protocol

from campaign.config import Loaded, PlannedVariant, chosen, knobs_in_force, template_vars
from campaign.golden import Reference
from campaign.hosts.base import Host
from campaign.interruption import Interruption
from campaign.pipeline.events import Event, EventSink
from campaign.pipeline.plan import Plan
from campaign.records import BenchResult, KnobValue, RunReport
from campaign.redaction import Redactor
from campaign.server import ServerControl
from campaign.store import KnownGood, Store, now_iso


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


class RunState:
    """One run's shared state (see the module docstring)."""

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
        self.exp = exp = loaded.experiment
        self.host = host
        self.store = store
        chosen(exp, only)  # a variant --variant names that the experiment lacks is refused before anything runs
        self.only = only
        #: The checked plan, made once after the flag check (``Plan.checked``); None until then.
        self.plan: Plan | None = None
        self.isolate = exp.isolate if isolate is None else isolate
        self.emit: EventSink = on_event or (lambda _e: None)
        self.control = ServerControl(host, exp.host.workdir, state_dir=exp.host.state_dir)
        #: In a fleet: the other hosts' share of the run (claims on variants, attempt indexes); None on one host.
        self.share = share
        known = store.known_good(host.name, exp.name)
        #: Masks the secrets of what this run launches: the known-good's until the plan is made, then the plan's too.
        self.redact = Redactor([known.spec] if known else [])
        self.bench_settings = exp.bench_settings()
        self.baseline_bench: BenchResult | None = None
        #: The host's clock minus ours (``readiness.clock_offset``), measured when the run starts.
        self.offset = 0.0
        #: The baseline's knobs in force (recipe defaults such as the port filled in), whether or not it runs.
        self.baseline_knobs: dict[str, KnobValue] = knobs_in_force(loaded.recipe, exp.baseline, exp.baseline)
        self.intr = Interruption()
        #: True once a server was launched: from then an error leaves the box unproven, not merely untouched.
        self.touched = False
        #: The stored run this one continues (``--resume``): its attempts are kept, its report is this run's.
        self.resumed = resume is not None
        #: Run variants that a stored run saw fail deterministically with the same spec (``--retry-known``).
        self.retry_known = retry_known
        self.t0 = time.monotonic()
        #: When each attempt of this run began (monotonic), by index: an attempt cut short is timed to its end.
        self.attempt_t0: dict[int, float] = {}
        self.history: list[RunReport] | None = None
        self.report = (
            resume.model_copy(deep=True)
            if resume is not None
            else RunReport(
                run_id=share.run_id if share is not None else store.new_run_id(exp.name),
                experiment=exp.name,
                config_path=str(loaded.path),
                host=host.name,
                recipe=loaded.recipe.name,
                started_at=now_iso(),
            )
        )

    @property
    def planned(self) -> list[PlannedVariant]:
        """The plan's variants in run order (none before the plan is made)."""
        return self.plan.planned if self.plan is not None else []

    def set_plan(self, plan: Plan) -> None:
        """Hand the run its checked plan; its secrets join the ones masked."""
        known = self.known_good()
        self.plan = plan
        self.redact = Redactor([p.spec for p in plan.planned] + ([known.spec] if known else []))

    def known_good(self) -> KnownGood | None:
        """The host's known-good of this experiment, as the store holds it now."""
        return self.store.known_good(self.host.name, self.exp.name)

    def save(self) -> None:
        """Write the report as it stands."""
        self.store.save_report(self.report)

    def note(self, text: str) -> None:
        """Tell the display something about the run as a whole."""
        self.emit(Event("note", text=text))

    def vars(self) -> dict[str, str]:
        """The template variables the recipe's command and probes are filled with."""
        return template_vars(self.exp)

    def next_index(self) -> int:
        """The next attempt index (over every host, in a fleet)."""
        return self.share.next_index() if self.share is not None else len(self.report.attempts)

    def smoke_reference(self) -> Reference | None:
        """The host's known-good smoke outputs, which an attempt's are compared with (None before one is proven)."""
        known = self.known_good()
        smoke = self.store.proven_smoke(known) if known is not None else None
        if known is None or smoke is None:
            return None
        return Reference(smoke, f"run {known.run_id} attempt {known.attempt} ({known.variant})")
