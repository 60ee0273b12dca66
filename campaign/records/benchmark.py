"""Bench records: the settings of a bench, its load levels and gates, and what it measured.

``BenchSettings`` is the ``bench:`` section of an experiment file (and ``campaign bench``'s options); ``BenchResult``
is what ``campaign.bench.run_bench`` returns and what a report stores as ``Attempt.bench``. The metrics a gate or a
comparison can ask a level for are the table of ``campaign.records.metrics``; ``SLA_METRICS`` what a gate can ask an SLA
search for (``SlaSettings`` / ``SlaResult``). Definitions of the metrics are in ``campaign.bench``'s docstring.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, model_validator

from campaign.records.metrics import METRICS, SLA_METRICS, LatencyStats

#: Version of the ``BenchResult`` layout (``BenchResult.schema_version``); see ``campaign.records`` for the history.
RESULT_SCHEMA_VERSION = 1


class Gate(BaseModel):
    """One requirement on a bench result: a metric, optionally a level, and absolute or baseline-relative bounds.

    Written in YAML as ``{metric: output_throughput, concurrency: 32, min_ratio: 0.97}``; ``campaign.gates``
    checks them.
    """

    model_config = ConfigDict(extra="forbid")

    metric: str
    concurrency: int | None = None
    request_rate: float | None = None
    min: float | None = None
    max: float | None = None
    min_ratio: float | None = None
    max_ratio: float | None = None
    name: str | None = None

    @model_validator(mode="after")
    def _valid(self) -> Gate:
        if self.metric not in METRICS and self.metric not in SLA_METRICS:
            known = ", ".join([*METRICS, *SLA_METRICS])
            raise ValueError(f"unknown gate metric {self.metric!r}; known: {known}")
        if self.metric in SLA_METRICS and (self.concurrency is not None or self.request_rate is not None):
            raise ValueError(f"{self.metric} is one number per search; a gate on it selects no level")
        if all(v is None for v in (self.min, self.max, self.min_ratio, self.max_ratio)):
            raise ValueError("a gate needs at least one of min, max, min_ratio, max_ratio")
        if self.concurrency is not None and self.request_rate is not None:
            raise ValueError("a gate selects a level by concurrency or by request_rate, not both")
        return self

    @property
    def label(self) -> str:
        """The gate's name, or one made from what it checks: ``output_throughput@c=32 >= 0.97x baseline``."""
        if self.name:
            return self.name
        where = ""
        if self.concurrency is not None:
            where = f"@c={self.concurrency}"
        elif self.request_rate is not None:
            where = f"@rate={self.request_rate:g}/s"
        bounds = []
        if self.min is not None:
            bounds.append(f">= {self.min:g}")
        if self.max is not None:
            bounds.append(f"<= {self.max:g}")
        if self.min_ratio is not None:
            bounds.append(f">= {self.min_ratio:g}x baseline")
        if self.max_ratio is not None:
            bounds.append(f"<= {self.max_ratio:g}x baseline")
        return f"{self.metric}{where} " + ", ".join(bounds)


class SlaSettings(BaseModel):
    """An SLA search: the highest concurrency (or request rate) at which every SLO holds, found by bisection.

    Written in YAML as ``sla: {slo: {ttft.p90: 200, tpot.p90: 50}, high: 128}``: each SLO bounds a lower-is-better
    metric of ``METRICS`` (latencies in ms) from above, and ``max_error_rate`` bounds the failed share. The search
    measures ``low``, then ``high``, then halves the bracket between the highest load that met the SLOs and the
    lowest that did not, until it is ``step`` wide (1 for concurrency) or ``max_trials`` levels ran.
    """

    model_config = ConfigDict(extra="forbid")

    over: Literal["concurrency", "request_rate"] = "concurrency"
    slo: dict[str, float]
    max_error_rate: float = Field(default=0.01, ge=0.0, le=1.0)
    low: float = Field(default=1.0, gt=0)
    high: float = Field(default=64.0, gt=0)
    #: The resolution of the answer: 1 for concurrency; for a request rate, (high - low) / 16 when left out.
    step: float | None = Field(default=None, gt=0)
    #: At most this many levels; when the bracket is still wider than ``step`` after them the result says so.
    max_trials: int | None = Field(default=None, ge=1)

    @model_validator(mode="after")
    def _valid(self) -> SlaSettings:
        if not self.slo:
            raise ValueError("an SLA search needs at least one SLO, e.g. slo: {ttft.p90: 200}")
        for name in self.slo:
            if name not in METRICS or METRICS[name]:
                bounded = ", ".join(m for m, higher in METRICS.items() if not higher)
                raise ValueError(f"{name!r} is not a metric an SLO bounds from above; one of: {bounded}")
        if self.over == "concurrency":
            if self.low != int(self.low) or self.high != int(self.high):
                raise ValueError("a concurrency search needs whole numbers for low and high")
            if self.step is not None and self.step != int(self.step):
                raise ValueError("a concurrency search needs a whole step")
        if self.high < self.low:
            raise ValueError(f"high ({self.high:g}) is below low ({self.low:g})")
        return self

    @property
    def resolution(self) -> float:
        """The width at which the bracket counts as found."""
        if self.step is not None:
            return self.step
        return 1.0 if self.over == "concurrency" else max((self.high - self.low) / 16, 1e-3)

    def trial_bound(self) -> int:
        """The most levels the search runs: ``low``, ``high`` and the halvings between them (or ``max_trials``)."""
        span = self.high - self.low
        bound = 1 if span <= 0 else 2 + max(0, math.ceil(math.log2(span / self.resolution)))
        return min(bound, self.max_trials) if self.max_trials is not None else bound

    def load(self, value: float, max_concurrency: int | None) -> Load:
        """The level that measures ``value``."""
        if self.over == "concurrency":
            return Load(concurrency=int(value))
        return Load(request_rate=value, max_concurrency=max_concurrency)

    def describe(self) -> str:
        """``ttft.p90 <= 200 ms, error rate <= 1%`` for a person."""
        bounds = [f"{k} <= {v:g}" + ("" if k == "error_rate" else " ms") for k, v in self.slo.items()]
        return ", ".join([*bounds, f"error rate <= {100 * self.max_error_rate:g}%"])


class BenchSettings(BaseModel):
    """How to load a server: the ``bench:`` section of an experiment file, and ``campaign bench`` options.

    Load shape: either ``concurrency`` levels (a sweep; the default is ``[1, 8, 32]``) or ``request_rate``
    (requests per second, Poisson arrivals; one level per rate, optionally capped by ``max_concurrency``).
    Each level sends ``warmup`` requests whose results are discarded, then ``requests`` measured requests,
    ``repeats`` times; a campaign run does all of it on ``launches`` fresh launches of each variant. With
    ``sla`` the search picks the levels instead (see ``SlaSettings``).

    Requests go to ``/v1/chat/completions`` or, with ``endpoint: completions``, to ``/v1/completions`` (the prompt
    sent as it is, no chat template). ``api_key`` (sent as ``Authorization: Bearer``) and ``headers`` reach the
    server only: every record written keeps them masked (``campaign.redaction.mask_bench``).
    """

    model_config = ConfigDict(extra="forbid")

    concurrency: list[int] | None = None
    request_rate: list[float] | None = None
    max_concurrency: int | None = Field(default=None, ge=1)
    requests: int = Field(default=64, ge=1)
    #: Concurrency levels only: stream k of c starts k·ramp_s/c seconds after the first, so a level does not
    #: open with every request sent at once (and, streams being alike, every later wave with them).
    ramp_s: float = Field(default=0.0, ge=0.0)
    warmup: int = Field(default=2, ge=0)
    repeats: int = Field(default=1, ge=1)
    #: In a campaign run: measure each variant over this many launches (stop, launch, ready, smoke, bench each
    #: time), so a comparison sees the launch-to-launch variance; ``campaign bench`` measures one server, once.
    launches: int = Field(default=1, ge=1)
    #: ``arithmetic``: "What is A×B?"-style questions for the reference server; ``random``: ``input_len`` random
    #: words asking for ``output_len`` tokens, with ``ignore_eos`` so real servers produce exactly that many;
    #: ``long-context``: a question after filler words, ``input_len`` tokens in all (the context length), asking
    #: for ``output_len`` tokens with ``ignore_eos`` (the answer is what comes before the model's eos).
    prompts: Literal["arithmetic", "random", "long-context"] = "arithmetic"
    seed: int = 0
    input_len: int = Field(default=128, ge=1)
    output_len: int = Field(default=128, ge=1)
    #: Default: on for random and long-context prompts, off for arithmetic ones.
    ignore_eos: bool | None = None
    #: Default: ``output_len`` for random and long-context prompts, 16 for arithmetic ones.
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float = Field(default=0.0, ge=0.0)
    #: Seconds one request may take from send to the end of its stream before it counts as failed (timeout).
    timeout_s: float = Field(default=60.0, gt=0)
    #: A level whose (failed + incomplete) / sent exceeds this fails the bench.
    max_error_rate: float = Field(default=0.01, ge=0.0, le=1.0)
    gates: list[Gate] = Field(default_factory=list)
    endpoint: Literal["chat", "completions"] = "chat"
    api_key: str | None = None
    headers: dict[str, str] = Field(default_factory=dict)
    sla: SlaSettings | None = None

    @model_validator(mode="before")
    @classmethod
    def _scalars_to_lists(cls, data: Any) -> Any:
        # YAML authors write `request_rate: 8` or `concurrency: 32` as often as a list.
        if isinstance(data, dict):
            data = dict(data)
            for key in ("concurrency", "request_rate"):
                if isinstance(data.get(key), int | float) and not isinstance(data.get(key), bool):
                    data[key] = [data[key]]
        return data

    @model_validator(mode="after")
    def _one_load_shape(self) -> BenchSettings:
        if self.sla is not None:
            if self.concurrency is not None or self.request_rate is not None:
                raise ValueError("with sla the search chooses the levels: leave concurrency and request_rate out")
            if self.max_concurrency is not None and self.sla.over == "concurrency":
                raise ValueError("max_concurrency caps a request_rate search; a concurrency search leaves it out")
            return self
        if self.concurrency is not None and self.request_rate is not None:
            raise ValueError("give either concurrency levels or a request_rate, not both")
        if self.concurrency is None and self.request_rate is None:
            self.concurrency = [1, 8, 32]
        if self.concurrency is not None:
            if not self.concurrency or any(c < 1 for c in self.concurrency):
                raise ValueError("concurrency levels must be a non-empty list of integers >= 1")
            if self.max_concurrency is not None:
                raise ValueError("max_concurrency caps a request_rate; with concurrency levels leave it out")
        if self.request_rate is not None and (not self.request_rate or any(r <= 0 for r in self.request_rate)):
            raise ValueError("request_rate must be a positive number of requests per second (or a list of them)")
        return self

    @model_validator(mode="after")
    def _enough_requests(self, info: ValidationInfo) -> BenchSettings:
        # A level that sends fewer requests than its concurrency never has that many in flight: its figures (and an
        # SLA search's verdict there) would describe a lighter load than the one they are labelled with. Checked for
        # a plan (context {"plan": True}: an experiment or the bench command), not when a stored result is read.
        if not (info.context or {}).get("plan"):
            return self
        if self.sla is not None:
            concurrency = int(self.sla.high) if self.sla.over == "concurrency" else 0
        else:
            concurrency = max(self.concurrency or [0])
        if concurrency > self.requests:
            raise ValueError(
                f"a level at concurrency {concurrency} with requests {self.requests} never has more than "
                f"{self.requests} in flight; set requests to at least {concurrency} (or lower the concurrency)"
            )
        return self

    def loads(self) -> list[Load]:
        """The levels this bench runs, in order (none up front for an SLA search: it picks them as it goes)."""
        if self.request_rate is not None:
            return [Load(request_rate=r, max_concurrency=self.max_concurrency) for r in self.request_rate]
        return [Load(concurrency=c) for c in self.concurrency or []]

    def trial_count(self) -> int:
        """How many levels the bench runs (at most, for an SLA search)."""
        return self.sla.trial_bound() if self.sla is not None else len(self.loads())

    def describe(self) -> str:
        """One line for a plan: the levels (or the search), requests per level and the endpoint."""
        per = f"{self.requests} requests x {self.repeats}" if self.repeats > 1 else f"{self.requests} requests"
        where = "/v1/completions" if self.endpoint == "completions" else "/v1/chat/completions"
        if self.sla is not None:
            sla = self.sla
            return (
                f"SLA search over {sla.over} {sla.low:g}..{sla.high:g} (step {sla.resolution:g}): at most "
                f"{self.trial_count()} trials of {per}, for {sla.describe()}; {where}"
            )
        launches = f"; on each of {self.launches} launches of a variant" if self.launches > 1 else ""
        return f"{len(self.loads())} levels ({', '.join(x.label for x in self.loads())}) of {per}; {where}{launches}"

    def request_headers(self) -> dict[str, str]:
        """The headers every request carries (the API key as a bearer token)."""
        out = dict(self.headers)
        if self.api_key is not None:
            out["Authorization"] = f"Bearer {self.api_key}"
        return out

    def effective_ignore_eos(self) -> bool:
        """Whether requests carry ``ignore_eos`` (on by default for random and long-context prompts)."""
        return self.ignore_eos if self.ignore_eos is not None else self.prompts != "arithmetic"

    def effective_max_tokens(self) -> int:
        """The ``max_tokens`` each request asks for."""
        if self.max_tokens is not None:
            return self.max_tokens
        return self.output_len if self.prompts != "arithmetic" else 16


class Load(BaseModel):
    """One load level: a fixed number of requests in flight, or Poisson arrivals at a rate."""

    model_config = ConfigDict(extra="forbid")

    concurrency: int | None = None
    request_rate: float | None = None
    max_concurrency: int | None = None

    @property
    def label(self) -> str:
        """``c=32`` or ``rate=8/s`` (``rate=8/s,c<=16`` when capped)."""
        if self.concurrency is not None:
            return f"c={self.concurrency}"
        cap = f",c<={self.max_concurrency}" if self.max_concurrency else ""
        return f"rate={self.request_rate:g}/s{cap}"

    @property
    def x(self) -> float:
        """Where this level sits on a plot's x axis: its concurrency, or its request rate."""
        return float(self.concurrency if self.concurrency is not None else self.request_rate or 0.0)


class RepeatSample(BaseModel):
    """The headline metrics of one repeat of one level: the samples a significance test compares."""

    repeat: int
    duration_s: float
    successful: int
    failed: int
    incomplete: int
    output_tokens: int
    metrics: dict[str, float | None] = Field(default_factory=dict)


class LevelResult(BaseModel):
    """Everything measured at one load level, pooled over its repeats."""

    load: Load
    label: str
    sent: int
    successful: int
    failed: int
    incomplete: int
    #: Unsuccessful requests by type, e.g. ``http_500``, ``timeout``, ``stream_error:internal_error``,
    #: ``incomplete:connection_closed``; the counts add up to failed + incomplete.
    errors: dict[str, int] = Field(default_factory=dict)
    #: One message per error type, as the server or the transport worded it.
    error_examples: dict[str, str] = Field(default_factory=dict)
    error_rate: float
    passed: bool
    duration_s: float
    input_tokens: int
    output_tokens: int
    request_throughput: float
    output_throughput: float
    #: Prompt tokens (as the server's usage counted them) per second, and prompt plus output tokens per second.
    input_throughput: float = 0.0
    total_throughput: float = 0.0
    ttft: LatencyStats
    itl: LatencyStats
    tpot: LatencyStats
    e2e: LatencyStats
    repeats: list[RepeatSample] = Field(default_factory=list)

    def metric(self, name: str) -> float | None:
        """The value of a metric named as in ``METRICS`` (``output_throughput``, ``ttft.p90``, ...)."""
        if name not in METRICS:
            raise KeyError(name)
        if "." in name:
            group, stat = name.split(".", 1)
            value: float | None = getattr(getattr(self, group), stat)
            return value
        return float(getattr(self, name))


class SlaTrial(BaseModel):
    """One level of an SLA search: the load measured, whether every SLO held, and which did not."""

    value: float
    label: str
    met: bool
    violations: list[str] = Field(default_factory=list)


class SlaResult(BaseModel):
    """What an SLA search found: the highest load meeting every SLO (None: not even ``low``) and its goodput."""

    over: Literal["concurrency", "request_rate"]
    slo: dict[str, float]
    max_error_rate: float
    trials: list[SlaTrial] = Field(default_factory=list)
    max: float | None = None
    #: The lowest load measured that missed an SLO (None: ``high`` met them all).
    missed: float | None = None
    #: Output tokens and requests per second at ``max``.
    goodput: float | None = None
    request_goodput: float | None = None
    #: False when ``max_trials`` ended the search with the bracket still wider than the step.
    converged: bool = True


class BenchResult(BaseModel):
    """A whole bench: what was asked, of whom, and every level's result. Stored as ``Attempt.bench``."""

    schema_version: int = RESULT_SCHEMA_VERSION
    base_url: str
    model: str
    started_at: str
    duration_s: float
    settings: BenchSettings
    levels: list[LevelResult] = Field(default_factory=list)
    passed: bool
    #: Client versions, so a comparison can tell a client change from a server change.
    client: dict[str, str] = Field(default_factory=dict)
    #: How the prompts' input lengths were made: ``tokenize`` (fitted to ``input_len`` with the server's own
    #: /tokenize: exact) or ``approximate`` (words or characters; usage.prompt_tokens says what the server counted).
    input_lengths: Literal["tokenize", "approximate"] = "approximate"
    sla: SlaResult | None = None

    def sla_metric(self, name: str) -> float | None:
        """The value of an ``SLA_METRICS`` metric, or None (no search ran, or no load met the SLOs)."""
        if name not in SLA_METRICS:
            raise KeyError(name)
        sla = self.sla
        if sla is None or sla.max is None:
            return None
        if name == "sla.max":
            return sla.max
        return sla.goodput if name == "sla.goodput" else sla.request_goodput

    def level(self, *, concurrency: int | None = None, request_rate: float | None = None) -> LevelResult | None:
        """The level run at this concurrency or request rate, or None."""
        for lv in self.levels:
            if concurrency is not None and lv.load.concurrency == concurrency:
                return lv
            if request_rate is not None and lv.load.request_rate == request_rate:
                return lv
        return None


class RequestRow(BaseModel):
    """One measured request, as ``campaign bench --export-requests`` writes it (a JSON line each); times in ms."""

    level: str
    repeat: int
    #: Its place among the level's measured requests in the order they finished (0-based, across repeats).
    index: int
    #: When it was sent, in seconds from the start of the bench.
    start_s: float
    ok: bool
    error: str | None = None
    message: str = ""
    ttft_ms: float | None = None
    e2e_ms: float | None = None
    itl_ms: list[float] = Field(default_factory=list)
    prompt_tokens: int = 0
    output_tokens: int = 0


@dataclass(frozen=True)
class BenchEvent:
    """Progress of a bench, for a console: ``level_start``, ``warmup``, ``repeat``, ``request``, ``level_end``.

    ``warmup`` comes before a level's warm-up requests, ``repeat`` before each measured repeat starts.

    ``done``/``total`` count measured requests of the level across its repeats; ``failed`` counts the
    unsuccessful ones among them.
    """

    kind: Literal["level_start", "warmup", "repeat", "request", "level_end"]
    level: str
    index: int
    levels: int
    done: int = 0
    total: int = 0
    failed: int = 0
    repeat: int = 0
    result: LevelResult | None = None
