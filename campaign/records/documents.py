"""The documents commands print with ``--json``: a dry run's plan, a run's summary, a host's status, a stop, the
run list, failures grouped, the index's healing, and an error.

Each is a record, so what ``--json`` prints is ``model_dump_json`` of a value the core returned, and its shape is
the model's JSON schema (``RunSummary.model_json_schema()``). The full report is ``RunReport`` itself (``campaign
show --json``); a bench is ``BenchResult`` (``campaign bench --json``); a diagnosis is ``Diagnosis``. A command that
serves a fleet (``status``, ``stop``) prints a list of its documents, one per host; ``runs`` prints a list of rows.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from campaign.records.benchmark import BenchResult
from campaign.records.findings import Finding
from campaign.records.knobs import KnobValue
from campaign.records.report import Evidence, Final, GateResult, Restore, RunReport, Timings


class PlanEntry(BaseModel):
    """One variant of a dry run: its exact launch (secret env values masked)."""

    name: str
    knobs: dict[str, KnobValue]
    command: list[str]
    #: The launch as one shell line, every value quoted.
    shell: str
    env: dict[str, str]
    port: int
    spec_hash: str


class FlagsChecked(BaseModel):
    """The plan's flags were checked against the server's own --help (read on the host, or from the help cache)."""

    checked: Literal[True] = True
    server_version: str | None
    #: ``host`` (read now) or ``cache`` (read before, for this server version).
    source: str
    notes: list[str] = Field(default_factory=list)


class FlagsUnchecked(BaseModel):
    """The plan's flags could not be checked (the host was unreachable, or the recipe reads no help); why."""

    checked: Literal[False] = False
    detail: str


class VariantCost(BaseModel):
    """What one planned variant is expected to cost, and what the figure comes from."""

    variant: str
    seconds: float | None
    #: ``spec``: stored attempts of this exact spec; ``recipe``: the median attempt of the recipe on this host;
    #: ``none``: nothing stored to go by.
    basis: Literal["spec", "recipe", "none"]


class PlanEstimate(BaseModel):
    """A dry run's cost: the trial count and the estimated duration from stored timings (same recipe, same host)."""

    trials: int
    #: None when nothing of this recipe was ever stored for this host.
    total_s: float | None
    overhead_s: float
    runs_used: int
    variants: list[VariantCost] = Field(default_factory=list)
    deadline_s: float | None = None
    #: The variants a ``deadline`` would leave unrun, by this estimate.
    past_deadline: list[str] = Field(default_factory=list)
    #: The hosts of a fleet: above 1, ``total_s`` is the fleet's (``campaign.fleet.fleet_estimate``).
    hosts: int = 1


class RunPlan(BaseModel):
    """`campaign run --dry-run --json`: what would run, and what happens on a failure; nothing was touched."""

    experiment: str
    host: str
    recipe: str
    variants: list[PlanEntry]
    matrix: dict[str, Any] | None = None
    isolate: bool
    on_failure: str
    #: The variant the host's known-good record names (local hosts only: a dry run opens no connection).
    known_good: str | None = None
    at_end: str
    flags: FlagsChecked | FlagsUnchecked
    #: What each variant's bench runs (levels, or an SLA search with its trial bound); None without a bench.
    bench: str | None = None
    #: How many bench levels each variant runs (at most, for an SLA search).
    bench_trials: int | None = None
    estimate: PlanEstimate | None = None


class DiagnosisSummary(BaseModel):
    """A failed attempt's diagnosis, without the summary line (``campaign show`` has it)."""

    kind: str
    evidence: list[Evidence] = Field(default_factory=list)
    hint: str = ""
    confidence: float = 0.0
    fingerprint: str | None = None


class SmokeCount(BaseModel):
    """How many smoke questions were answered right, of how many."""

    passed: int
    total: int


class AttemptSummary(BaseModel):
    """One attempt in a run's summary."""

    index: int
    variant: str
    role: str
    #: Which launch of its variant (0, then 1, 2, ... for the ``relaunch`` rounds of ``bench.launches``).
    launch: int
    knobs: dict[str, KnobValue]
    outcome: str
    failed_phase: str | None
    diagnosis: DiagnosisSummary | None
    timings: Timings
    smoke: SmokeCount | None
    restore: Restore | None
    bench: BenchResult | None
    gates: list[GateResult]
    spec_hash: str
    #: Where the stored log copy is (under the run store), or None.
    log: str | None


class RestoreSummary(BaseModel):
    """Whether the box had to be put back, and each restore."""

    outcome: str
    restores: list[Restore]


class RunSummary(BaseModel):
    """`campaign run --json` and `campaign restore --json`: a run's essentials in a stable shape."""

    run_id: str
    experiment: str
    host: str
    status: str
    exit_code: int
    attempts: list[AttemptSummary]
    restore: RestoreSummary
    final: Final
    attribution: list[Finding]
    #: The path of the full report.
    report: str

    @classmethod
    def of(cls, report: RunReport, exit_code: int, runs_dir: str) -> RunSummary:
        """The summary of ``report``, whose run ended with ``exit_code``, stored under ``runs_dir``."""
        attempts = [
            AttemptSummary(
                index=a.index,
                variant=a.variant,
                role=a.role,
                launch=a.launch,
                knobs=a.knobs,
                outcome=a.outcome,
                failed_phase=a.failed_phase,
                diagnosis=(
                    DiagnosisSummary(
                        kind=a.diagnosis.kind,
                        evidence=a.diagnosis.evidence,
                        hint=a.diagnosis.hint,
                        confidence=a.diagnosis.confidence,
                        fingerprint=a.diagnosis.fingerprint,
                    )
                    if a.diagnosis is not None and a.outcome == "failed"
                    else None
                ),
                timings=a.timings,
                smoke=SmokeCount(passed=a.smoke.passed, total=a.smoke.total) if a.smoke else None,
                restore=a.restore,
                bench=a.bench,
                gates=a.gates,
                spec_hash=a.spec_hash,
                log=f"{runs_dir}/{report.run_id}/{a.log_file}" if a.log_file else None,
            )
            for a in report.attempts
        ]
        outcomes = [r.outcome for r in report.restores]
        restore = "failed" if "failed" in outcomes else ("restored" if outcomes else "not_needed")
        return cls(
            run_id=report.run_id,
            experiment=report.experiment,
            host=report.host,
            status=report.status,
            exit_code=exit_code,
            attempts=attempts,
            restore=RestoreSummary(outcome=restore, restores=report.restores),
            final=report.final,
            attribution=report.attribution,
            report=f"{runs_dir}/{report.run_id}/report.json",
        )


class ServerState(BaseModel):
    """The server campaign started on a host, as its record there says, and whether its group still lives."""

    pid: int
    pgid: int
    port: int
    remote_dir: str
    log_path: str
    #: Seconds since the epoch (the host's clock).
    started_at: float
    spec_hash: str
    variant: str
    run_id: str
    attempt: int
    #: The CAMPAIGN_TREE token of the launch ("" in records written before tokens).
    token: str = ""
    #: The experiment that launched it, and the workdir it ran under.
    experiment: str = ""
    workdir: str = ""
    #: On a Slurm host: its batch job's id and name, the node it runs on and that node's address ("" elsewhere).
    job_id: str = ""
    job_name: str = ""
    node: str = ""
    node_addr: str = ""
    #: "" when read from current.json; else why it was found in the process table by its token instead.
    recovered: str = ""
    #: True while a process of its tree (the group leader or a descendant) lives.
    alive: bool
    #: How many processes its tree holds now.
    processes: int = 0
    uptime_s: float
    #: True when it belongs to another experiment than the one `status` was asked about.
    other_experiment: bool = False


class KnownGoodRef(BaseModel):
    """Where a host's known-good was proven (the spec itself stays in the store: it holds secrets)."""

    variant: str
    spec_hash: str
    run_id: str
    attempt: int
    proven_at: str


class LockHolder(BaseModel):
    """Who holds a host's lock (its owner.json), and whether its CLI is known to be gone."""

    user: str | None = None
    machine: str | None = None
    pid: int | None = None
    command: str | None = None
    run_id: str | None = None
    experiment: str | None = None
    since: str | None = None
    #: Its CLI ran on this machine and its PID is gone: the next run, restore or stop takes it over.
    stale: bool = False
    #: One line naming the holder, as a refusal says it.
    text: str = ""


class ProcessRef(BaseModel):
    """A live process on a host: its PID and command line."""

    pid: int
    command: str


class HostStatus(BaseModel):
    """`campaign status`: what runs on the experiment's host now, its health, its lock, and its known-good."""

    host: str
    #: The experiment `status` was asked about (its known-good is the one shown).
    experiment: str | None = None
    running: ServerState | None = None
    #: The health endpoint's HTTP status, or None when nothing answered (or nothing runs).
    health: int | None = None
    lock: LockHolder | None = None
    #: Processes campaign started (they carry a CAMPAIGN_TREE token) that the host's record does not track.
    untracked: list[ProcessRef] = Field(default_factory=list)
    #: Runs whose CLI died, recorded ``interrupted`` by this look.
    reconciled: list[str] = Field(default_factory=list)
    known_good: KnownGoodRef | None = None


class StopReport(BaseModel):
    """`campaign stop --json` (one per host): what a stop did and found (``ServerControl.stop`` returns it)."""

    model_config = ConfigDict(frozen=True)

    stopped: bool
    clean: bool
    killed: bool
    seconds: float
    detail: str
    #: PIDs of the tree that were signalled (the group leader and every descendant found).
    pids: tuple[int, ...] = ()
    #: A process campaign did not start that holds the stopped server's port (left alone), if any.
    foreign: str | None = None


class RunRow(BaseModel):
    """`campaign runs --json` (a list of them): one stored run, as the store's index lists it."""

    model_config = ConfigDict(frozen=True)

    run_id: str
    experiment: str
    host: str
    recipe: str
    started_at: str
    ended_at: str | None
    status: str
    attempts: int
    passed: int
    failed: int
    final_variant: str | None


class FailureGroup(BaseModel):
    """`campaign runs --failures --json` (a list of them): failures that share a fingerprint, the same cause again."""

    model_config = ConfigDict(frozen=True)

    fingerprint: str
    kind: str
    count: int
    first_seen: str
    last_seen: str
    variants: list[str]
    runs: list[str]


class Healing(BaseModel):
    """`campaign doctor --json`: what ``Store.heal`` did: an index rebuilt (and why), rows pruned."""

    #: Why the index was rebuilt (``asked``, ``missing``, ``empty``, ``unreadable (...)``), or None when it was not.
    rebuilt: str | None = None
    reports: int = 0
    known_goods: int = 0
    #: Where a corrupt index was moved aside, if one was.
    moved_aside: str | None = None
    #: Runs whose folder is gone, their rows pruned from the index.
    pruned: list[str] = Field(default_factory=list)
    #: Run folders whose report.json could not be read (left out of the index).
    unreadable: list[str] = Field(default_factory=list)


class ErrorDocument(BaseModel):
    """Any command's ``--json`` document when an error ended it (its prose went to stderr)."""

    error: str
    #: The error's class in ``campaign.errors`` (``ConfigError``, ``LockHeld``, ...).
    kind: str
    hint: str | None
    exit_code: int
    #: A refused lock (``LockHeld``): who holds it.
    holder: str | None = None
    #: A config error (``ConfigError``): the file, line and field it names, where known.
    file: str | None = None
    line: int | None = None
    field: str | None = None
