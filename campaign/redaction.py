"""Secrets: which names hold one, and the one rule that masks them wherever something is written or shown.

A secret is the value of an environment variable (or a config key, or an HTTP header) whose name contains TOKEN,
KEY, SECRET, PASSWORD, PASSWD, CREDENTIAL, AUTHORIZATION or COOKIE, in any case. Its value is shown as ``***``: in
reports (``mask_spec``, ``mask_bench`` for a bench's API key and headers), the experiment copy a run keeps
(``mask_tree``), the terminal (``mask_env``), host error messages (``mask_command``) and the server logs we copy
and stream (``Redactor``, which also finds the values inside free text).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

from campaign.records import BenchSettings, LaunchSpec

MASK = "***"
_SECRET_WORDS = "TOKEN|KEY|SECRET|PASSWORD|PASSWD|CREDENTIAL|AUTHORIZATION|COOKIE"
_SECRET_NAME = re.compile(_SECRET_WORDS, re.IGNORECASE)
#: ``NAME=value`` on a command line, where NAME looks like a secret.
_SECRET_ASSIGNMENT = re.compile(rf"\b([A-Za-z0-9_]*(?:{_SECRET_WORDS})[A-Za-z0-9_]*)=(\S+)", re.IGNORECASE)
#: Values shorter than this are not searched for in free text: masking every "1" of a log would hide the log.
_MIN_VALUE = 4


def is_secret(name: str) -> bool:
    """True for names that hold secrets (TOKEN, KEY, SECRET, PASSWORD, ...): their values are never shown."""
    return bool(_SECRET_NAME.search(name))


def mask_env(env: Mapping[str, str]) -> dict[str, str]:
    """``env`` with secret values replaced by ``***``."""
    return {k: (MASK if is_secret(k) else v) for k, v in env.items()}


def mask_spec(spec: LaunchSpec) -> LaunchSpec:
    """A copy of ``spec`` safe to write to reports and show: secret env values masked."""
    return spec.model_copy(update={"env": mask_env(spec.env)})


def mask_bench(settings: BenchSettings) -> BenchSettings:
    """A copy of bench ``settings`` safe to store and show: the API key and secret-looking headers masked."""
    return settings.model_copy(
        update={
            "api_key": None if settings.api_key is None else MASK,
            "headers": mask_env(settings.headers),
        }
    )


def bench_secrets(settings: BenchSettings) -> list[str]:
    """The secret values a bench sends (to mask wherever a server might echo them back), longest first."""
    values = {v for k, v in settings.request_headers().items() if is_secret(k) and len(v) >= _MIN_VALUE}
    if settings.api_key and len(settings.api_key) >= _MIN_VALUE:
        values.add(settings.api_key)
    return sorted(values, key=len, reverse=True)


def mask_tree(node: Any, key: str = "") -> Any:
    """Parsed YAML/JSON with every string under a secret-looking key masked (lists inherit their key)."""
    if isinstance(node, dict):
        return {k: mask_tree(v, str(k)) for k, v in node.items()}
    if isinstance(node, list):
        return [mask_tree(v, key) for v in node]
    if isinstance(node, str) and key and is_secret(key):
        return MASK
    return node


def mask_command(command: str) -> str:
    """``command`` with the value of every secret-looking ``NAME=value`` assignment masked."""
    return _SECRET_ASSIGNMENT.sub(rf"\1={MASK}", command)


class Redactor:
    """Masks known secret values wherever they appear in text we keep or show (log lines, log copies)."""

    def __init__(self, specs: Iterable[LaunchSpec]) -> None:
        values = {v for s in specs for k, v in s.env.items() if is_secret(k) and len(v) >= _MIN_VALUE}
        # Longest first, so a secret that contains another is masked whole.
        self._values = sorted(values, key=len, reverse=True)

    def __call__(self, text: str) -> str:
        """``text`` with every secret value masked."""
        for v in self._values:
            text = text.replace(v, MASK)
        return text

    def bytes(self, data: bytes) -> bytes:
        """``data`` with every secret value masked."""
        for v in self._values:
            data = data.replace(v.encode(), MASK.encode())
        return data
