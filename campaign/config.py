# Over 500 lines: experiment and recipe models, their loading (file:line errors) and rendering are one vocabulary.
"""Experiment and recipe files: pydantic models, YAML with line numbers in errors, --set overrides, matrices.

An experiment file names a host, a recipe, a baseline and either a list of variants or a matrix of knobs. Loading it
gives an ``Experiment``; ``Experiment.plan()`` turns it into ``PlannedVariant`` values, each with the exact
``LaunchSpec`` that will run. Every validation error is a ``ConfigError`` naming the file, the line and the field.
"""

from __future__ import annotations

import hashlib
import itertools
import re
import shlex
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from campaign.errors import ConfigError, UsageError
from campaign.records import BenchSettings, KnobValue, LaunchSpec, show_value
from campaign.records.profile import ProfileEndpoints, ProfileSettings
from campaign.redaction import mask_env

CONFIG_DIR = Path("configs")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
#: Names that become folders (experiments, run ids): no path separators, no leading dot, so never `.` or `..`.
NAME_RE = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9._-]*")
#: Linux refuses to exec a program with one argument or environment entry of this many bytes or more (MAX_ARG_STRLEN,
#: its NUL included): such a launch fails with "Argument list too long" after the box was stopped for it.
MAX_ARG_BYTES = 128 * 1024
#: A variant's name is part of its attempt folder's name, which a file system caps at 255 bytes.
MAX_VARIANT_NAME = 120
M = TypeVar("M", bound=BaseModel)
_V = TypeVar("_V", bound="VariantConfig")


def env_names(env: dict[str, str]) -> dict[str, str]:
    """``env`` unchanged when every key is a valid environment variable name (ValueError otherwise)."""
    for k in env:
        if not _ENV_NAME.match(k):
            raise ValueError(f"{k!r} is not a valid environment variable name")
    return env


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


# ---------------------------------------------------------------------------------------------------------------------
# Recipes


class Spelling(_Strict):
    """How a knob was spelled by the releases before ``before`` (a server version), where upstream renamed it."""

    before: str
    flag: str | None = None
    when_true: list[str] = Field(default_factory=list)
    when_false: list[str] = Field(default_factory=list)


class EffectiveRule(_Strict):
    """How a server's log states the value it really runs for a knob: a regex over log lines.

    The line says the value in the pattern's ``value`` group (read through ``map`` where given, e.g. vLLM's
    ``NONE`` -> false), or, for a pattern without that group, ``value`` itself. The last matching line before
    readiness is the server's final word.
    """

    pattern: str
    value: KnobValue = None
    map: dict[str, KnobValue] = Field(default_factory=dict)

    @field_validator("pattern")
    @classmethod
    def _regex(cls, v: str) -> str:
        try:
            re.compile(v)
        except re.error as e:
            raise ValueError(f"not a valid regular expression: {e}") from e
        return v


class KnobRule(_Strict):
    """How one knob becomes flags: ``flag VALUE``, fixed args when true/false, or an env variable.

    ``older`` holds earlier spellings by server version (the first whose ``before`` is above the running version
    wins); ``effective`` says how the server's log states what it really runs for this knob.
    """

    flag: str | None = None
    when_true: list[str] = Field(default_factory=list)
    when_false: list[str] = Field(default_factory=list)
    env: str | None = None
    choices: list[KnobValue] | None = None
    older: list[Spelling] = Field(default_factory=list)
    effective: list[EffectiveRule] = Field(default_factory=list)

    def spelled_for(self, version: str | None) -> KnobRule | Spelling:
        """The spelling in force for a server at ``version`` (this rule's own when the version is unknown)."""
        if version is None:
            return self
        key = version_key(version)
        for old in sorted(self.older, key=lambda o: version_key(o.before)):
            if key < version_key(old.before):
                return old
        return self


class Together(_Strict):
    """Args added when several knobs hold the given values at once (vLLM: compile off with graphs on)."""

    when: dict[str, KnobValue]
    args: list[str]


class HelpSpec(_Strict):
    """How to read the server's own flag list: the command that prints ``--help``, and where flags start.

    ``launcher`` is how many words of the recipe's ``command`` start the server (``python3 -m sglang.launch_server``
    is 3): every word after them that looks like a flag is checked against the help text.
    """

    command: list[str]
    launcher: int = Field(ge=0)
    #: The command whose last output line is the build's version for the help cache (default: the
    #: ``server_version`` probe); a server whose flags change without a release says more than its version here.
    version: list[str] | None = None


class Recipe(_Strict):
    """How one server family is launched and watched (a data file in campaign/recipes/)."""

    name: str
    description: str = ""
    command: list[str]
    vars: dict[str, str] = Field(default_factory=dict)
    #: Environment every launch of this recipe gets (a variant's env overrides it).
    env: dict[str, str] = Field(default_factory=dict)
    ready_marker: str
    health_path: str = "/health"
    phases: dict[str, str] = Field(default_factory=dict)
    default_port: int = 30000
    knobs: dict[str, KnobRule] = Field(default_factory=dict)
    #: Commands (templates like ``command``) whose last output line goes into a run's environment, e.g.
    #: ``server_version`` and ``kernel_hash``: what compare flags when two runs differ.
    probes: dict[str, list[str]] = Field(default_factory=dict)
    #: The server's own ``--help``: every rendered flag is checked against it before anything is launched.
    help: HelpSpec | None = None
    together: list[Together] = Field(default_factory=list)
    #: The server's profiler endpoints (``campaign.profile``); None: the recipe cannot be profiled.
    profile: ProfileEndpoints | None = None

    @field_validator("ready_marker")
    @classmethod
    def _regex(cls, v: str) -> str:
        try:
            re.compile(v)
        except re.error as e:
            raise ValueError(f"not a valid regular expression: {e}") from e
        return v

    @field_validator("phases")
    @classmethod
    def _phase_regexes(cls, v: dict[str, str]) -> dict[str, str]:
        for name, rx in v.items():
            try:
                re.compile(rx)
            except re.error as e:
                raise ValueError(f"phase {name!r}: not a valid regular expression: {e}") from e
        return v


def load_recipe(name: str) -> Recipe:
    """The recipe shipped in the package under ``name`` (refserver, sglang, vllm), or a path to a YAML file."""
    path = Path(name)
    if path.suffix in {".yaml", ".yml"} and path.exists():
        text, label = path.read_text(), str(path)
    else:
        try:
            text = resources.files("campaign.recipes").joinpath(f"{name}.yaml").read_text()
        except FileNotFoundError:
            known = ", ".join(available_recipes())
            raise ConfigError(f"unknown recipe {name!r}", field="recipe", hint=f"use one of: {known}") from None
        label = f"recipe {name}"
    data = _parse_yaml(text, label)
    return _validate(Recipe, data, text, label)


def available_recipes() -> list[str]:
    """Names of the recipes shipped with campaign."""
    return sorted(p.name[:-5] for p in resources.files("campaign.recipes").iterdir() if p.name.endswith(".yaml"))


# ---------------------------------------------------------------------------------------------------------------------
# Experiments


class _HostBase(_Strict):
    """What every kind of host entry may say besides how to reach it."""

    workdir: str = "~/.campaign"
    #: campaign's state folder on the host (its lock and current.json); None: ``lock.host_state_dir()``. Only for
    #: several campaign hosts on one machine (GPU slices of one box, the tests' two sshd): each slice is a box of its
    #: own, and every experiment that uses a slice must name the same folder for it.
    state_dir: str | None = None
    #: Knobs every launch on this host gets, over the baseline's and each variant's (a port, a device of a slice).
    knobs: dict[str, KnobValue] = Field(default_factory=dict)
    #: Environment every launch on this host gets, over the variant's (``CUDA_VISIBLE_DEVICES`` of a slice).
    env: dict[str, str] = Field(default_factory=dict)

    @field_validator("env")
    @classmethod
    def _env_names(cls, v: dict[str, str]) -> dict[str, str]:
        return env_names(v)


class LocalHostConfig(_HostBase):
    """Servers run on this machine."""

    kind: Literal["local"] = "local"


class SSHHostConfig(_HostBase):
    """Servers run on a machine reached over SSH (honours ~/.ssh/config aliases, keys, agent, ProxyJump)."""

    kind: Literal["ssh"]
    host: str
    user: str | None = None
    port: int | None = None
    key: str | None = None
    known_hosts: str | None = None
    accept_new_host_key: bool = False
    ssh_config: str | None = "~/.ssh/config"
    connect_timeout: float = 10.0


class SlurmHostConfig(_HostBase):
    """Servers run as Slurm batch jobs, submitted from this machine (the login node) to the cluster's scheduler.

    ``workdir`` must be on a filesystem the compute nodes share with this machine: the job's output file, PID and
    exit status are written there and read from here.
    """

    kind: Literal["slurm"]
    partition: str | None = None
    sbatch_args: list[str] = Field(default_factory=list)
    #: A slurm.conf other than the default one (passed as SLURM_CONF to every Slurm command).
    slurm_conf: str | None = None
    #: How long a launch waits for its job to start before cancelling it.
    start_timeout_s: float = Field(default=600.0, gt=0)


HostConfig = LocalHostConfig | SSHHostConfig | SlurmHostConfig


class VariantConfig(_Strict):
    """A named set of knob values, plus raw args and env appended to the recipe's rendering."""

    name: str
    knobs: dict[str, KnobValue] = Field(default_factory=dict)
    args: list[str] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._=,+~-]*", v) or len(v) > MAX_VARIANT_NAME:
            raise ValueError(f"use letters, digits and . _ = , + ~ - (up to {MAX_VARIANT_NAME}: it names folders)")
        return v

    @field_validator("env")
    @classmethod
    def _env_names(cls, v: dict[str, str]) -> dict[str, str]:
        return env_names(v)

    @field_validator("args", mode="before")
    @classmethod
    def _args_as_strings(cls, v: Any) -> Any:
        if isinstance(v, list):
            return [a if isinstance(a, str) else str(a) for a in v]
        return v


class BaselineConfig(VariantConfig):
    """The baseline: every variant starts from its knobs, args and env."""

    name: str = "baseline"


class MatrixConfig(_Strict):
    """A cartesian product of knob values; ``zip`` ties axes that move together (same length)."""

    axes: dict[str, list[KnobValue]]
    zip: list[list[str]] = Field(default_factory=list)

    @model_validator(mode="after")
    def _check(self) -> MatrixConfig:
        for group in self.zip:
            missing = [a for a in group if a not in self.axes]
            if missing:
                raise ValueError(f"zip names axes that are not in axes: {missing}")
            lengths = {len(self.axes[a]) for a in group}
            if len(lengths) > 1:
                raise ValueError(f"zipped axes {group} must have the same number of values")
        for name, values in self.axes.items():
            if not values:
                raise ValueError(f"axis {name!r} has no values")
        return self


class SmokeConfig(_Strict):
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


class TimeoutsConfig(_Strict):
    """Deadlines, in seconds (finite: ``.inf`` would make a wait that never ends)."""

    ready_s: float = Field(default=120.0, gt=0, allow_inf_nan=False)
    stop_grace_s: float = Field(default=10.0, ge=0, allow_inf_nan=False)
    restore_ready_s: float | None = Field(default=None, gt=0, allow_inf_nan=False)
    poll_s: float = Field(default=0.1, gt=0, le=1.0, allow_inf_nan=False)


class RetryConfig(_Strict):
    """How often a variant that failed for a transient cause (``campaign.retry``) is launched again, and when."""

    #: Extra attempts per variant after its first (0: never retry).
    budget: int = Field(default=2, ge=0, le=20)
    #: The wait before the first retry, in seconds; each later one waits ``factor`` times longer.
    backoff_s: float = Field(default=2.0, ge=0, le=3600, allow_inf_nan=False)
    factor: float = Field(default=2.0, ge=1, le=10, allow_inf_nan=False)


_DURATION_RE = re.compile(r"\s*(\d+(?:\.\d+)?)\s*(s|m|h)?\s*")


def duration_s(value: float | str) -> float:
    """Seconds from a number or a string such as ``90``, ``45s``, ``30m``, ``2h`` (ValueError otherwise)."""
    if isinstance(value, (int, float)):
        seconds = float(value)
    else:
        m = _DURATION_RE.fullmatch(value)
        if m is None:
            raise ValueError(f"{value!r} is not a duration: write seconds, or a number with s, m or h (30m, 2h)")
        seconds = float(m.group(1)) * {"s": 1, "m": 60, "h": 3600}[m.group(2) or "s"]
    if not 0 < seconds < float("inf"):
        raise ValueError("a deadline must be a positive, finite duration")
    return seconds


HOST_XOR_HOSTS = "give either `host` (one host) or `hosts` (a fleet), not both"
HOSTS_EMPTY = "`hosts` needs at least one host"


class Experiment(_Strict):
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


def expand_matrix(matrix: MatrixConfig, baseline: VariantConfig) -> list[VariantConfig]:
    """The variants of a matrix: the cartesian product over axes, zipped axes moving together."""
    zipped = {a for group in matrix.zip for a in group}
    dims: list[list[dict[str, KnobValue]]] = []
    for group in matrix.zip:
        n = len(matrix.axes[group[0]])
        dims.append([{a: matrix.axes[a][i] for a in group} for i in range(n)])
    for name, values in matrix.axes.items():
        if name not in zipped:
            dims.append([{name: v} for v in values])
    variants = []
    for combo in itertools.product(*dims):
        knobs: dict[str, KnobValue] = {}
        for part in combo:
            knobs.update(part)
        name = matrix_name(",".join(f"{k}={show_value(v)}" for k, v in knobs.items()))
        variants.append(VariantConfig(name=name, knobs={**baseline.knobs, **knobs}))
    return variants


def version_key(version: str) -> tuple[int, ...]:
    """A comparable key of a version string: its leading dotted numbers (``0.5.23.post1`` -> (0, 5, 23))."""
    m = re.match(r"\s*v?(\d+(?:\.\d+)*)", version)
    return tuple(int(p) for p in m.group(1).split(".")) if m else ()


def matrix_name(raw: str) -> str:
    """A folder-safe variant name for a matrix point: any value is allowed in a knob (a model path's ``/``).

    Characters a name may not hold become ``_``; when that changed anything, a short hash of the raw name keeps
    two points apart (``model_path=/a/b`` and ``model_path=_a_b`` stay different variants).
    """
    safe = re.sub(r"[^A-Za-z0-9._=,+~-]", "_", raw)
    if not safe[:1].isalnum():
        safe = "m" + safe
    if safe == raw and len(safe) <= 120:
        return safe
    digest = hashlib.sha256(raw.encode()).hexdigest()[:6]
    return f"{safe[:110]}~{digest}"


# ---------------------------------------------------------------------------------------------------------------------
# Rendering


@dataclass(frozen=True)
class PlannedVariant:
    """A variant resolved against its recipe: the knobs in force and the exact spec that will run."""

    name: str
    knobs: dict[str, KnobValue]
    spec: LaunchSpec
    config: VariantConfig | None = None


def render(
    recipe: Recipe,
    variant: VariantConfig,
    baseline: VariantConfig,
    extra_vars: Mapping[str, str],
    server_version: str | None = None,
) -> PlannedVariant:
    """Render ``variant`` (on top of ``baseline``) to the exact command and env the recipe launches.

    ``server_version`` picks each knob's spelling for that release (the current spelling when None).
    """
    knobs: dict[str, KnobValue] = {**baseline.knobs, **variant.knobs}
    knobs.setdefault("port", recipe.default_port)
    tmpl_vars = {**recipe.vars, **extra_vars}
    command: list[str] = []
    for part in recipe.command:
        try:
            command.append(part.format(**tmpl_vars))
        except KeyError as e:
            raise ConfigError(
                f"recipe {recipe.name} needs the variable {e.args[0]!r}",
                field="vars",
                hint=f"add `vars: {{{e.args[0]}: ...}}` to the experiment",
            ) from None
    env: dict[str, str] = dict(recipe.env)
    for knob, value in knobs.items():
        rule = recipe.knobs.get(knob)
        if rule is None:
            known = ", ".join(sorted(recipe.knobs))
            raise ConfigError(
                f"recipe {recipe.name} has no knob {knob!r}",
                field=f"{variant.name}.knobs.{knob}",
                hint=f"known knobs: {known}; pass anything else through `args` or `env`",
            )
        if value is None:
            continue
        if not isinstance(value, bool):
            _fits_exec(str(value), f"{variant.name}.knobs.{knob}")
        if rule.choices is not None and value not in rule.choices:
            raise ConfigError(
                f"{value!r} is not one of {rule.choices}",
                field=f"{variant.name}.knobs.{knob}",
            )
        spelling = rule.spelled_for(server_version)
        if isinstance(value, bool):
            command.extend(spelling.when_true if value else spelling.when_false)
            if spelling.flag and value:
                command.append(spelling.flag)
        elif spelling.flag:
            command.extend([spelling.flag, str(value)])
        if rule.env:
            env[rule.env] = show_value(value) if isinstance(value, bool) else str(value)
    for extra in recipe.together:
        if all(knobs.get(k) == v for k, v in extra.when.items()):
            command.extend(extra.args)
    command.extend(baseline.args if variant is not baseline else [])
    command.extend(variant.args)
    env.update(baseline.env if variant is not baseline else {})
    env.update(variant.env)
    for arg in command:
        _fits_exec(arg, f"{variant.name}.args")
    for name, value in env.items():
        _fits_exec(f"{name}={value}", f"{variant.name}.env.{name}")
    port = knobs["port"]
    if not isinstance(port, int) or isinstance(port, bool) or not 0 < port < 65536:
        raise ConfigError(f"port must be an integer in 1..65535, not {port!r}", field=f"{variant.name}.knobs.port")
    spec = LaunchSpec(
        recipe=recipe.name,
        command=command,
        env=env,
        port=port,
        ready_marker=recipe.ready_marker,
        health_path=recipe.health_path,
        phases=recipe.phases,
    )
    return PlannedVariant(name=variant.name, knobs=knobs, spec=spec, config=variant)


def _fits_exec(text: str, field: str) -> None:
    """Refuse one argument or environment entry that Linux would not pass to a program (never quoting it back)."""
    size = len(text.encode()) + 1
    if size > MAX_ARG_BYTES:
        raise ConfigError(
            f"{size - 1} bytes, over the {MAX_ARG_BYTES // 1024} KiB Linux passes in one argument or environment "
            "entry: the launch would fail with 'Argument list too long'",
            field=field,
            hint="put the value in a file on the host and pass its path",
        )


def plan(
    experiment: Experiment, recipe: Recipe, only: Sequence[str] = (), server_version: str | None = None
) -> list[PlannedVariant]:
    """Every variant of ``experiment`` rendered, in run order; ``only`` keeps the named ones (baseline kept)."""
    configs = experiment.variant_configs()
    if only:
        names = {c.name for c in configs}
        unknown = [n for n in only if n not in names]
        if unknown:
            raise UsageError(
                f"no variant named {', '.join(map(repr, unknown))} in {experiment.name}",
                hint="variants: " + ", ".join(c.name for c in configs),
            )
        configs = [c for c in configs if c.name in only or (c is experiment.baseline and experiment.run_baseline)]
    tmpl_vars = template_vars(experiment)
    planned = [render(recipe, c, experiment.baseline, tmpl_vars, server_version) for c in configs]
    if experiment.profile is not None and recipe.profile is not None:
        # A server told where its traces go only at launch (vLLM) is launched so for every variant.
        args, env = recipe.profile.launch(experiment.profile.folder(experiment.name))
        for pv in planned:
            pv.spec.command.extend(args)
            pv.spec.env.update(env)
    return planned


def template_vars(experiment: Experiment) -> dict[str, str]:
    """The experiment's ``vars`` as templates see them (over the recipe's own), with ``python`` filled in locally.

    On this machine the server runs under the interpreter that runs campaign, unless the experiment says otherwise.
    """
    tmpl_vars = dict(experiment.vars)
    if experiment.host.kind == "local":
        tmpl_vars.setdefault("python", sys.executable)
    return tmpl_vars


def shell_word(value: str) -> str:
    """``value`` as one shell word: quoted, except that a leading ``~/`` (or a bare ``~``) is the host's $HOME.

    Values never reach a shell unquoted, so without this ``~/venv/bin/python`` would stay literal. Only the
    current user's home is expanded (not ``~other/``); the rest of the value stays quoted, and the expansion is
    inside double quotes, so a home with spaces stays one word.
    """
    if value == "~":
        return '"$HOME"'
    if value.startswith("~/"):
        return '"$HOME"' + shlex.quote(value[1:])
    return shlex.quote(value)


def shell_line(spec: LaunchSpec, *, mask: bool = True) -> str:
    """The launch as one shell line (env assignments, then the command), every value a quoted shell word."""
    env = mask_env(spec.env) if mask else spec.env
    parts = [f"{k}={shell_word(v)}" for k, v in env.items()]
    parts.extend(shell_word(a) for a in spec.command)
    return " ".join(parts)


# ---------------------------------------------------------------------------------------------------------------------
# Loading


@dataclass(frozen=True)
class Loaded:
    """An experiment file, validated, with the text it was read from and the resolved data."""

    experiment: Experiment
    recipe: Recipe
    path: Path
    resolved: dict[str, Any]

    def on_host(self, host: HostConfig) -> Loaded:
        """The experiment as one host of its fleet runs it (``Experiment.for_host``)."""
        return Loaded(self.experiment.for_host(host), self.recipe, self.path, self.resolved)


def resolve_path(name_or_path: str, config_dir: Path = CONFIG_DIR) -> Path:
    """``configs/NAME.yaml`` for a bare name, else the path itself; a clear error when neither exists."""
    p = Path(name_or_path)
    candidates = [p] if p.suffix in {".yaml", ".yml"} or "/" in name_or_path else []
    candidates += [config_dir / f"{name_or_path}.yaml", config_dir / f"{name_or_path}.yml", p]
    for c in candidates:
        if c.is_file():
            return c
    known = sorted(x.stem for x in config_dir.glob("*.y*ml")) if config_dir.is_dir() else []
    raise UsageError(
        f"no experiment {name_or_path!r} (looked for {', '.join(str(c) for c in candidates[:-1])})",
        hint=("experiments in configs/: " + ", ".join(known)) if known else "pass a path to a YAML file",
    )


def load(name_or_path: str, overrides: Sequence[str] = (), config_dir: Path = CONFIG_DIR) -> Loaded:
    """Read, override and validate an experiment file; errors name file, line and field."""
    path = resolve_path(name_or_path, config_dir)
    try:
        text = path.read_text()
    except OSError as e:
        raise ConfigError(f"cannot read: {e.strerror}", file=str(path)) from e
    except UnicodeDecodeError as e:
        raise ConfigError(
            f"not a text file (byte {e.start} is not UTF-8)", file=str(path), hint="an experiment file is YAML text"
        ) from e
    data = _parse_yaml(text, str(path))
    if not isinstance(data, dict):
        raise ConfigError("an experiment file must be a mapping (name:, recipe:, ...)", file=str(path), line=1)
    for item in overrides:
        apply_override(data, item)
    if "hosts" in data and ("host" in data or data["hosts"] == []):
        # Said here, at the line of `hosts`: the model's own check can only point at the top of the file.
        raise ConfigError(
            HOST_XOR_HOSTS if "host" in data else HOSTS_EMPTY,
            file=str(path),
            line=line_of(text, ["hosts"]),
            field="hosts",
            hint="a fleet lists every host under `hosts`, the first one included",
        )
    experiment = _validate(Experiment, data, text, str(path))
    if experiment.bench is not None:
        _validate(BenchSettings, experiment.bench, text, str(path), prefix=["bench"], context={"plan": True})
    _check_profile(experiment, text, str(path))
    try:
        recipe = load_recipe(experiment.recipe)
    except ConfigError as e:
        if e.file is not None:
            raise  # an error inside the recipe's own file, which it names
        raise ConfigError(
            e.detail, file=str(path), line=line_of(text, ["recipe"]), field="recipe", hint=e.hint
        ) from None
    if experiment.hosts:
        _check_fleet(experiment, recipe, text, str(path))
    if len(experiment.fleet) == 1:
        experiment = experiment.for_host(experiment.host)  # one host: its knobs and env are every variant's
    # Render every variant now so knob and variable errors surface, with their line, before anything is touched.
    located: list[tuple[list[str | int], VariantConfig]] = [(["baseline"], experiment.baseline)]
    located += [(["variants", i], v) for i, v in enumerate(experiment.variants)]
    if experiment.matrix is not None:
        located += [(["matrix", "axes"], v) for v in expand_matrix(experiment.matrix, experiment.baseline)]
    for loc, variant in located:
        try:
            render(recipe, variant, experiment.baseline, template_vars(experiment))
        except ConfigError as e:
            knob = (e.field or "").rpartition(".knobs.")[2] if ".knobs." in (e.field or "") else None
            where: list[str | int] = list(loc)
            if knob and loc[0] != "matrix":
                where += ["knobs", knob]
            elif knob:
                where.append(knob)
            raise ConfigError(
                e.detail,
                file=str(path),
                line=line_of(text, where),
                field=".".join(str(p) for p in where) if knob else e.field,
                hint=e.hint,
            ) from None
    return Loaded(experiment=experiment, recipe=recipe, path=path, resolved=data)


def _check_profile(experiment: Experiment, text: str, label: str) -> None:
    """A ``profile:`` block needs a bench, and a level the bench runs."""
    settings, bench = experiment.profile, experiment.bench_settings()
    if settings is None:
        return
    if bench is None:
        raise ConfigError(
            "a profile runs one level of the bench, and this experiment has no bench",
            file=label,
            line=line_of(text, ["profile"]),
            field="profile",
            hint="add a `bench:` section, or remove `profile:`",
        )
    try:
        settings.load_of(bench)
    except ValueError as e:
        raise ConfigError(str(e), file=label, line=line_of(text, ["profile", "level"]), field="profile.level") from None


def _host_key(host: HostConfig) -> tuple[Any, ...]:
    """What makes two host entries the same box: how it is reached, and its state folder."""
    if host.kind == "ssh":
        return (host.kind, host.host, host.port, host.user, host.state_dir)
    if host.kind == "slurm":
        return (host.kind, host.partition, host.slurm_conf, host.state_dir)
    return (host.kind, host.state_dir)


def _check_fleet(experiment: Experiment, recipe: Recipe, text: str, label: str) -> None:
    """Each ``hosts`` entry a box of its own, and its knobs ones the recipe has and no matrix axis moves."""
    seen: dict[tuple[Any, ...], int] = {}
    axes = set(experiment.matrix.axes) if experiment.matrix is not None else set()
    for i, host in enumerate(experiment.fleet):
        key = _host_key(host)
        if key in seen:
            raise ConfigError(
                f"the same box as hosts.{seen[key]} (one lock and one known-good per box: it would wait on itself)",
                file=label,
                line=line_of(text, ["hosts", i]),
                field=f"hosts.{i}",
                hint="remove it, or, for two slices of one machine, give each its own state_dir and port knob",
            )
        seen[key] = i
        for knob in host.knobs:
            where: list[str | int] = ["hosts", i, "knobs", knob]
            if knob not in recipe.knobs:
                raise ConfigError(
                    f"recipe {recipe.name} has no knob {knob!r}",
                    file=label,
                    line=line_of(text, where),
                    field=".".join(map(str, where)),
                    hint=f"known knobs: {', '.join(sorted(recipe.knobs))}",
                )
            if knob in axes:
                raise ConfigError(
                    f"{knob!r} is a matrix axis: a host knob would override the axis on that host",
                    file=label,
                    line=line_of(text, where),
                    field=".".join(map(str, where)),
                    hint="set it per host or move it on the matrix, not both",
                )


def apply_override(data: dict[str, Any], item: str) -> None:
    """Apply one ``--set key.path=value`` to raw experiment data (value parsed as YAML; list indexes allowed)."""
    if "=" not in item:
        raise UsageError(f"--set {item!r}: expected key.path=value", hint="e.g. --set timeouts.ready_s=30")
    key, raw = item.split("=", 1)
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError:
        value = raw
    parts = key.strip().split(".")
    if not all(parts):
        raise UsageError(f"--set {item!r}: empty key segment")
    node: Any = data
    for i, part in enumerate(parts):
        last = i == len(parts) - 1
        if isinstance(node, list):
            if not part.isdigit() or int(part) >= len(node):
                raise UsageError(f"--set {item!r}: {'.'.join(parts[: i + 1])} is not an index of a list of {len(node)}")
            if last:
                node[int(part)] = value
            else:
                node = node[int(part)]
        elif isinstance(node, dict):
            if last:
                node[part] = value
            else:
                node = node.setdefault(part, {})
        else:
            raise UsageError(f"--set {item!r}: {'.'.join(parts[:i])} is a value, not a mapping")


class _UniqueKeyLoader(yaml.SafeLoader):
    """The safe loader, refusing a mapping that repeats a key (YAML's last-one-wins would hide a typo)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, int] = {}
        for key_node, _value in node.value:
            key = self.construct_object(key_node, deep=True)
            try:
                first = seen.get(key)
            except TypeError:
                continue  # an unhashable key: the base constructor gives the proper error
            if first is not None:
                raise _DuplicateKey(key, first, key_node.start_mark.line + 1)
            seen[key] = key_node.start_mark.line + 1
        return super().construct_mapping(node, deep=deep)


class _DuplicateKey(Exception):
    def __init__(self, key: Any, first: int, line: int) -> None:
        super().__init__(key)
        self.key, self.first, self.line = key, first, line


def _parse_yaml(text: str, label: str) -> Any:
    try:
        return yaml.load(text, Loader=_UniqueKeyLoader)  # a SafeLoader subclass: no arbitrary objects
    except _DuplicateKey as e:
        raise ConfigError(
            f"duplicate key (first given on line {e.first}); YAML would silently keep only the last one",
            file=label,
            line=e.line,
            field=str(e.key),
            hint="remove one of the two",
        ) from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        line = mark.line + 1 if mark is not None else None
        problem = getattr(e, "problem", None) or str(e)
        raise ConfigError(f"invalid YAML: {problem}", file=label, line=line) from None


def _validate(
    model: type[M], data: Any, text: str, label: str, prefix: Sequence[str] = (), context: dict[str, Any] | None = None
) -> M:
    try:
        return model.model_validate(data, context=context)
    except ValidationError as e:
        err = e.errors(include_url=False)[0]
        loc = [*prefix, *(p for p in err["loc"] if not (isinstance(p, str) and p in {"local", "ssh", "slurm"}))]
        field = ".".join(str(p) for p in loc) or None
        msg = str(err["msg"]).removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            msg = "unknown field (check its spelling)"
        elif err["type"] == "missing":
            msg = "this field is required"
        elif err["type"] in ("union_tag_not_found", "union_tag_invalid"):
            msg = "say which kind of host this is: kind: local, ssh or slurm"
        more = len(e.errors()) - 1
        if more:
            msg += f" (and {more} more error{'s' if more > 1 else ''})"
        raise ConfigError(msg, file=label, line=line_of(text, loc), field=field) from None


def line_of(text: str, loc: Sequence[int | str]) -> int | None:
    """The 1-based line of the YAML node at ``loc`` (or its nearest existing parent)."""
    try:
        node: yaml.Node | None = yaml.compose(text)
    except yaml.YAMLError:
        return None
    best = node.start_mark.line + 1 if node is not None else None
    for part in loc:
        if isinstance(node, yaml.MappingNode):
            for k, v in node.value:
                if isinstance(k, yaml.ScalarNode) and k.value == str(part):
                    best = k.start_mark.line + 1
                    node = v
                    break
            else:
                return best
        elif isinstance(node, yaml.SequenceNode) and isinstance(part, int) and part < len(node.value):
            node = node.value[part]
            best = node.start_mark.line + 1
        else:
            return best
    return best
