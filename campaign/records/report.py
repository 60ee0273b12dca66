"""Run records: launch specs, attempts, diagnoses, restores, the environment and the run report.

``RunReport`` is ``runs/<run-id>/report.json``; its bench and attribution parts are typed by
``campaign.records.benchmark`` and ``campaign.records.findings``.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from campaign.records.benchmark import BenchResult
from campaign.records.findings import Finding
from campaign.records.knobs import KnobValue
from campaign.records.profile import ProfileResult

#: The layout of report.json; the history of its versions is in ``campaign.records``.
SCHEMA_VERSION = 1

#: ``interrupted``: the attempt in flight when a signal came or its CLI died.
Outcome = Literal["passed", "failed", "skipped", "interrupted"]
Role = Literal["variant", "isolation", "restore", "relaunch"]


class LaunchSpec(BaseModel):
    """The fully rendered, hashable thing that is launched. Two equal specs launch the same server."""

    recipe: str
    command: list[str]
    env: dict[str, str] = Field(default_factory=dict)
    workdir: str | None = None
    port: int
    ready_marker: str
    health_path: str
    #: phase name -> regex; the order is the expected order of a healthy start.
    phases: dict[str, str] = Field(default_factory=dict)

    def spec_hash(self) -> str:
        """A stable short hash of everything that changes what runs (secrets included, never shown)."""
        blob = json.dumps(
            {"command": self.command, "env": self.env, "workdir": self.workdir, "port": self.port},
            sort_keys=True,
        )
        return hashlib.sha256(blob.encode()).hexdigest()[:16]


class Evidence(BaseModel):
    """One log line that supports a diagnosis; ``line`` is 1-based in the attempt's log (0: not a log line, e.g. a
    bench client's error sample for ``bench_errors``)."""

    line: int
    text: str


class Diagnosis(BaseModel):
    """Why an attempt failed (or ``healthy``): the root cause, the lines that show it, and the next step."""

    kind: str
    evidence: list[Evidence] = Field(default_factory=list)
    hint: str = ""
    confidence: float = 0.0
    #: Normalised hash of the evidence so the same failure is recognised across runs.
    fingerprint: str | None = None
    summary: str = ""


class PhaseMark(BaseModel):
    """A startup phase seen in the log: when (seconds after launch) and on which line."""

    name: str
    at_s: float
    line: int | None = None


SmokeVerdict = Literal["right", "wrong", "cut", "no_answer", "error"]


class SmokeCheck(BaseModel):
    """One question with a known answer, and what the server replied."""

    question: str
    expected: int
    reply: str | None = None
    #: The server's separate chain of thought (``reasoning_content``), when it sent one.
    reasoning: str | None = None
    got: int | float | None = None
    passed: bool = False
    #: right, wrong, cut (at max_tokens before an answer), no_answer (no number in the reply) or error (HTTP).
    verdict: SmokeVerdict | None = None
    finish_reason: str | None = None
    error: str | None = None
    latency_s: float | None = None
    #: ``sequential`` (asked alone) or ``burst`` (sent at once with ``batch - 1`` others).
    phase: Literal["sequential", "burst"] = "sequential"
    batch: int = 1
    #: The reply's tokens and their log-probabilities as the server reported them (sequential checks only).
    tokens: list[str] | None = None
    logprobs: list[float] | None = None
    top_logprobs: list[dict[str, float]] | None = None


class SmokeComparison(BaseModel):
    """One check of this attempt's smoke outputs against the known-good's: a measured value and its limit."""

    #: ``agreement``: share of greedy tokens equal to the known-good's (at least ``limit``);
    #: ``logprobs``: largest relative log-probability difference of the answer tokens and their alternatives, at
    #: most ``limit`` (``campaign.golden``).
    name: Literal["agreement", "logprobs"]
    value: float
    limit: float
    passed: bool
    #: Replies (agreement) or token log-probabilities (logprobs) compared.
    compared: int
    #: The known-good attempt compared with: "run <id> attempt <n> (<variant>)".
    reference: str
    #: Where it differs most, e.g. "'What is 17×23?' token 2: known-good '9' -12.1, this attempt '9' -6.8".
    detail: str = ""


class SmokeResult(BaseModel):
    """All smoke checks of an attempt, and the comparisons with the known-good's outputs."""

    checks: list[SmokeCheck] = Field(default_factory=list)
    #: ``answers``: every answer must be exact; ``golden``: the greedy outputs must agree with the known-good's.
    mode: Literal["answers", "golden"] = "answers"
    api: Literal["chat", "completions"] = "chat"
    model: str | None = None
    #: Whether the server took ``chat_template_kwargs: {enable_thinking: false}`` (None: not sent).
    reasoning_off: bool | None = None
    agreement: SmokeComparison | None = None
    logprobs: SmokeComparison | None = None
    notes: list[str] = Field(default_factory=list)

    @property
    def passed(self) -> int:
        """How many checks gave the right answer."""
        return sum(1 for c in self.checks if c.passed)

    @property
    def total(self) -> int:
        """How many checks were asked."""
        return len(self.checks)

    def failed_checks(self) -> list[SmokeCheck]:
        """The checks that fail the attempt: all that are not right (answers mode), or those with no reply (golden)."""
        if self.mode == "golden":
            return [c for c in self.checks if c.verdict == "error" or (c.verdict is None and c.error is not None)]
        return [c for c in self.checks if not c.passed]

    @property
    def ok(self) -> bool:
        """True when there was at least one check, none failed, and every comparison made passed."""
        comparisons = [c for c in (self.agreement, self.logprobs) if c is not None]
        return self.total > 0 and not self.failed_checks() and all(c.passed for c in comparisons)

    def summary(self) -> str:
        """One line: answers right, what went wrong first, and each comparison made."""
        parts = [f"{self.passed}/{self.total} answers right"]
        failed = self.failed_checks()
        cut = [c for c in failed if c.verdict == "cut"]
        if cut:
            parts.append(f"{len(cut)} cut at max_tokens before an answer")
        first = next((c for c in failed if c.verdict != "cut"), None)
        if first is not None:
            where = f" (burst of {first.batch})" if first.phase == "burst" else ""
            if first.error is not None and first.verdict in (None, "error"):
                parts.append(f"asked {first.question!r}{where}: {first.error}")
            else:
                parts.append(f"asked {first.question!r}{where}, expected {first.expected}, got {first.reply!r}")
        for comp in (self.agreement, self.logprobs):
            if comp is None:
                continue
            rel = ">=" if comp.name == "agreement" else "<="
            verdict = "ok" if comp.passed else "FAILED"
            line = f"{comp.name} {comp.value:.4g} (needs {rel} {comp.limit:g}) {verdict}"
            parts.append(line + (f": {comp.detail}" if comp.detail and not comp.passed else ""))
        return "; ".join(parts)


class Timings(BaseModel):
    """Durations of an attempt, in seconds; None where the step did not run."""

    stop_s: float | None = None
    launch_to_ready_s: float | None = None
    #: From the moment the ready line was written to the log to the moment campaign saw readiness.
    ready_detect_lag_s: float | None = None
    #: From the server's exit (dated by the exit_code file its launch script wrote) to campaign noticing it.
    death_detect_lag_s: float | None = None
    smoke_s: float | None = None
    bench_s: float | None = None
    #: The whole attempt, stop to stored log (what a plan's ETA is made of).
    attempt_s: float | None = None


class GateResult(BaseModel):
    """One bench gate checked against a measurement."""

    name: str
    passed: bool
    detail: str


class Restore(BaseModel):
    """What happened after a failure: the known-good relaunched (or woken) and proven, or not."""

    outcome: Literal["not_needed", "restored", "failed"] = "not_needed"
    variant: str | None = None
    spec_hash: str | None = None
    attempt: int | None = None
    detail: str | None = None
    #: Launch to ready of this restore, and of the cold start that first proved the known-good (what it saved).
    ready_s: float | None = None
    cold_start_ready_s: float | None = None
    #: How the known-good came back: ``relaunch`` (a cold start of its spec) or ``wake`` (a parked server woken,
    #: ``campaign.parking``); None in reports written before restores said so, and when nothing came back.
    mode: Literal["wake", "relaunch"] | None = None
    #: The restore's parts in seconds, in order (a relaunch: ``stop_s``, ``launch_to_ready_s``, ``smoke_s``).
    phases: dict[str, float | None] = Field(default_factory=dict)


class Attempt(BaseModel):
    """One launch of one variant: its phases, timings, outcome, smoke, bench, diagnosis."""

    index: int
    variant: str
    role: Role = "variant"
    #: The host it ran on (``Host.name``: what its lock and known-good are named by); None in older reports.
    host: str | None = None
    #: Which launch of its variant this is: 0, then 1, 2, ... for the ``relaunch`` attempts of ``bench.launches``.
    launch: int = 0
    knobs: dict[str, KnobValue] = Field(default_factory=dict)
    spec: LaunchSpec
    spec_hash: str = ""
    outcome: Outcome = "skipped"
    failed_phase: str | None = None
    phases: list[PhaseMark] = Field(default_factory=list)
    pid: int | None = None
    pgid: int | None = None
    exit_code: int | None = None
    started_at: str | None = None
    ended_at: str | None = None
    timings: Timings = Field(default_factory=Timings)
    smoke: SmokeResult | None = None
    #: What the bench measured, when the experiment benches.
    bench: BenchResult | None = None
    gates: list[GateResult] = Field(default_factory=list)
    #: Where one bench level's time went, when the experiment profiles (``campaign.profile``).
    profile: ProfileResult | None = None
    diagnosis: Diagnosis | None = None
    #: Path of the log copy inside the run folder, relative to it.
    log_file: str | None = None
    #: Where the attempt ran on the host (the per-attempt folder).
    remote_dir: str | None = None
    #: For a failed attempt: how the box was put back on its known-good afterwards.
    restore: Restore | None = None
    note: str | None = None
    #: For a retry of a transient failure: the index of the attempt it retries.
    retry_of: int | None = None
    #: For a variant skipped as a known failure: the stored attempt that failed the same way (``RUN#INDEX``).
    known_failure: str | None = None


class Final(BaseModel):
    """What the host runs when the run ends."""

    variant: str | None = None
    spec_hash: str | None = None
    healthy: bool = False
    detail: str | None = None


class Environment(BaseModel):
    """Host facts that make runs comparable; the recipe's probes (``server_version``, ``kernel_hash``, ...) are
    extra fields, one per probe, None when a probe gave nothing. Empty (every field None) until the run gathers it."""

    model_config = ConfigDict(extra="allow")

    host: str | None = None
    os: str | None = None
    python: str | None = None
    gpu: str | None = None
    driver: str | None = None
    campaign_version: str | None = None
    #: The git commit campaign ran from (``-dirty`` appended when tracked files differed from it); None when it was
    #: installed without git, and in reports written before it was recorded.
    campaign_commit: str | None = None
    recipe: str | None = None
    #: The host's clock minus ours, in seconds (readiness lags are corrected by it).
    clock_offset_s: float | None = None

    @property
    def probes(self) -> dict[str, str | None]:
        """The recipe's probe results, by probe name."""
        return {k: (None if v is None else str(v)) for k, v in (self.model_extra or {}).items()}


class Resume(BaseModel):
    """One `campaign run --resume` of this run: when, from which status, and what the box held then."""

    at: str
    from_status: str
    found: str
    #: Variants that still had to run then.
    remaining: list[str] = Field(default_factory=list)


RunStatus = Literal["running", "passed", "failed", "restore_failed", "aborted", "interrupted"]


class HostRun(BaseModel):
    """One host's share of a fleet run: how its loop ended and what it left running there."""

    host: str
    status: RunStatus = "running"
    final: Final = Field(default_factory=Final)
    environment: Environment = Field(default_factory=Environment)
    #: The attempt that proved the baseline on this host; None: not proven, so no variant was judged there.
    baseline_attempt: int | None = None
    #: Why this host ran no variant, or stopped before the queue was empty (a lock held, a baseline that failed).
    note: str | None = None
    signal: str | None = None
    lock_taken_over: dict[str, Any] | None = None
    ended_early: str | None = None


class RunReport(BaseModel):
    """Everything one run did; written to ``runs/<run-id>/report.json`` after every attempt."""

    schema_version: int = SCHEMA_VERSION
    run_id: str
    experiment: str
    config_path: str | None = None
    host: str
    recipe: str
    started_at: str
    ended_at: str | None = None
    #: ``interrupted``: a signal (see ``signal``) or the death of the CLI ended the run; ``final`` says what was left.
    status: RunStatus = "running"
    attempts: list[Attempt] = Field(default_factory=list)
    #: One entry per failed attempt: {"attempt": index, "outcome": ...}
    restores: list[Restore] = Field(default_factory=list)
    final: Final = Field(default_factory=Final)
    attribution: list[Finding] = Field(default_factory=list)
    environment: Environment = Field(default_factory=Environment)
    #: The signal that interrupted the run (``SIGINT``, ``SIGTERM``, ``SIGHUP``), if one did.
    signal: str | None = None
    #: The host lock's previous holder when this run took it over (``how``: ``stale`` or ``forced`` by --force).
    lock_taken_over: dict[str, Any] | None = None
    #: Each time the run was resumed after an interruption or a failure.
    resumes: list[Resume] = Field(default_factory=list)
    #: Why the run stopped before its last variant (the ``deadline``), with the variants it left unrun.
    ended_early: str | None = None
    not_run: list[str] = Field(default_factory=list)
    #: A fleet run (``campaign.fleet``): each host's part, in the order of the experiment's ``hosts``; empty for a
    #: run on one host. ``host`` then names them all, ``environment`` is the first host's, and each attempt's
    #: ``host`` says where it ran.
    hosts: list[HostRun] = Field(default_factory=list)
