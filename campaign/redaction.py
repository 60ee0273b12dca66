"""Secrets: which names hold one, and the one rule that masks them wherever something is written or shown.

A secret is the value of an environment variable (or a config key, or an HTTP header) whose name contains TOKEN,
KEY, SECRET, PASSWORD, PASSWD, CREDENTIAL, AUTHORIZATION or COOKIE, in any case. Its value is shown as ``***``: in
reports (``mask_spec``, ``mask_bench`` for a bench's API key and headers), the experiment copy a run keeps
(``mask_tree``), the terminal (``mask_env``), host error messages (``mask_command``) and the server logs we copy
and stream (``Redactor``, which also finds the values inside free text; ``logs --follow`` learns them from the
launch script on the host, since every stored copy is masked). A secret given as a server flag (``--api-key X``,
``--hf-token=X``: a flag one of whose words is token, key, secret, password, credential, authorization or cookie)
is masked the same way in reports, the experiment copy, the plan and logs (``mask_args``). The server itself still
receives it on its command line, where ``ps`` shows it: give it through the environment instead where the server
reads one (vLLM: ``VLLM_API_KEY``).
"""

from __future__ import annotations

import re
import shlex
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
#: A command-line flag holds a secret when one of its words (split at - and _) is one of these: ``--api-key``,
#: ``--hf-token``; ``--tokenizer`` and ``--max-num-batched-tokens`` do not.
_SECRET_FLAG_WORDS = frozenset(
    {"token", "key", "apikey", "secret", "password", "passwd", "credential", "credentials", "authorization", "cookie"}
)


def is_secret_flag(arg: str) -> bool:
    """True for a flag such as ``--api-key`` (or ``--api-key=value``) whose value is a secret."""
    if not arg.startswith("-"):
        return False
    name = arg.lstrip("-").split("=", 1)[0].lower()
    return any(word in _SECRET_FLAG_WORDS for word in re.split(r"[-_]", name))


def secret_args(args: Iterable[str]) -> list[str]:
    """The secret values a command line carries: the word after ``--api-key``, or after ``--api-key=``."""
    found: list[str] = []
    items = list(args)
    for i, arg in enumerate(items):
        if is_secret_flag(arg):
            if "=" in arg:
                found.append(arg.split("=", 1)[1])
            elif i + 1 < len(items):
                found.append(items[i + 1])
    return found


def mask_args(args: Iterable[str]) -> list[str]:
    """A command line with the value of every secret flag (``--api-key X``, ``--api-key=X``) masked."""
    out: list[str] = []
    hide_next = False
    for arg in args:
        if hide_next:
            out.append(MASK)
            hide_next = False
        elif is_secret_flag(arg) and "=" in arg:
            out.append(arg.split("=", 1)[0] + "=" + MASK)
        else:
            out.append(arg)
            hide_next = is_secret_flag(arg)
    return out


def is_secret(name: str) -> bool:
    """True for names that hold secrets (TOKEN, KEY, SECRET, PASSWORD, ...): their values are never shown."""
    return bool(_SECRET_NAME.search(name))


def mask_env(env: Mapping[str, str]) -> dict[str, str]:
    """``env`` with secret values replaced by ``***``."""
    return {k: (MASK if is_secret(k) else v) for k, v in env.items()}


def mask_spec(spec: LaunchSpec) -> LaunchSpec:
    """A copy of ``spec`` safe to write to reports and show: secret env values and secret flags' values masked."""
    return spec.model_copy(update={"env": mask_env(spec.env), "command": mask_args(spec.command)})


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
    """Parsed YAML/JSON with every string under a secret-looking key masked (lists inherit their key), and in a
    list of strings (``args``) the value after a secret flag (``--api-key``)."""
    if isinstance(node, dict):
        return {k: mask_tree(v, str(k)) for k, v in node.items()}
    if isinstance(node, list):
        if all(isinstance(v, str) for v in node):
            node = mask_args(node)
        return [mask_tree(v, key) for v in node]
    if isinstance(node, str) and key and is_secret(key):
        return MASK
    return node


def mask_command(command: str) -> str:
    """``command`` with the value of every secret-looking ``NAME=value`` assignment masked."""
    return _SECRET_ASSIGNMENT.sub(rf"\1={MASK}", command)


class Redactor:
    """Masks known secret values wherever they appear in text we keep or show (log lines, log copies)."""

    def __init__(self, specs: Iterable[LaunchSpec], extra: Iterable[str] = ()) -> None:
        specs = list(specs)
        values = {v for s in specs for k, v in s.env.items() if is_secret(k)}
        values |= {v for s in specs for v in secret_args(s.command)} | set(extra)
        values = {v for v in values if len(v) >= _MIN_VALUE and v != MASK}
        # Longest first, so a secret that contains another is masked whole.
        self._values = sorted(values, key=len, reverse=True)

    def __call__(self, text: str) -> str:
        """``text`` with every secret value masked."""
        for v in self._values:
            text = text.replace(v, MASK)
        return text

    @classmethod
    def from_script(cls, script: str) -> Redactor:
        """A redactor for the secrets a launch script carries (its exported secret env, its secret flags' values):
        the stored records are masked, so a log followed on the host learns them from the script there."""
        values: list[str] = []
        for line in script.splitlines():
            try:
                words = shlex.split(line, comments=True)
            except ValueError:
                continue
            if len(words) == 2 and words[0] == "export" and "=" in words[1]:
                name, _, value = words[1].partition("=")
                if is_secret(name):
                    values.append(value)
            else:
                values.extend(secret_args(words))
        return cls([], values)

    def bytes(self, data: bytes) -> bytes:
        """``data`` with every secret value masked."""
        for v in self._values:
            data = data.replace(v.encode(), MASK.encode())
        return data
