"""A server family as diagnosis sees it: the recipe's ready marker and its knobs' flags.

Inside a run the loop passes the recipe's name (``server=``); diagnosis reads that recipe (campaign/recipes/NAME.yaml)
for what proves the server ready and how each knob is spelled, so no server name or flag spelling is written in the
diagnosis code or repeated in the rules file. A log with no recipe (``campaign diagnose FILE`` without ``--server``)
is judged by the generic patterns of the rules file alone.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass, field
from pathlib import Path

from campaign.config import available_recipes, load_recipe
from campaign.errors import ConfigError

#: A number as a server prints its own arguments (0.85, .85, 512).
_NUMBER = r"(\d+\.\d+|\.\d+|\d+)\b"


@dataclass(frozen=True)
class Family:
    """What diagnosis takes from one recipe: its name (the key of per-server hints), ready marker and knob flags."""

    name: str
    ready_marker: str
    #: knob -> the flag this server spells it with.
    flags: dict[str, str] = field(default_factory=dict)


@functools.cache
def family_of(server: str | None) -> Family | None:
    """The family of the recipe named ``server`` (shipped, or a recipe file's path), or None (no such recipe)."""
    if not server:
        return None
    by_path = Path(server).suffix in {".yaml", ".yml"} and Path(server).is_file()
    if not by_path and (not re.fullmatch(r"[\w-]+", server) or server not in available_recipes()):
        return None
    try:
        recipe = load_recipe(server)
    except ConfigError:
        return None
    flags = {name: rule.flag for name, rule in recipe.knobs.items() if rule.flag}
    return Family(name=recipe.name, ready_marker=recipe.ready_marker, flags=flags)


@functools.cache
def flags_by_knob() -> dict[str, dict[str, str]]:
    """knob -> family -> flag, over every shipped recipe (the generic hint names them all)."""
    out: dict[str, dict[str, str]] = {}
    for name in available_recipes():
        fam = family_of(name)
        for knob, flag in (fam.flags if fam else {}).items():
            out.setdefault(knob, {})[name] = flag
    return out


@functools.cache
def knob_readers(first: str | None = None) -> dict[str, tuple[re.Pattern[str], ...]]:
    """knob -> the compiled ``reader_sources`` (group 1 is the value), the flag ``first`` read before the others."""
    out = {}
    for knob, pats in reader_sources().items():
        own = _reader_patterns(first) if first in flags_by_knob()[knob].values() else []
        out[knob] = tuple(re.compile(p, re.IGNORECASE) for p in dict.fromkeys([*own, *pats]))
    return out


def _reader_patterns(flag: str | None) -> list[str]:
    if not flag:
        return []
    attr = flag.lstrip("-").split(".")[-1].replace("-", "_")
    return [rf"(?<![\w-]){re.escape(flag)}[ =]{_NUMBER}", rf"\b{re.escape(attr)}\W{{1,3}}{_NUMBER}"]


@functools.cache
def reader_sources() -> dict[str, tuple[str, ...]]:
    """knob -> regexes whose group 1 is its value as a server printed its own arguments, from the recipes' flags.

    A flag ``--mem-fraction-static`` is read from a command line (``--mem-fraction-static 0.8``) and from the argument
    dump its Python name appears in (``mem_fraction_static=0.8``, ``'mem_fraction_static': 0.8``,
    ``gpu_memory_utilization (0.9)``).
    """
    out: dict[str, tuple[str, ...]] = {}
    for knob, flags in flags_by_knob().items():
        out[knob] = tuple(p for flag in dict.fromkeys(flags.values()) for p in _reader_patterns(flag))
    return out
