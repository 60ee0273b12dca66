"""Shell words: a launch as one shell line, every config value quoted (values never reach a shell unquoted)."""

from __future__ import annotations

import shlex

from campaign.records import LaunchSpec
from campaign.redaction import mask_env


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
