"""Recipes: how one server family is launched and watched (a data file in campaign/recipes/), and their loading."""

from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from campaign.config.fields import Strict, regex, version_key
from campaign.config.parser import parse_yaml, validate
from campaign.errors import ConfigError
from campaign.records import KnobValue
from campaign.records.profile import ProfileEndpoints


class Spelling(Strict):
    """How a knob was spelled by the releases before ``before`` (a server version), where upstream renamed it."""

    before: str
    flag: str | None = None
    when_true: list[str] = Field(default_factory=list)
    when_false: list[str] = Field(default_factory=list)


class EffectiveRule(Strict):
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
        return regex(v)


class KnobRule(Strict):
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


class Together(Strict):
    """Args added when several knobs hold the given values at once (vLLM: compile off with graphs on)."""

    when: dict[str, KnobValue]
    args: list[str]


class ParserSource(Strict):
    """Which Python builds the server's parser on the host, and which server's parser it builds."""

    python: str
    kind: Literal["vllm", "sglang"]


class HelpSpec(Strict):
    """How to read the server's own flag list: the command that prints ``--help``, and where flags start.

    ``launcher`` is how many words of the recipe's ``command`` start the server (``python3 -m sglang.launch_server``
    is 3): every word after them that looks like a flag is checked against the help text.
    """

    command: list[str]
    launcher: int = Field(ge=0)
    #: The command whose last output line is the build's version for the help cache (default: the
    #: ``server_version`` probe); a server whose flags change without a release says more than its version here.
    version: list[str] | None = None
    #: The server's own argparse parser, dumped on the host by ``campaign/parser_dump.py`` run with the engine's
    #: Python (``python``, a template like ``command``) for ``kind`` (``vllm`` or ``sglang``): flags are checked
    #: against it (aliases, abbreviations, types, choices), and against the help text only when it cannot load.
    parser: ParserSource | None = None


class ParkCall(Strict):
    """One HTTP call of a server's sleep mode: method, path (a query string allowed) and JSON body."""

    path: str
    method: Literal["POST", "GET"] = "POST"
    body: dict[str, Any] | None = None


class Parking(Strict):
    """A recipe's ``park:`` block: how its server parks (frees the GPU, the process kept alive) and wakes.

    ``via: endpoints`` calls the server's own sleep mode (vLLM's ``POST /sleep?level=1`` and ``/wake_up``, SGLang's
    ``/release_memory_occupation`` and ``/resume_memory_occupation``, the reference server's vLLM-shaped routes);
    ``is_sleeping`` is the GET path that answers ``{"is_sleeping": bool}``, where the server has one.
    ``via: cuda_checkpoint`` parks a server without such endpoints through NVIDIA's ``cuda-checkpoint --toggle``
    on each process of its group that holds GPU memory (the driver moves that memory to host memory and back).
    ``launch_args`` and ``launch_env`` are what a launch needs for parking to work later (vLLM's
    ``--enable-sleep-mode`` and ``VLLM_SERVER_DEV_MODE=1``, SGLang's ``--enable-memory-saver``).
    """

    via: Literal["endpoints", "cuda_checkpoint"] = "endpoints"
    sleep: ParkCall | None = None
    wake: ParkCall | None = None
    is_sleeping: str | None = None
    launch_args: list[str] = Field(default_factory=list)
    launch_env: dict[str, str] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _calls(self) -> Parking:
        if self.via == "endpoints" and (self.sleep is None or self.wake is None):
            raise ValueError("park via endpoints needs both sleep and wake")
        return self


class Recipe(Strict):
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
    #: How the server parks and wakes (``campaign.parking``); None: it cannot be parked, only stopped.
    park: Parking | None = None

    @field_validator("ready_marker")
    @classmethod
    def _regex(cls, v: str) -> str:
        return regex(v)

    @field_validator("phases")
    @classmethod
    def _phase_regexes(cls, v: dict[str, str]) -> dict[str, str]:
        for name, rx in v.items():
            regex(rx, f"phase {name!r}: ")
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
    data = parse_yaml(text, label)
    return validate(Recipe, data, text, label)


def available_recipes() -> list[str]:
    """Names of the recipes shipped with campaign."""
    return sorted(p.name[:-5] for p in resources.files("campaign.recipes").iterdir() if p.name.endswith(".yaml"))
