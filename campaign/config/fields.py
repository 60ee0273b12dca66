"""The pieces every experiment and recipe model shares: the strict base model, names, env names, durations, versions."""

from __future__ import annotations

import re

from pydantic import BaseModel, ConfigDict

#: Names that become folders (experiments, run ids): no path separators, no leading dot, so never `.` or `..`.
NAME_RE = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9._-]*")
#: A variant's name is part of its attempt folder's name, which a file system caps at 255 bytes.
MAX_VARIANT_NAME = 120
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def env_names(env: dict[str, str]) -> dict[str, str]:
    """``env`` unchanged when every key is a valid environment variable name (ValueError otherwise)."""
    for k in env:
        if not _ENV_NAME.match(k):
            raise ValueError(f"{k!r} is not a valid environment variable name")
    return env


class Strict(BaseModel):
    """A model that refuses unknown fields (a misspelt key is an error, never silently ignored)."""

    model_config = ConfigDict(extra="forbid")


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


def version_key(version: str) -> tuple[int, ...]:
    """A comparable key of a version string: its leading dotted numbers (``0.5.23.post1`` -> (0, 5, 23))."""
    m = re.match(r"\s*v?(\d+(?:\.\d+)*)", version)
    return tuple(int(p) for p in m.group(1).split(".")) if m else ()


def regex(pattern: str, what: str = "") -> str:
    """``pattern`` unchanged when it compiles (ValueError naming ``what`` otherwise)."""
    try:
        re.compile(pattern)
    except re.error as e:
        raise ValueError(f"{what}not a valid regular expression: {e}") from e
    return pattern
