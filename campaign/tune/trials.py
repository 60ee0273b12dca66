"""A trial through the real loop: one configuration run as a run of its own (stop, launch, ready, smoke, bench).

Each trial is ``Campaign.run`` over the experiment with its baseline's knobs and the trial's configuration as the
one variant (the baseline itself for the baseline's trials): the host's lock, the flags check, the launch, readiness,
smoke and bench, diagnosis and restore on a failure, transient failures retried by class (``retry:``), every attempt
in the run store. A trial that passes becomes the known-good while the search runs (a failure is restored to the
last configuration that passed); the end of the tune (``campaign.tune.finale``) decides what stays.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from campaign.config import Loaded, VariantConfig
from campaign.gates import check_gates
from campaign.hosts.base import Host
from campaign.pipeline import Campaign, EventSink
from campaign.records import Attempt, KnobValue, RunReport, show_value
from campaign.records.tune import TrialRecord
from campaign.retry import failure_class
from campaign.store import Store, now_iso
from campaign.tune.space import Config, Objective, SearchConfig


def variant_knobs(baseline: dict[str, KnobValue], config: Config) -> dict[str, KnobValue]:
    """The knobs a trial launches with: the baseline's, the configuration's over them (unset: left out)."""
    out = {k: v for k, v in baseline.items() if k not in config or config[k] is not None}
    out.update({k: v for k, v in config.items() if v is not None})
    return out


def trial_name(number: int, config: Config, baseline: Config) -> str:
    """``t03-attention=mma,max_batch=32``: the number and what differs from the baseline."""
    changed = [f"{k}={show_value(v)}" for k, v in config.items() if baseline.get(k) != v]
    text = ",".join(changed) or "baseline"
    return "".join(c if c.isalnum() or c in "._=,+-" else "_" for c in f"t{number:02d}-{text}")[:100]


def trial_loaded(loaded: Loaded, variants: list[VariantConfig], *, with_baseline: bool, launches: int) -> Loaded:
    """The experiment as one run of the tune runs it: these variants, ``launches`` launches, no deadline of its own."""
    exp = loaded.experiment
    bench = dict(exp.bench or {})
    bench["launches"] = launches
    experiment = exp.model_copy(
        update={
            "variants": variants,
            "matrix": None,
            "run_baseline": with_baseline,
            "isolate": False,
            "deadline": None,
            "bench": bench,
            "search": None,
        }
    )
    resolved = {**loaded.resolved, "variants": [v.model_dump(mode="json") for v in variants], "bench": bench}
    resolved.pop("matrix", None)
    resolved["run_baseline"] = with_baseline
    return Loaded(experiment, loaded.recipe, loaded.path, resolved)


def objective_of(att: Attempt, objective: Objective) -> tuple[float | None, float | None]:
    """The objective an attempt measured, and the median TTFT (ms) at the objective's level (None: not measured)."""
    bench = att.bench
    if bench is None:
        return None, None
    if objective.concurrency is None and objective.request_rate is None:
        return bench.sla_metric(objective.metric) if bench.sla is not None else None, None
    level = bench.level(concurrency=objective.concurrency, request_rate=objective.request_rate)
    if level is None:
        return None, None
    return level.metric(objective.metric), level.metric("ttft.median")


@dataclass
class LoopTrials:
    """The evaluator ``Search`` calls: each trial a ``Campaign`` run on ``host``, recorded in ``store``."""

    loaded: Loaded
    host: Host
    store: Store
    search: SearchConfig
    baseline: Config
    on_event: EventSink | None = None
    #: The run of the trial in flight and the last finished one (for the live display and the resume).
    last_run: RunReport | None = None

    def __call__(self, number: int, config: Config, stage: str) -> TrialRecord:
        """Run ``config`` through the loop; its record (objective, outcome, diagnosis, run id)."""
        exp = self.loaded.experiment
        is_base = stage in ("baseline", "noise")
        variants = (
            []
            if is_base
            else [
                VariantConfig(
                    name=trial_name(number, config, self.baseline), knobs=variant_knobs(exp.baseline.knobs, config)
                )
            ]
        )
        loaded = trial_loaded(self.loaded, variants, with_baseline=is_base, launches=1)
        started, t0 = now_iso(), time.monotonic()
        report = Campaign(loaded, self.host, self.store, on_event=self.on_event).run()
        self.last_run = report
        record = TrialRecord(
            number=number,
            config=config,
            outcome="failed",
            run_id=report.run_id,
            stage=stage,
            started_at=started,
            wall_s=round(time.monotonic() - t0, 3),
        )
        name = exp.baseline.name if is_base else variants[0].name
        att = next((a for a in reversed(report.attempts) if a.variant == name and a.role == "variant"), None)
        if report.status == "interrupted" or att is None or att.outcome in ("interrupted", "skipped"):
            record.outcome = "interrupted" if report.status == "interrupted" else "failed"
            record.reason = report.ended_early or (att.note if att is not None else "the trial did not run")
            return record
        if att.outcome != "passed":
            kind = att.diagnosis.kind if att.diagnosis is not None else "unknown"
            record.kind = kind
            record.failure_class = failure_class(kind, att.failed_phase)
            record.diagnosis = (att.diagnosis.summary or kind) if att.diagnosis is not None else att.note
            return record
        record.objective, record.latency_ms = objective_of(att, self.search.objective)
        problems: list[str] = []
        if self.search.smoke_exact and not (att.smoke is not None and att.smoke.ok):
            problems.append("smoke not exact" if att.smoke is not None else "no smoke ran")
        if att.bench is not None:
            problems += [g.detail for g in check_gates(att.bench, None, self.search.constraints) if not g.passed]
        if record.objective is None:
            problems.append(f"no {self.search.objective.label} measured")
        record.outcome = "rejected" if problems else "passed"
        record.reason = "; ".join(problems) or None
        return record
