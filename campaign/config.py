"""Experiment and recipe files: pydantic models, YAML with line numbers in errors, --set overrides, matrices.

An experiment file names a host, a recipe, a baseline and either a list of variants or a matrix of knobs. Loading it
gives an ``Experiment``; ``Experiment.plan()`` turns it into ``PlannedVariant`` values, each with the exact
``LaunchSpec`` that will run. Every validation error is a ``ConfigError`` naming the file, the line and the field.
"""

from __future__ import annotations

import itertools
import re
import shlex
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TypeVar

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from campaign.errors import ConfigError, UsageError
from campaign.records import KnobValue, LaunchSpec

CONFIG_DIR = Path("configs")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_SECRET_NAME = re.compile(r"TOKEN|KEY|SECRET|PASSWORD|PASSWD|CREDENTIAL", re.IGNORECASE)
MASK = "***"
M = TypeVar("M", bound=BaseModel)

if TYPE_CHECKING:
    from campaign.bench import BenchSettings


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


# ---------------------------------------------------------------------------------------------------------------------
# Recipes


class KnobRule(_Strict):
    """How one knob becomes flags: ``flag VALUE``, fixed args when true/false, or an env variable."""

    flag: str | None = None
    when_true: list[str] = Field(default_factory=list)
    when_false: list[str] = Field(default_factory=list)
    env: str | None = None
    choices: list[KnobValue] | None = None


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


class LocalHostConfig(_Strict):
    """Servers run on this machine."""

    kind: Literal["local"] = "local"
    workdir: str = "~/.campaign"


class SSHHostConfig(_Strict):
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
    workdir: str = "~/.campaign"


class VariantConfig(_Strict):
    """A named set of knob values, plus raw args and env appended to the recipe's rendering."""

    name: str
    knobs: dict[str, KnobValue] = Field(default_factory=dict)
    args: list[str] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._=,+~-]*", v):
            raise ValueError("use letters, digits and . _ = , + ~ - (it names folders)")
        return v

    @field_validator("env")
    @classmethod
    def _env_names(cls, v: dict[str, str]) -> dict[str, str]:
        for k in v:
            if not _ENV_NAME.match(k):
                raise ValueError(f"{k!r} is not a valid environment variable name")
        return v

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
    """Questions with known answers asked after readiness: 17×23 plus seeded random a×b and a+b."""

    enabled: bool = True
    questions: int = Field(default=4, ge=0, le=1000)
    seed: int = 0
    max_tokens: int = Field(default=8, ge=1)
    timeout_s: float = Field(default=30.0, gt=0)


class TimeoutsConfig(_Strict):
    """Deadlines, in seconds."""

    ready_s: float = Field(default=120.0, gt=0)
    stop_grace_s: float = Field(default=10.0, ge=0)
    restore_ready_s: float | None = Field(default=None, gt=0)
    poll_s: float = Field(default=0.1, gt=0, le=1.0)


class Experiment(_Strict):
    """One experiment file: where, what, which variants, how to check them, and what to leave running."""

    name: str
    description: str = ""
    host: LocalHostConfig | SSHHostConfig = Field(default_factory=LocalHostConfig, discriminator="kind")
    recipe: str
    vars: dict[str, str] = Field(default_factory=dict)
    baseline: BaselineConfig = Field(default_factory=BaselineConfig)
    variants: list[VariantConfig] = Field(default_factory=list)
    matrix: MatrixConfig | None = None
    isolate: bool = False
    smoke: SmokeConfig = Field(default_factory=SmokeConfig)
    #: The ``bench:`` section, validated by ``campaign.bench.BenchSettings`` at load time (see ``bench_settings``).
    bench: dict[str, Any] | None = None
    timeouts: TimeoutsConfig = Field(default_factory=TimeoutsConfig)
    at_end: Literal["known_good", "last", "stop"] = "known_good"
    #: Run the baseline first (it becomes the known-good the variants are restored to).
    run_baseline: bool = True

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
        from campaign.bench import BenchSettings

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
        name = ",".join(f"{k}={_fmt(v)}" for k, v in knobs.items())
        variants.append(VariantConfig(name=name, knobs={**baseline.knobs, **knobs}))
    return variants


def _fmt(v: KnobValue) -> str:
    if isinstance(v, bool):
        return "on" if v else "off"
    return str(v)


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
    recipe: Recipe, variant: VariantConfig, baseline: VariantConfig, extra_vars: Mapping[str, str]
) -> PlannedVariant:
    """Render ``variant`` (on top of ``baseline``) to the exact command and env the recipe launches."""
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
        if rule.choices is not None and value not in rule.choices:
            raise ConfigError(
                f"{value!r} is not one of {rule.choices}",
                field=f"{variant.name}.knobs.{knob}",
            )
        if isinstance(value, bool):
            command.extend(rule.when_true if value else rule.when_false)
            if rule.flag and value:
                command.append(rule.flag)
        elif rule.flag:
            command.extend([rule.flag, str(value)])
        if rule.env:
            env[rule.env] = _fmt(value) if isinstance(value, bool) else str(value)
    command.extend(baseline.args if variant is not baseline else [])
    command.extend(variant.args)
    env.update(baseline.env if variant is not baseline else {})
    env.update(variant.env)
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


def plan(experiment: Experiment, recipe: Recipe, only: Sequence[str] = ()) -> list[PlannedVariant]:
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
    tmpl_vars = dict(experiment.vars)
    if experiment.host.kind == "local":
        # On this machine the server runs under the interpreter that runs campaign, unless told otherwise.
        tmpl_vars.setdefault("python", sys.executable)
    return [render(recipe, c, experiment.baseline, tmpl_vars) for c in configs]


def is_secret(name: str) -> bool:
    """True for env names that hold secrets (TOKEN, KEY, SECRET, PASSWORD...): their values are never shown."""
    return bool(_SECRET_NAME.search(name))


def masked_env(env: Mapping[str, str]) -> dict[str, str]:
    """``env`` with secret values replaced by ``***``."""
    return {k: (MASK if is_secret(k) else v) for k, v in env.items()}


def masked_spec(spec: LaunchSpec) -> LaunchSpec:
    """A copy of ``spec`` safe to write to reports and show: secret env values masked."""
    return spec.model_copy(update={"env": masked_env(spec.env)})


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
    env = masked_env(spec.env) if mask else spec.env
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
    data = _parse_yaml(text, str(path))
    if not isinstance(data, dict):
        raise ConfigError("an experiment file must be a mapping (name:, recipe:, ...)", file=str(path), line=1)
    for item in overrides:
        apply_override(data, item)
    experiment = _validate(Experiment, data, text, str(path))
    if experiment.bench is not None:
        from campaign.bench import BenchSettings

        _validate(BenchSettings, experiment.bench, text, str(path), prefix=["bench"])
    recipe = load_recipe(experiment.recipe)
    # Render every variant now so knob and variable errors surface, with their line, before anything is touched.
    located: list[tuple[list[str | int], VariantConfig]] = [(["baseline"], experiment.baseline)]
    located += [(["variants", i], v) for i, v in enumerate(experiment.variants)]
    if experiment.matrix is not None:
        located += [(["matrix", "axes"], v) for v in expand_matrix(experiment.matrix, experiment.baseline)]
    for loc, variant in located:
        try:
            render(recipe, variant, experiment.baseline, experiment.vars | {"python": sys.executable})
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
                line=_line_of(text, where),
                field=".".join(str(p) for p in where) if knob else e.field,
                hint=e.hint,
            ) from None
    return Loaded(experiment=experiment, recipe=recipe, path=path, resolved=data)


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


def _parse_yaml(text: str, label: str) -> Any:
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        line = mark.line + 1 if mark is not None else None
        problem = getattr(e, "problem", None) or str(e)
        raise ConfigError(f"invalid YAML: {problem}", file=label, line=line) from None


def _validate(model: type[M], data: Any, text: str, label: str, prefix: Sequence[str] = ()) -> M:
    try:
        return model.model_validate(data)
    except ValidationError as e:
        err = e.errors(include_url=False)[0]
        loc = [*prefix, *(p for p in err["loc"] if not (isinstance(p, str) and p in {"local", "ssh"}))]
        field = ".".join(str(p) for p in loc) or None
        msg = err["msg"]
        if err["type"] == "extra_forbidden":
            msg = "unknown field (check its spelling)"
        elif err["type"] == "missing":
            msg = "this field is required"
        more = len(e.errors()) - 1
        if more:
            msg += f" (and {more} more error{'s' if more > 1 else ''})"
        raise ConfigError(msg, file=label, line=_line_of(text, loc), field=field) from None


def _line_of(text: str, loc: Sequence[int | str]) -> int | None:
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
