"""Loading an experiment file: read, override, validate, check the fleet and profile, render every variant once."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from campaign.config.experiment import HOST_XOR_HOSTS, HOSTS_EMPTY, Experiment
from campaign.config.host import HostConfig
from campaign.config.matrix import expand_matrix
from campaign.config.override import apply_override
from campaign.config.parser import line_of, parse_yaml, validate
from campaign.config.recipe import Recipe, load_recipe
from campaign.config.rendering import render, template_vars
from campaign.config.variant import VariantConfig
from campaign.errors import ConfigError, UsageError
from campaign.records import BenchSettings

CONFIG_DIR = Path("configs")


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
    data = parse_yaml(text, str(path))
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
    experiment = validate(Experiment, data, text, str(path))
    if experiment.bench is not None:
        validate(BenchSettings, experiment.bench, text, str(path), prefix=["bench"], context={"plan": True})
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
