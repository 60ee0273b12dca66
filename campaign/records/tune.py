"""What a tune stores and returns: its trials, the constraints it learnt, the final comparison, the verdict.

``TuneReport`` is written as ``runs/<tune-id>/tune.json`` beside the Optuna journal; each trial is a run of its own
in the store (``TrialRecord.run_id``), so ``campaign show`` and ``compare`` read every trial like any run.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from campaign.records.knobs import KnobValue

TrialOutcome = Literal["passed", "failed", "rejected", "interrupted"]


class TrialRecord(BaseModel):
    """One configuration tried: what it set, what it measured, and why it failed when it did."""

    number: int
    config: dict[str, KnobValue]
    #: ``passed`` (smoke exact, every constraint met), ``rejected`` (it ran but broke a constraint or its smoke was
    #: not exact), ``failed`` (it did not come up or serve), ``interrupted`` (cut short by a signal).
    outcome: TrialOutcome
    objective: float | None = None
    #: The latency the throughput-latency front is drawn with (the objective level's median TTFT, ms).
    latency_ms: float | None = None
    #: The failure kind the diagnosis named, and whether retrying could help (``campaign.retry``).
    kind: str | None = None
    failure_class: Literal["transient", "deterministic"] | None = None
    diagnosis: str | None = None
    #: Broken constraints or an inexact smoke, for a ``rejected`` trial.
    reason: str | None = None
    run_id: str | None = None
    stage: str = ""
    wall_s: float = 0.0
    started_at: str | None = None


class Constraint(BaseModel):
    """A knob assignment learnt to fail deterministically: nothing that holds it is tried again."""

    knobs: dict[str, KnobValue]
    kind: str
    #: The trials whose failures it explains.
    trials: list[int] = Field(default_factory=list)
    #: The trial after which it was learnt: no later trial holds it.
    learnt_at: int = 0
    statement: str = ""


class KnobEffect(BaseModel):
    """One knob value's measured effect: the mean objective of the passed trials holding it, against the baseline."""

    knob: str
    value: KnobValue
    trials: int
    mean_objective: float | None = None
    ratio_to_baseline: float | None = None
    failed: int = 0


class FinalVerdict(BaseModel):
    """The end of a tune: the interleaved relaunches of the best candidates and the baseline, and what was kept."""

    run_id: str | None = None
    candidates: list[str] = Field(default_factory=list)
    launches: int = 0
    #: The candidate that became the known-good, or None (the baseline stays).
    promoted: str | None = None
    promoted_config: dict[str, KnobValue] | None = None
    #: Each candidate's comparison with the baseline on the objective: ratio, adjusted p, verdict.
    cells: dict[str, str] = Field(default_factory=dict)
    detail: str = ""
    #: The run that put the kept configuration back on the box and proved it (readiness + smoke).
    restore_run_id: str | None = None
    box_proven: bool = False


class TuneReport(BaseModel):
    """A tune: the experiment, the search, every trial, the constraints learnt, the effects, and the verdict."""

    tune_id: str
    experiment: str
    config_path: str = ""
    strategy: Literal["tiered", "bayes", "grid"]
    objective: str
    higher_is_better: bool = True
    space_size: int
    budget_trials: int | None = None
    budget_s: float | None = None
    started_at: str
    ended_at: str | None = None
    status: Literal["running", "finished", "interrupted", "aborted"] = "running"
    #: Why the search ended: budget, deadline, early stop, space exhausted.
    stopped_because: str | None = None
    baseline: dict[str, KnobValue] = Field(default_factory=dict)
    #: The relative spread of the baseline's launches: a gain under it is not an improvement.
    noise: float | None = None
    trials: list[TrialRecord] = Field(default_factory=list)
    constraints: list[Constraint] = Field(default_factory=list)
    effects: list[KnobEffect] = Field(default_factory=list)
    final: FinalVerdict | None = None
    plot_file: str | None = None
    resumes: int = 0

    def best(self) -> TrialRecord | None:
        """The passed trial with the best objective (None when none passed)."""
        ok = [t for t in self.trials if t.outcome == "passed" and t.objective is not None]
        if not ok:
            return None
        key = (lambda t: t.objective) if self.higher_is_better else (lambda t: -(t.objective or 0.0))
        return max(ok, key=key)
