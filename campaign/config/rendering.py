"""Rendering: a variant resolved against its recipe to the exact command and env that will run."""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from campaign.config.experiment import Experiment
from campaign.config.recipe import Recipe
from campaign.config.variant import VariantConfig
from campaign.errors import ConfigError, UsageError
from campaign.records import KnobValue, LaunchSpec, show_value

#: Linux refuses to exec a program with one argument or environment entry of this many bytes or more (MAX_ARG_STRLEN,
#: its NUL included): such a launch fails with "Argument list too long" after the box was stopped for it.
MAX_ARG_BYTES = 128 * 1024


@dataclass(frozen=True)
class PlannedVariant:
    """A variant resolved against its recipe: the knobs in force and the exact spec that will run."""

    name: str
    knobs: dict[str, KnobValue]
    spec: LaunchSpec
    config: VariantConfig | None = None


#: How many variants this process has rendered (``renders()``).
_renders = 0


def renders() -> int:
    """How many variants this process has rendered so far: what a test reads to count a run's renders."""
    return _renders


def knobs_in_force(recipe: Recipe, variant: VariantConfig, baseline: VariantConfig) -> dict[str, KnobValue]:
    """The knobs ``variant`` runs with: the baseline's, its own over them, the recipe's default port."""
    knobs: dict[str, KnobValue] = {**baseline.knobs, **variant.knobs}
    knobs.setdefault("port", recipe.default_port)
    return knobs


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
    global _renders
    _renders += 1
    knobs = knobs_in_force(recipe, variant, baseline)
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


def chosen(experiment: Experiment, only: Sequence[str] = ()) -> list[VariantConfig]:
    """The variants a run of ``experiment`` runs, in order, unrendered; ``only`` keeps the named ones (baseline kept).

    ``UsageError`` names a variant ``only`` asks for that the experiment does not have.
    """
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
    return configs


def plan(
    experiment: Experiment, recipe: Recipe, only: Sequence[str] = (), server_version: str | None = None
) -> list[PlannedVariant]:
    """Every variant of ``experiment`` rendered, in run order; ``only`` keeps the named ones (baseline kept)."""
    configs = chosen(experiment, only)
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
