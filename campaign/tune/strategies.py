"""How a tune picks its next configuration: ``tiered``, ``bayes`` (Optuna) or ``grid``.

Each strategy sees the search's ``State`` (the space, the trials so far, the constraints learnt, the noise) and
proposes one untried configuration that holds no learnt failing value, or None when it has nothing left.

- ``tiered`` (SGLang's auto-benchmark shape): one factor at a time from the baseline, then combinations ranked by an
  additive model of the single-factor gains (the winners first), then the rest of the space by the same model.
- ``bayes``: Optuna's TPE sampler (multivariate, grouped for conditional knobs) over the space's values, its study
  kept in a journal file in the tune's run folder so ``--resume`` continues the same study. A proposal that was
  already tried is told its known result and asked again; one holding a learnt failing value is told as failed.
- ``grid``: every configuration in the space's order.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from campaign.records.tune import Constraint, TrialRecord
from campaign.tune.space import Config, Space, key

#: How often ``bayes`` asks its sampler again before it takes an untried configuration at random instead.
_MAX_ASKS = 200
#: Trials the TPE sampler draws at random before it models the objective (the baseline's two launches count).
STARTUP_TRIALS = 3


@dataclass
class State:
    """What a strategy decides from: the space, every trial, the constraints learnt, the noise, the direction."""

    space: Space
    trials: list[TrialRecord] = field(default_factory=list)
    constraints: list[Constraint] = field(default_factory=list)
    noise: float = 0.0
    higher_is_better: bool = True

    def tried(self, config: Config) -> bool:
        """Whether a finished trial (passed, failed or rejected) already ran ``config``."""
        k = key(config)
        return any(key(t.config) == k for t in self.trials if t.outcome != "interrupted")

    def blocked(self, config: Config) -> Constraint | None:
        """The learnt constraint ``config`` holds, if any."""
        for c in self.constraints:
            if all(config.get(k) == v and type(config.get(k)) is type(v) for k, v in c.knobs.items()):
                return c
        return None

    def open(self, config: Config) -> bool:
        """Untried and holding no learnt failing value."""
        return not self.tried(config) and self.blocked(config) is None

    def score(self, value: float) -> float:
        """The objective in the maximising direction."""
        return value if self.higher_is_better else -value

    def baseline_objective(self) -> float | None:
        """The baseline's objective (the mean of its passed launches)."""
        vals = [
            t.objective
            for t in self.trials
            if key(t.config) == key(self.space.baseline) and t.outcome == "passed" and t.objective is not None
        ]
        return sum(vals) / len(vals) if vals else None


class Strategy(Protocol):
    """A way to pick the next configuration."""

    name: str

    def propose(self, state: State) -> tuple[Config, str] | None:
        """The next configuration and the stage it belongs to; None when nothing is left to try."""
        ...

    def observe(self, state: State, trial: TrialRecord) -> None:
        """Learn from a finished trial."""
        ...


class Grid:
    """Every configuration in the space's order."""

    name = "grid"

    def propose(self, state: State) -> tuple[Config, str] | None:
        """The first open configuration."""
        return next(((c, "grid") for c in state.space.points() if state.open(c)), None)

    def observe(self, state: State, trial: TrialRecord) -> None:
        """Nothing to learn: the order is fixed."""


def _single_factor(space: Space) -> Iterable[Config]:
    """Each knob's other values, one at a time from the baseline (a conditional knob with its condition set)."""
    base = space.baseline
    for name, values in space.knobs.items():
        for v in values:
            cfg = space.normalise({**base, **space.when[name], name: v})
            if cfg != base:
                yield cfg


class Tiered:
    """One factor at a time from the baseline, then the combinations an additive model of those gains ranks first."""

    name = "tiered"

    def propose(self, state: State) -> tuple[Config, str] | None:
        """The next single-factor change; after them, the open configuration with the best predicted gain."""
        for cfg in _single_factor(state.space):
            if state.open(cfg):
                return cfg, "one-factor"
        gains = self._gains(state)
        best: tuple[float, int, Config] | None = None
        incumbent = self._incumbent(state)
        for cfg in state.space.points():
            if not state.open(cfg):
                continue
            predicted = sum(gains.get((k, repr(v)), 0.0) for k, v in cfg.items() if v != state.space.baseline.get(k))
            moves = sum(1 for k, v in cfg.items() if incumbent.get(k) != v)
            cand = (predicted, -moves, cfg)
            if best is None or cand[:2] > best[:2]:
                best = cand
        if best is None:
            return None
        cfg = best[2]
        winners = all(gains.get((k, repr(v)), 0.0) > 0 for k, v in cfg.items() if v != state.space.baseline.get(k))
        return cfg, "combination" if winners else "neighbourhood"

    def _gains(self, state: State) -> dict[tuple[str, str], float]:
        """Each single-factor value's log gain over the baseline, in the maximising direction (0 within noise)."""
        base = state.baseline_objective()
        base_cfg = state.space.baseline
        out: dict[tuple[str, str], float] = {}
        if base is None or base == 0:
            return out
        for t in state.trials:
            changed = [k for k, v in t.config.items() if base_cfg.get(k) != v]
            if len(changed) != 1 and not (len(changed) > 1 and t.stage == "one-factor"):
                continue
            k = next(iter(c for c in changed if not state.space.when[c]), changed[0]) if changed else None
            if k is None:
                continue
            if t.outcome != "passed" or t.objective is None or t.objective <= 0:
                out[(k, repr(t.config[k]))] = -math.inf if t.outcome == "failed" else -1.0
                continue
            gain = math.log(t.objective / base) * (1 if state.higher_is_better else -1)
            out[(k, repr(t.config[k]))] = gain if abs(gain) > math.log1p(state.noise) else 0.0
        return out

    def _incumbent(self, state: State) -> Config:
        ok = [t for t in state.trials if t.outcome == "passed" and t.objective is not None]
        if not ok:
            return state.space.baseline
        return max(ok, key=lambda t: state.score(t.objective or 0.0)).config

    def observe(self, state: State, trial: TrialRecord) -> None:
        """Nothing kept: the ranking is recomputed from the trials."""


class Bayes:
    """Optuna's TPE sampler over the space, its study in a journal file (resumable)."""

    name = "bayes"

    def __init__(self, journal: Path, *, seed: int, higher_is_better: bool, study_name: str = "tune") -> None:
        import optuna
        from optuna.storages import JournalStorage
        from optuna.storages.journal import JournalFileBackend

        optuna.logging.set_verbosity(optuna.logging.WARNING)
        self._optuna = optuna
        storage = JournalStorage(JournalFileBackend(str(journal)))
        # Independent TPE with three random start-up trials: on the landscape (scripts/bench_tune.py) it reached the
        # optimum in 10 of 10 seeds within 16 trials; multivariate TPE with four reached it in 3 of 10.
        sampler = optuna.samplers.TPESampler(
            seed=seed, n_startup_trials=STARTUP_TRIALS, multivariate=False, group=False
        )
        self.study = optuna.create_study(
            study_name=study_name,
            storage=storage,
            sampler=sampler,
            direction="maximize" if higher_is_better else "minimize",
            load_if_exists=True,
        )
        # A trial asked and never told: its CLI died (or was interrupted) while it ran. It is told as failed so the
        # sampler moves on; the tune's own record decides whether that configuration counts as tried.
        for t in self.study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
            self.study.tell(t.number, state=optuna.trial.TrialState.FAIL)
        self._rng = random.Random(seed)
        self._pending: dict[tuple[tuple[str, str], ...], int] = {}

    def _distributions(self, state: State) -> dict[str, object]:
        return {
            name: self._optuna.distributions.CategoricalDistribution(values)
            for name, values in state.space.knobs.items()
        }

    def _suggest(self, trial: object, state: State) -> Config:
        from optuna.trial import Trial

        assert isinstance(trial, Trial)
        cfg: Config = {}
        space = state.space
        for name in (k for k in space.knobs if not space.when[k]):
            cfg[name] = trial.suggest_categorical(name, space.knobs[name])
        for name in (k for k in space.knobs if space.when[k]):
            if space.applies(name, cfg):
                cfg[name] = trial.suggest_categorical(name, space.knobs[name])
        return space.normalise(cfg)

    def propose(self, state: State) -> tuple[Config, str] | None:
        """Ask the sampler until it names an open configuration; at random among the open ones after many asks."""
        fail = self._optuna.trial.TrialState.FAIL
        for _ in range(_MAX_ASKS):
            trial = self.study.ask()
            cfg = self._suggest(trial, state)
            if state.open(cfg):
                self._pending[key(cfg)] = trial.number
                return cfg, "bayes"
            done = [t for t in state.trials if key(t.config) == key(cfg) and t.objective is not None]
            if done and state.blocked(cfg) is None and done[-1].outcome == "passed":
                self.study.tell(trial, done[-1].objective)
            else:
                self.study.tell(trial, state=fail)
        rest = [c for c in state.space.points() if state.open(c)]
        if not rest:
            return None
        return self._rng.choice(rest), "random"

    def observe(self, state: State, trial: TrialRecord) -> None:
        """Tell the sampler the trial's objective (failed or rejected: a failed Optuna trial)."""
        number = self._pending.pop(key(trial.config), None)
        ok = trial.outcome == "passed" and trial.objective is not None
        if number is not None:
            if ok:
                self.study.tell(number, trial.objective)
            else:
                self.study.tell(number, state=self._optuna.trial.TrialState.FAIL)
            return
        # A trial the sampler did not ask for (the baseline, an isolation run): added to the study as observed.
        params = {k: v for k, v in trial.config.items() if v is not None}
        dists = self._distributions(state)
        self.study.add_trial(
            self._optuna.trial.create_trial(
                params=params,
                distributions={k: dists[k] for k in params},  # type: ignore[misc]
                value=trial.objective if ok else None,
                state=self._optuna.trial.TrialState.COMPLETE if ok else self._optuna.trial.TrialState.FAIL,
            )
        )


def make_strategy(name: str, *, journal: Path | None, seed: int, higher_is_better: bool) -> Strategy:
    """The strategy called ``name`` (``bayes`` keeps its study in ``journal``)."""
    if name == "grid":
        return Grid()
    if name == "tiered":
        return Tiered()
    if name == "bayes":
        if journal is None:
            raise ValueError("bayes needs a journal file for its study")
        return Bayes(journal, seed=seed, higher_is_better=higher_is_better)
    raise ValueError(f"unknown strategy {name!r}: tiered, bayes or grid")
