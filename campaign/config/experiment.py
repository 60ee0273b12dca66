"""The experiment file's model: where, what, which variants, how to check them, what to leave running."""

from __future__ import annotations

from typing import Annotated, Any, Literal, TypeVar

from pydantic import Field, field_validator, model_validator

from campaign.config.fields import NAME_RE, Strict, duration_s
from campaign.config.host import HostConfig, LocalHostConfig
from campaign.config.matrix import MatrixConfig, expand_matrix
from campaign.config.variant import BaselineConfig, VariantConfig
from campaign.records import BenchSettings
from campaign.records.profile import ProfileSettings

_V = TypeVar("_V", bound="VariantConfig")


class SmokeConfig(Strict):
    """Questions with known answers asked after readiness, then a concurrent burst of them (see ``campaign.smoke``)."""

    enabled: bool = True
    questions: int = Field(default=4, ge=0, le=1000)
    seed: int = 0
    #: Room for a short chain of thought; capped at half the context /v1/models reports (max_model_len).
    max_tokens: int = Field(default=256, ge=1)
    timeout_s: float = Field(default=60.0, gt=0, allow_inf_nan=False)
    api: Literal["chat", "completions"] = "chat"
    #: The answer-format instruction; a system message (chat) or ``{instruction}`` in ``completion_prompt``.
    instruction: str = "Reply with only the final number."
    instruction_in: Literal["system", "user"] = "system"
    #: The /v1/completions prompt: ``{question}`` and ``{instruction}`` are filled in.
    completion_prompt: str = "{instruction}\n{question}\nAnswer:"
    #: Send ``chat_template_kwargs: {enable_thinking: false}`` (dropped if the server refuses it).
    reasoning_off: bool = True
    burst: bool = True
    #: Largest burst; None: the variant's ``cuda_graph_max_bs`` / ``max_batch`` knob (the smaller), else 32.
    burst_max: int | None = Field(default=None, ge=1, le=1024)
    #: ``answers``: every answer exact; ``golden``: greedy tokens agree with the known-good's (inexact models).
    mode: Literal["answers", "golden"] = "answers"
    min_agreement: float = Field(default=0.9, ge=0.0, le=1.0)
    #: Largest log-probability difference from the known-good's on the answer tokens and their top alternatives,
    #: relative: |this - known| / max(1, |known|) (see ``campaign.golden``); None: no check.
    logprob_tolerance: float | None = Field(default=0.1, gt=0)
    top_logprobs: int = Field(default=5, ge=0, le=20)

    @field_validator("completion_prompt")
    @classmethod
    def _has_question(cls, value: str) -> str:
        if "{question}" not in value:
            raise ValueError("completion_prompt must contain {question}")
        try:
            value.format(question="", instruction="")
        except (KeyError, IndexError, ValueError) as e:
            raise ValueError(f"completion_prompt may name only {{question}} and {{instruction}} ({e})") from e
        return value


class TimeoutsConfig(Strict):
    """Deadlines, in seconds (finite: ``.inf`` would make a wait that never ends)."""

    ready_s: float = Field(default=120.0, gt=0, allow_inf_nan=False)
    stop_grace_s: float = Field(default=10.0, ge=0, allow_inf_nan=False)
    restore_ready_s: float | None = Field(default=None, gt=0, allow_inf_nan=False)
    poll_s: float = Field(default=0.1, gt=0, le=1.0, allow_inf_nan=False)


class RetryConfig(Strict):
    """How often a variant that failed for a transient cause (``campaign.retry``) is launched again, and when."""

    #: Extra attempts per variant after its first (0: never retry).
    budget: int = Field(default=2, ge=0, le=20)
    #: The wait before the first retry, in seconds; each later one waits ``factor`` times longer.
    backoff_s: float = Field(default=2.0, ge=0, le=3600, allow_inf_nan=False)
    factor: float = Field(default=2.0, ge=1, le=10, allow_inf_nan=False)


HOST_XOR_HOSTS = "give either `host` (one host) or `hosts` (a fleet), not both"
HOSTS_EMPTY = "`hosts` needs at least one host"


class Experiment(Strict):
    """One experiment file: where, what, which variants, how to check them, and what to leave running."""

    name: str
    description: str = ""
    host: HostConfig = Field(default_factory=LocalHostConfig, discriminator="kind")
    #: A fleet: several hosts the variants are spread over, in parallel (``campaign.fleet``); instead of ``host``.
    #: A list of one is the same as ``host:``. After validation ``host`` is the first entry.
    hosts: list[Annotated[HostConfig, Field(discriminator="kind")]] | None = None
    recipe: str
    vars: dict[str, str] = Field(default_factory=dict)
    baseline: BaselineConfig = Field(default_factory=BaselineConfig)
    variants: list[VariantConfig] = Field(default_factory=list)
    matrix: MatrixConfig | None = None
    isolate: bool = False
    smoke: SmokeConfig = Field(default_factory=SmokeConfig)
    #: The ``bench:`` section, validated by ``campaign.bench.BenchSettings`` at load time (see ``bench_settings``).
    bench: dict[str, Any] | None = None
    #: One bench level run again under the server's profiler (``campaign.profile``); None: no profile.
    profile: ProfileSettings | None = None
    timeouts: TimeoutsConfig = Field(default_factory=TimeoutsConfig)
    at_end: Literal["known_good", "last", "stop"] = "known_good"
    #: Run the baseline first (it becomes the known-good the variants are restored to).
    run_baseline: bool = True
    #: When the box goes back to the known-good between variants: ``after_failure`` (every failed variant),
    #: ``when_needed`` (only after a failure that may leave the box damaged: see ``campaign.retry.needs_proven_box``),
    #: or ``at_end`` (never between variants). The hygiene check (stop, nothing of ours left, the port free) runs
    #: between variants whatever the policy, and ``at_end`` applies at the end.
    restore: Literal["after_failure", "when_needed", "at_end"] = "after_failure"
    #: Retries of transient failures (see ``campaign.retry``).
    retry: RetryConfig = Field(default_factory=RetryConfig)
    #: How long the whole campaign may take from its start (seconds, or ``30m``, ``2h``): a variant whose estimated
    #: cost would pass it is not started, and the run ends cleanly (``at_end`` applies). None: no limit.
    deadline: float | None = None
    #: What a planned flag the server's parser refuses does: ``refuse`` the plan (exit 2, before anything is stopped)
    #: or ``warn`` (a note, and the server gets the flag as written).
    flag_check: Literal["refuse", "warn"] = "refuse"
    #: The ``search:`` block ``campaign tune`` reads (validated by ``campaign.tune.space.load_search``).
    search: dict[str, Any] | None = None

    @field_validator("deadline", mode="before")
    @classmethod
    def _deadline(cls, v: object) -> float | None:
        if v is None:
            return None
        if isinstance(v, bool) or not isinstance(v, (int, float, str)):
            raise ValueError("a deadline is seconds, or a number with s, m or h (30m, 2h)")
        return duration_s(v)

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not NAME_RE.fullmatch(v) or len(v) > 100:
            raise ValueError("use letters, digits and . _ - (up to 100, not starting with a dot): it names folders")
        return v

    @model_validator(mode="after")
    def _one_host_field(self) -> Experiment:
        if self.hosts is None:
            return self
        if "host" in self.model_fields_set:
            raise ValueError(HOST_XOR_HOSTS)
        if not self.hosts:
            raise ValueError(HOSTS_EMPTY)
        self.host = self.hosts[0]
        return self

    @property
    def fleet(self) -> list[HostConfig]:
        """Every host the experiment runs on (one for ``host:``)."""
        return list(self.hosts) if self.hosts else [self.host]

    def for_host(self, host: HostConfig) -> Experiment:
        """This experiment as it runs on one host of its fleet: that host alone, its knobs and env over every
        variant's (what the host's own loop renders and launches)."""
        knobs, env = host.knobs, host.env

        def on_host(v: _V) -> _V:
            if not (knobs or env):
                return v
            return v.model_copy(update={"knobs": {**v.knobs, **knobs}, "env": {**v.env, **env}})

        return self.model_copy(
            update={
                "host": host,
                "hosts": None,
                "baseline": on_host(self.baseline),
                "variants": [on_host(v) for v in self.variants],
            }
        )

    @model_validator(mode="after")
    def _variants_xor_matrix(self) -> Experiment:
        if self.variants and self.matrix:
            raise ValueError("give either `variants` or `matrix`, not both")
        names = [v.name for v in self.variants]
        dupes = sorted({n for n in names if names.count(n) > 1 or n == self.baseline.name})
        if dupes:
            raise ValueError(f"variant names must be unique and differ from the baseline's: {dupes}")
        return self

    # -----------------------------------------------------------------------------------------------------------------

    def bench_settings(self) -> BenchSettings | None:
        """The bench settings, or None when the experiment does not bench."""
        if self.bench is None:
            return None
        return BenchSettings.model_validate(self.bench)

    def variant_configs(self) -> list[VariantConfig]:
        """The variants in run order (baseline first when ``run_baseline``), the matrix expanded."""
        out: list[VariantConfig] = [self.baseline] if self.run_baseline else []
        if self.matrix is not None:
            out.extend(v for v in expand_matrix(self.matrix, self.baseline) if v.knobs != self.baseline.knobs)
        out.extend(self.variants)
        return out
