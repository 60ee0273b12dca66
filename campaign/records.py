"""The records campaign writes: launch specs, attempts, diagnoses, restores and run reports.

These pydantic models are the schema of ``runs/<run-id>/report.json`` (``RunReport.schema_version``) and the
values the core returns. Pure modules (diagnose, attribution, compare) read and build them; only ``store``
writes them to disk.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Literal

from pydantic import BaseModel, Field

SCHEMA_VERSION = 1

KnobValue = str | int | float | bool | None
Outcome = Literal["passed", "failed", "skipped"]
Role = Literal["variant", "isolation", "restore"]


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
    """One log line that supports a diagnosis; ``line`` is 1-based in the attempt's log."""

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


class SmokeCheck(BaseModel):
    """One question with a known answer, and what the server replied."""

    question: str
    expected: int
    reply: str | None = None
    got: int | None = None
    passed: bool = False
    error: str | None = None
    latency_s: float | None = None


class SmokeResult(BaseModel):
    """All smoke checks of an attempt."""

    checks: list[SmokeCheck] = Field(default_factory=list)

    @property
    def passed(self) -> int:
        """How many checks gave the right answer."""
        return sum(1 for c in self.checks if c.passed)

    @property
    def total(self) -> int:
        """How many checks were asked."""
        return len(self.checks)

    @property
    def ok(self) -> bool:
        """True when every check passed (and there was at least one)."""
        return self.total > 0 and self.passed == self.total


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


class GateResult(BaseModel):
    """One bench gate checked against a measurement."""

    name: str
    passed: bool
    detail: str


class Restore(BaseModel):
    """What happened after a failure: the known-good relaunched and proven, or not."""

    outcome: Literal["not_needed", "restored", "failed"] = "not_needed"
    variant: str | None = None
    spec_hash: str | None = None
    attempt: int | None = None
    detail: str | None = None


class Attempt(BaseModel):
    """One launch of one variant: its phases, timings, outcome, smoke, bench, diagnosis."""

    index: int
    variant: str
    role: Role = "variant"
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
    #: ``campaign.bench.BenchResult.model_dump()`` when the experiment benches.
    bench: dict[str, Any] | None = None
    gates: list[GateResult] = Field(default_factory=list)
    diagnosis: Diagnosis | None = None
    #: Path of the log copy inside the run folder, relative to it.
    log_file: str | None = None
    #: Where the attempt ran on the host (the per-attempt folder).
    remote_dir: str | None = None
    #: For a failed attempt: how the box was put back on its known-good afterwards.
    restore: Restore | None = None
    note: str | None = None


class Final(BaseModel):
    """What the host runs when the run ends."""

    variant: str | None = None
    spec_hash: str | None = None
    healthy: bool = False
    detail: str | None = None


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
    status: Literal["running", "passed", "failed", "restore_failed", "aborted"] = "running"
    attempts: list[Attempt] = Field(default_factory=list)
    #: One entry per failed attempt: {"attempt": index, "outcome": ...}
    restores: list[Restore] = Field(default_factory=list)
    final: Final = Field(default_factory=Final)
    attribution: list[dict[str, Any]] = Field(default_factory=list)
    environment: dict[str, Any] = Field(default_factory=dict)
