"""The search loop of a tune: propose, check, evaluate, learn, stop; pure over an ``Evaluate`` callable.

``Search.run`` asks the strategy for a configuration, refuses it when it holds a learnt failing value or was already
tried, and does not start it when the trials so far say it would not end before the budget's time or the deadline.
The evaluator runs it (through the real loop in ``campaign.tune.trials``; a known function in the benchmark) and
returns a ``TrialRecord``. Then:

- the baseline is measured first, twice: the relative spread of its two launches is the noise, and a gain under it
  (or under ``min_gain``) is no improvement;
- a deterministic failure is explained by ``attribution.attribute`` over every trial: an ``explained`` finding's
  cause becomes a ``Constraint`` (nothing that holds it is tried again); an ambiguous one asks for the
  one-knob-back runs that would settle it (``settle_with``), which run next as ``isolation`` trials;
- transient failures (``campaign.retry``) were already retried by the loop; they teach nothing about the knobs;
- ``patience`` trials in a row with no improvement beyond the noise end the search (early stop).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

from campaign.attribution import attribute
from campaign.records import Attempt, Diagnosis, LaunchSpec, show_value
from campaign.records.tune import Constraint, KnobEffect, TrialRecord, TuneReport
from campaign.tune.space import Config, SearchConfig, Space, describe, key
from campaign.tune.strategies import State, Strategy

Evaluate = Callable[[int, Config, str], TrialRecord]

#: Isolation trials a single ambiguous failure may ask for.
_MAX_ISOLATION = 4


@dataclass(frozen=True)
class Progress:
    """Where a tune stands, for the live display: trial k of n, the best so far, the time left by estimate."""

    trial: TrialRecord
    done: int
    planned: int
    best: TrialRecord | None
    eta_s: float | None
    note: str = ""


def _placeholder_spec() -> LaunchSpec:
    return LaunchSpec(recipe="tune", command=[], port=0, ready_marker="", health_path="")


class Search:
    """One search over a space; ``report`` holds its state (a resumed report continues where it stopped)."""

    def __init__(
        self,
        search: SearchConfig,
        space: Space,
        strategy: Strategy,
        report: TuneReport,
        evaluate: Evaluate,
        *,
        ends_at: float | None = None,
        clock: Callable[[], float] = time.monotonic,
        on_progress: Callable[[Progress], None] | None = None,
    ) -> None:
        self.search = search
        self.space = space
        self.strategy = strategy
        self.report = report
        self.evaluate = evaluate
        self.ends_at = ends_at
        self.clock = clock
        self.on_progress = on_progress or (lambda _p: None)
        self.state = State(
            space=space,
            trials=report.trials,
            constraints=report.constraints,
            noise=report.noise or search.min_gain,
            higher_is_better=search.objective.higher_is_better,
        )
        self._isolation: list[Config] = []

    # -- the loop -----------------------------------------------------------------------------------------------

    def run(self) -> TuneReport:
        """Search until the budget, the deadline, an early stop or the space's end; returns the report."""
        report = self.report
        base = self.space.baseline
        while True:
            finished = [t for t in report.trials if t.outcome != "interrupted"]
            if self._over_budget(finished):
                break
            n_base = sum(1 for t in finished if key(t.config) == key(base))
            if n_base < 2 and not any(t.outcome != "passed" for t in finished if key(t.config) == key(base)):
                nxt: tuple[Config, str] = (base, "baseline" if n_base == 0 else "noise")
            elif n_base == 0 or self.state.baseline_objective() is None:
                report.stopped_because = "the baseline did not pass: there is nothing to improve on"
                break
            elif self._isolation:
                nxt = (self._isolation.pop(0), "isolation")
            else:
                if self._stale() >= self.search.patience:
                    report.stopped_because = (
                        f"early stop: {self._stale()} trials in a row brought no gain beyond the noise "
                        f"({100 * self.state.noise:.1f} %)"
                    )
                    break
                proposed = self.strategy.propose(self.state)
                if proposed is None:
                    report.stopped_because = "every configuration that may still pass was tried"
                    break
                nxt = proposed
            config, stage = nxt
            if stage not in ("baseline", "noise") and not self.state.open(config):
                continue  # a queued isolation run that another trial already made pointless
            if self._past_time(finished, describe(config)):
                break
            number = len(report.trials)
            trial = self.evaluate(number, config, stage)
            report.trials.append(trial)
            if trial.outcome == "interrupted":
                return report
            self._learn(trial)
            self.strategy.observe(self.state, trial)
            self.on_progress(self._progress(trial))
        report.effects = self.effects()
        return report

    def _over_budget(self, finished: list[TrialRecord]) -> bool:
        limit = self.search.budget.trials
        if limit is not None and len(finished) >= limit:
            self.report.stopped_because = f"budget: {limit} trials"
            return True
        return False

    def _past_time(self, finished: list[TrialRecord], what: str) -> bool:
        """True (and the reason recorded) when the next trial, at the mean cost so far, would end past the limit."""
        if self.ends_at is None:
            return False
        costs = [t.wall_s for t in finished if t.wall_s > 0]
        cost = sum(costs) / len(costs) if costs else 0.0
        left = self.ends_at - self.clock()
        if cost <= left:
            return False
        self.report.stopped_because = (
            f"deadline: a trial takes about {cost:.0f} s and {max(0.0, left):.0f} s are left; {what} not started"
        )
        return True

    def _stale(self) -> int:
        """Trials since the last improvement beyond the noise (the baseline's two launches not counted)."""
        best: float | None = None
        stale = 0
        for t in self.report.trials:
            if t.stage in ("baseline", "noise") or t.outcome == "interrupted":
                if t.outcome == "passed" and t.objective is not None and best is None:
                    best = self.state.score(t.objective)
                continue
            value = self.state.score(t.objective) if t.outcome == "passed" and t.objective is not None else None
            if value is not None and (best is None or _gain(value, best) > self.state.noise):
                best, stale = value, 0
            else:
                stale += 1
        return stale

    # -- learning from a trial -----------------------------------------------------------------------------------

    def _learn(self, trial: TrialRecord) -> None:
        report = self.report
        base = self.space.baseline
        if trial.stage == "noise" and report.noise is None:
            vals = [t.objective for t in report.trials if key(t.config) == key(base) and t.objective is not None]
            if len(vals) >= 2 and sum(vals) > 0:
                spread = (max(vals) - min(vals)) / (sum(vals) / len(vals))
                report.noise = round(spread, 4)
                self.state.noise = max(self.search.min_gain, spread)
        if trial.outcome != "failed" or trial.failure_class != "deterministic":
            return
        attempts = [
            Attempt(
                index=t.number,
                variant=f"trial-{t.number}",
                knobs=dict(t.config),
                spec=_placeholder_spec(),
                outcome="passed" if t.outcome in ("passed", "rejected") else "failed",
                diagnosis=Diagnosis(kind=t.kind or "unknown") if t.outcome == "failed" else None,
            )
            for t in report.trials
            if t.outcome in ("passed", "rejected") or (t.outcome == "failed" and t.failure_class == "deterministic")
        ]
        for finding in attribute(attempts, base, ignore=()):
            if finding.kind != trial.kind:
                continue
            if finding.status == "explained" and finding.cause:
                if any(c.knobs == finding.cause for c in report.constraints):
                    continue
                report.constraints.append(
                    Constraint(
                        knobs=dict(finding.cause),
                        kind=finding.kind,
                        trials=list(finding.failed),
                        learnt_at=trial.number,
                        statement=finding.statement,
                    )
                )
                self._isolation = [c for c in self._isolation if self.state.blocked(c) is None]
            else:
                asks = [self.space.normalise({**base, **s}) for s in finding.settle_with][:_MAX_ISOLATION]
                self._isolation += [c for c in asks if self.state.open(c) and c not in self._isolation]

    def effects(self) -> list[KnobEffect]:
        """Each knob value's mean objective over the passed trials holding it, against the baseline's."""
        base = self.state.baseline_objective()
        out: list[KnobEffect] = []
        for name, values in self.space.knobs.items():
            for v in values:
                holding = [t for t in self.report.trials if t.config.get(name) == v and t.outcome != "interrupted"]
                vals = [t.objective for t in holding if t.outcome == "passed" and t.objective is not None]
                mean = sum(vals) / len(vals) if vals else None
                out.append(
                    KnobEffect(
                        knob=name,
                        value=v,
                        trials=len(holding),
                        mean_objective=None if mean is None else round(mean, 4),
                        ratio_to_baseline=None if mean is None or not base else round(mean / base, 4),
                        failed=sum(1 for t in holding if t.outcome == "failed"),
                    )
                )
        return out

    def _progress(self, trial: TrialRecord) -> Progress:
        finished = [t for t in self.report.trials if t.outcome != "interrupted"]
        planned = self.search.budget.trials or self.report.space_size + 1
        costs = [t.wall_s for t in finished if t.wall_s > 0]
        eta = (sum(costs) / len(costs)) * max(0, planned - len(finished)) if costs else None
        if eta is not None and self.ends_at is not None:
            eta = min(eta, max(0.0, self.ends_at - self.clock()))
        note = ""
        if self.report.constraints and trial.outcome == "failed":
            note = "learnt: " + "; ".join(
                " and ".join(f"{k}={show_value(v)}" for k, v in c.knobs.items()) for c in self.report.constraints
            )
        return Progress(trial, len(finished), planned, self.report.best(), eta, note)


def _gain(value: float, best: float) -> float:
    """The relative gain of ``value`` over ``best`` (both in the maximising direction)."""
    if best == 0:
        return math.inf if value > 0 else 0.0
    return (value - best) / abs(best)
