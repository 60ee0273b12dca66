"""The ``search:`` block of an experiment: the knob space, the objective, the constraints and the budget.

Written in YAML::

    search:
      space:
        attention: [torch, simt, mma]                 # choices
        max_batch: {low: 8, high: 64, step: 8}        # a numeric range (step: the grid it is searched on)
        cuda_graph_max_bs: {choices: [8, 16], when: {cuda_graph: true}}   # applies only with another knob's value
      objective: {metric: output_throughput, concurrency: 32}   # or {metric: sla.max}: the highest load in SLO
      constraints: [{metric: ttft.p90, concurrency: 32, max: 500}]   # gates with absolute bounds (SLOs)
      smoke_exact: true
      budget: {trials: 16, time: 30m}
      patience: 6          # stop after this many trials without a gain beyond the noise
      final: {candidates: 2, launches: 3}

Every knob is searched over a finite set of values (a range with its ``step``), so the space can be counted, and
a grid search is well defined. A knob with ``when`` is set only in configurations that hold every assignment in
it; elsewhere it stays unset (the baseline's value, or the recipe's default).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator, Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from campaign.config import Loaded, duration_s, line_of
from campaign.config.parser import validate
from campaign.errors import ConfigError
from campaign.records import METRICS, SLA_METRICS, Gate, KnobValue, show_value

Config = dict[str, KnobValue]
#: More points than this is not a space to count or to grid over: narrow it, or raise a range's step.
MAX_POINTS = 100_000


class KnobSpace(BaseModel):
    """One knob's values: ``choices``, or a range ``low``..``high`` by ``step``; ``when``: where it applies."""

    model_config = ConfigDict(extra="forbid")

    choices: list[KnobValue] | None = None
    low: float | None = None
    high: float | None = None
    step: float | None = Field(default=None, gt=0)
    when: dict[str, KnobValue] = Field(default_factory=dict)

    @model_validator(mode="before")
    @classmethod
    def _bare_list(cls, v: Any) -> Any:
        return {"choices": v} if isinstance(v, list) else v

    @model_validator(mode="after")
    def _one_form(self) -> KnobSpace:
        ranged = (self.low, self.high, self.step)
        if self.choices is not None and any(x is not None for x in ranged):
            raise ValueError("give either choices or low/high/step, not both")
        if self.choices is None:
            if any(x is None for x in ranged):
                raise ValueError("a range needs low, high and step (the grid it is searched on)")
            assert self.low is not None and self.high is not None and self.step is not None
            if self.high < self.low:
                raise ValueError(f"high ({self.high:g}) is below low ({self.low:g})")
            if (self.high - self.low) / self.step > 10_000:
                raise ValueError("more than 10,000 values: raise the step")
        elif len(self.choices) < 1 or len({repr(c) for c in self.choices}) != len(self.choices):
            raise ValueError("choices must be a non-empty list of distinct values")
        return self

    def values(self) -> list[KnobValue]:
        """Every value the knob is searched over, in order."""
        if self.choices is not None:
            return list(self.choices)
        assert self.low is not None and self.high is not None and self.step is not None
        n = math.floor((self.high - self.low) / self.step + 1e-9) + 1
        integral = all(float(x).is_integer() for x in (self.low, self.step))
        out: list[KnobValue] = []
        for i in range(n):
            x = self.low + i * self.step
            out.append(round(x) if integral else round(x, 10))
        return out


class Objective(BaseModel):
    """What the search maximises (or minimises, for a latency): a bench metric at one level, or ``sla.*``."""

    model_config = ConfigDict(extra="forbid")

    metric: str = "output_throughput"
    concurrency: int | None = Field(default=None, ge=1)
    request_rate: float | None = Field(default=None, gt=0)

    @model_validator(mode="after")
    def _known(self) -> Objective:
        if self.metric not in METRICS and self.metric not in SLA_METRICS:
            raise ValueError(f"unknown metric {self.metric!r}; known: {', '.join([*METRICS, *SLA_METRICS])}")
        if self.metric in SLA_METRICS and (self.concurrency is not None or self.request_rate is not None):
            raise ValueError(f"{self.metric} is one number per SLA search: it takes no level")
        if self.metric in METRICS and (self.concurrency is None) == (self.request_rate is None):
            raise ValueError("name the level the metric is read at: concurrency or request_rate (one of them)")
        return self

    @property
    def higher_is_better(self) -> bool:
        """The metric's direction."""
        return METRICS.get(self.metric, SLA_METRICS.get(self.metric, True))

    @property
    def label(self) -> str:
        """``output_throughput@c=32``, ``sla.max``."""
        if self.concurrency is not None:
            return f"{self.metric}@c={self.concurrency}"
        if self.request_rate is not None:
            return f"{self.metric}@rate={self.request_rate:g}/s"
        return self.metric


class Budget(BaseModel):
    """How much the search may spend: trials and/or wall time (``30m``, ``2h``); the run's deadline applies too."""

    model_config = ConfigDict(extra="forbid")

    trials: int | None = Field(default=None, ge=1, le=10_000)
    time: float | None = None

    @field_validator("time", mode="before")
    @classmethod
    def _time(cls, v: object) -> float | None:
        if v is None:
            return None
        if isinstance(v, bool) or not isinstance(v, (int, float, str)):
            raise ValueError("a time budget is seconds, or a number with s, m or h (30m, 2h)")
        return duration_s(v)


class Final(BaseModel):
    """The end of a tune: how many candidates are relaunched with the baseline, and how many launches each."""

    model_config = ConfigDict(extra="forbid")

    candidates: int = Field(default=2, ge=1, le=5)
    launches: int = Field(default=3, ge=3, le=20)
    alpha: float = Field(default=0.05, gt=0, lt=1)
    min_effect: float = Field(default=0.05, ge=0, lt=1)


class SearchConfig(BaseModel):
    """The ``search:`` block (module docstring)."""

    model_config = ConfigDict(extra="forbid")

    space: dict[str, KnobSpace]
    objective: Objective
    constraints: list[Gate] = Field(default_factory=list)
    smoke_exact: bool = True
    budget: Budget = Field(default_factory=Budget)
    #: Early stop: this many trials in a row with no gain beyond the noise end the search.
    patience: int = Field(default=8, ge=1)
    #: The smallest relative gain that counts as an improvement, when the baseline's launches show less noise.
    min_gain: float = Field(default=0.02, ge=0, lt=1)
    final: Final = Field(default_factory=Final)
    #: Sampler seed for ``bayes`` (and the order ties are broken in).
    seed: int = 0

    @field_validator("space")
    @classmethod
    def _not_empty(cls, v: dict[str, KnobSpace]) -> dict[str, KnobSpace]:
        if not v:
            raise ValueError("the space needs at least one knob")
        return v

    @model_validator(mode="after")
    def _conditions(self) -> SearchConfig:
        for name, knob in self.space.items():
            for other, value in knob.when.items():
                if other == name:
                    raise ValueError(f"space.{name}: a knob cannot depend on itself")
                if other in self.space and self.space[other].when:
                    raise ValueError(f"space.{name}: it depends on {other}, which itself depends on another knob")
                if other in self.space and not any(_same(value, x) for x in self.space[other].values()):
                    raise ValueError(f"space.{name}: when {other}={show_value(value)}, a value {other} never takes")
        for gate in self.constraints:
            if gate.min_ratio is not None or gate.max_ratio is not None:
                raise ValueError(f"constraint {gate.label}: an SLO is an absolute bound (min/max), not a ratio")
        return self


def _same(a: KnobValue, b: KnobValue) -> bool:
    return a == b and type(a) is type(b)


def key(config: Mapping[str, KnobValue]) -> tuple[tuple[str, str], ...]:
    """A configuration's identity (sorted, unset knobs dropped), for deduplication."""
    return tuple(sorted((k, f"{type(v).__name__}:{v!r}") for k, v in config.items() if v is not None))


def describe(config: Mapping[str, KnobValue]) -> str:
    """``attention=mma, max_batch=32``; ``baseline`` for the empty change."""
    return ", ".join(f"{k}={show_value(v)}" for k, v in config.items() if v is not None) or "(nothing set)"


class Space:
    """The finite set of configurations a search walks: every knob's values, conditional knobs where they apply."""

    def __init__(self, search: SearchConfig, baseline: Mapping[str, KnobValue]) -> None:
        self.knobs = {name: k.values() for name, k in search.space.items()}
        self.when = {name: dict(k.when) for name, k in search.space.items()}
        #: The baseline's value of each searched knob (None: the baseline leaves it to the recipe).
        self.baseline: Config = {name: baseline.get(name) for name in self.knobs}
        self.baseline = self.normalise(self.baseline)

    def applies(self, name: str, config: Mapping[str, KnobValue]) -> bool:
        """Whether ``name`` is set in ``config``'s neighbourhood: every assignment of its ``when`` holds."""
        return all(_same(config.get(k), v) for k, v in self.when[name].items())

    def normalise(self, config: Mapping[str, KnobValue]) -> Config:
        """``config`` with knobs that do not apply unset, in the space's knob order."""
        out = {k: config.get(k) for k in self.knobs}
        return {k: (v if self.applies(k, out) else None) for k, v in out.items()}

    def points(self) -> Iterator[Config]:
        """Every configuration, each once (conditional knobs expanded only where they apply)."""
        plain = [k for k in self.knobs if not self.when[k]]
        cond = [k for k in self.knobs if self.when[k]]
        seen: set[tuple[tuple[str, str], ...]] = set()
        for combo in itertools.product(*(self.knobs[k] for k in plain)):
            base = dict(zip(plain, combo, strict=True))
            live = [k for k in cond if self.applies(k, base)]
            for extra in itertools.product(*(self.knobs[k] for k in live)):
                cfg = self.normalise({**base, **dict(zip(live, extra, strict=True))})
                if key(cfg) not in seen:
                    seen.add(key(cfg))
                    yield cfg

    def size(self) -> int:
        """How many configurations the space holds."""
        n = 0
        for _ in self.points():
            n += 1
            if n > MAX_POINTS:
                break
        return n


def load_search(loaded: Loaded) -> SearchConfig:
    """The experiment's ``search:`` block, validated against its recipe; errors name file, line and field."""
    data = loaded.experiment.search
    path = str(loaded.path)
    try:
        text = loaded.path.read_text()
    except OSError:
        text = ""
    if data is None:
        raise ConfigError(
            "this experiment has no `search:` block to tune",
            file=path,
            hint="add `search:` with a space, an objective and a budget (docs/tune.md)",
        )
    search = validate(SearchConfig, data, text, path, prefix=["search"])
    if loaded.experiment.bench is None:
        raise ConfigError(
            "a tune measures each trial with the bench, and this experiment has no `bench:`",
            file=path,
            line=line_of(text, ["search"]),
            field="search",
            hint="add a `bench:` section whose levels include the objective's",
        )
    bench = loaded.experiment.bench_settings()
    assert bench is not None
    obj = search.objective
    if obj.metric in SLA_METRICS and bench.sla is None:
        raise ConfigError(
            f"the objective {obj.metric} needs an SLA search in `bench:` (bench.sla)",
            file=path,
            line=line_of(text, ["search", "objective"]),
            field="search.objective",
        )
    if obj.concurrency is not None and bench.sla is None and obj.concurrency not in (bench.concurrency or [1, 8, 32]):
        raise ConfigError(
            f"the bench runs no c={obj.concurrency} level",
            file=path,
            line=line_of(text, ["search", "objective", "concurrency"]),
            field="search.objective.concurrency",
            hint=f"levels: {bench.concurrency}; add it to bench.concurrency",
        )
    for name, knob in search.space.items():
        where: list[str | int] = ["search", "space", name]
        unknown = [n for n in [name, *knob.when] if n not in loaded.recipe.knobs]
        if unknown:
            raise ConfigError(
                f"recipe {loaded.recipe.name} has no knob {unknown[0]!r}",
                file=path,
                line=line_of(text, where),
                field=".".join(map(str, where)),
                hint=f"known knobs: {', '.join(sorted(loaded.recipe.knobs))}",
            )
        allowed = loaded.recipe.knobs[name].choices
        bad = [v for v in knob.values() if allowed and v not in allowed]
        if bad:
            raise ConfigError(
                f"{show_value(bad[0])} is not one of the recipe's choices for {name}: {allowed}",
                file=path,
                line=line_of(text, where),
                field=".".join(map(str, where)),
            )
    size = Space(search, loaded.experiment.baseline.knobs).size()
    if size > MAX_POINTS:
        raise ConfigError(
            f"the space holds more than {MAX_POINTS:,} configurations",
            file=path,
            line=line_of(text, ["search", "space"]),
            field="search.space",
            hint="fewer values per knob, or a larger step",
        )
    return search
