"""Experiment and recipe files: pydantic models, YAML with line numbers in errors, --set overrides, matrices.

An experiment file names a host, a recipe, a baseline and either a list of variants or a matrix of knobs. ``load``
gives a ``Loaded`` (the ``Experiment`` and its ``Recipe``); ``plan`` turns it into ``PlannedVariant`` values, each
with the exact ``LaunchSpec`` that will run. Every validation error is a ``ConfigError`` naming the file, the line
and the field.

One module per concept: ``fields`` (the strict base model, names, durations), ``recipe``, ``host`` (host entries),
``variant``, ``matrix``, ``experiment``, ``rendering`` (variant → launch spec), ``shell`` (quoting), ``parser`` (YAML
with line numbers), ``override`` (``--set``) and ``loader`` (the file as a whole). Callers import from here.
"""

from campaign.config.experiment import (
    HOST_XOR_HOSTS,
    HOSTS_EMPTY,
    Experiment,
    RetryConfig,
    SmokeConfig,
    TimeoutsConfig,
)
from campaign.config.fields import MAX_VARIANT_NAME, NAME_RE, Strict, duration_s, env_names, version_key
from campaign.config.host import HostConfig, LocalHostConfig, SlurmHostConfig, SSHHostConfig
from campaign.config.loader import CONFIG_DIR, Loaded, load, resolve_path
from campaign.config.matrix import MatrixConfig, expand_matrix, matrix_name
from campaign.config.override import apply_override
from campaign.config.parser import line_of
from campaign.config.recipe import (
    EffectiveRule,
    HelpSpec,
    KnobRule,
    ParkCall,
    Parking,
    Recipe,
    Spelling,
    Together,
    available_recipes,
    load_recipe,
)
from campaign.config.rendering import (
    MAX_ARG_BYTES,
    PlannedVariant,
    chosen,
    knobs_in_force,
    plan,
    render,
    renders,
    template_vars,
)
from campaign.config.shell import shell_line, shell_word
from campaign.config.variant import BaselineConfig, VariantConfig

__all__ = [
    "CONFIG_DIR",
    "HOSTS_EMPTY",
    "HOST_XOR_HOSTS",
    "MAX_ARG_BYTES",
    "MAX_VARIANT_NAME",
    "NAME_RE",
    "BaselineConfig",
    "EffectiveRule",
    "Experiment",
    "HelpSpec",
    "HostConfig",
    "KnobRule",
    "Loaded",
    "LocalHostConfig",
    "MatrixConfig",
    "ParkCall",
    "Parking",
    "PlannedVariant",
    "Recipe",
    "RetryConfig",
    "SSHHostConfig",
    "SlurmHostConfig",
    "SmokeConfig",
    "Spelling",
    "Strict",
    "TimeoutsConfig",
    "Together",
    "VariantConfig",
    "apply_override",
    "available_recipes",
    "chosen",
    "duration_s",
    "env_names",
    "expand_matrix",
    "knobs_in_force",
    "line_of",
    "load",
    "load_recipe",
    "matrix_name",
    "plan",
    "render",
    "renders",
    "resolve_path",
    "shell_line",
    "shell_word",
    "template_vars",
    "version_key",
]
