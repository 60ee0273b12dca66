"""A server's argument parser as data (dumped on the host by ``parser_dump``) and the check of planned words against it.

The check reads a command line the way the server's parser will: argparse's unique-prefix abbreviations (``--tp``
for SGLang's ``--tp-size``), ``--flag=value``, a short option with its value attached, and, for vLLM's
``FlexibleArgumentParser``, underscores read as dashes (``--max_num_seqs``), ``-O3``/``-O 3``/``-O=3`` read as
``--optimization-level 3``, and dotted config keys (``-cc.mode=0``) read as a JSON value of their head (``-cc``). Each
option's values are counted by its ``nargs`` and converted by its type where that type is a plain ``int`` or
``float`` (also inside vLLM's ``optional_type``), and checked against its choices. A form it cannot read the way the
server would is never refused: a type it does not know accepts every value.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

_NEGATIVE = re.compile(r"^-\d+$|^-\d*\.\d+$")


@dataclass(frozen=True)
class Option:
    """One optional argument: every spelling, how many values it takes, their type and choices."""

    options: tuple[str, ...]
    nargs: int | str
    type_name: str | None = None
    inner: str | None = None
    optional: bool = False
    choices: frozenset[str] | None = None
    deprecated: bool = False

    @property
    def primary(self) -> str:
        """The longest spelling, the one a message names."""
        return max(self.options, key=len)


@dataclass(frozen=True)
class ParserSpec:
    """A server's parser: its options by spelling and its rewriting rules."""

    options: Mapping[str, Option]
    allow_abbrev: bool = True
    underscores: bool = False
    optimization_level: bool = False
    dotted: bool = False
    positionals: int = 0
    deprecated: frozenset[str] = frozenset()

    @classmethod
    def from_dump(cls, doc: Mapping[str, Any]) -> ParserSpec:
        """Read ``parser_dump``'s JSON document."""
        options: dict[str, Option] = {}
        positionals = 0
        for a in doc["actions"]:
            spellings = tuple(a["options"])
            if not spellings:
                positionals += 1
                continue
            t = a.get("type") or {}
            opt = Option(
                options=spellings,
                nargs=a["nargs"],
                type_name=t.get("name"),
                inner=t.get("inner"),
                optional=bool(t.get("optional")),
                choices=frozenset(a["choices"]) if a.get("choices") is not None else None,
                deprecated=bool(a.get("deprecated")),
            )
            options.update(dict.fromkeys(spellings, opt))
        return cls(
            options=options,
            allow_abbrev=bool(doc.get("allow_abbrev", True)),
            underscores=bool(doc.get("underscores")),
            optimization_level=bool(doc.get("optimization_level")),
            dotted=bool(doc.get("dotted")),
            positionals=positionals,
            deprecated=frozenset(s for o in options.values() if o.deprecated for s in o.options),
        )

    def nearest(self, flag: str, n: int = 3) -> list[str]:
        """The spellings closest to ``flag``, best first."""
        return difflib.get_close_matches(flag, sorted(self.options), n=n, cutoff=0.6)


@dataclass
class Problem:
    """A word of the command line the server's parser would refuse, and why."""

    word: str
    flag: str | None
    message: str
    nearest: list[str] = field(default_factory=list)


@dataclass
class Reading:
    """What the parser makes of a command line: the options it names (with the spelling used) and the problems."""

    used: list[tuple[str, Option]] = field(default_factory=list)
    problems: list[Problem] = field(default_factory=list)


def _rewrite(words: Sequence[str], spec: ParserSpec) -> list[tuple[str, str]]:
    """The words as vLLM's FlexibleArgumentParser hands them to argparse, each with the word it came from."""
    out: list[tuple[str, str]] = []
    skip = False
    for i, word in enumerate(words):
        if skip:
            skip = False
            continue
        if spec.optimization_level and word.startswith("-O") and not word.startswith("--"):
            if word != "-O":
                level = word[3:] if word[2] == "=" else word[2:]
                out += [("--optimization-level", word), (level, word)]
                continue
            if i + 1 < len(words) and words[i + 1] in {"0", "1", "2", "3"}:
                out.append(("--optimization-level", word))
                continue
        head = word.split("=", 1)[0]
        if spec.dotted and word.startswith("-") and "." in head:
            key = head.split(".", 1)[0]
            if spec.underscores and key.startswith("--"):
                key = key.replace("_", "-")
            value = word.split("=", 1)[1] if "=" in word else (words[i + 1] if i + 1 < len(words) else None)
            skip = "=" not in word
            out.append((key, word))
            if value is None:
                out.append(("", word))  # a dotted key with no value: the server fails reading it
            else:
                out.append(("{}", word))  # merged into one JSON value of its head
            continue
        if spec.underscores and word.startswith("--"):
            name, eq, value = word.partition("=")
            first, dot, rest = name.partition(".")
            word2 = first.replace("_", "-") + dot + rest + eq + value
            out.append((word2, word))
            continue
        out.append((word, word))
    return out


def _looks_like_flag(word: str) -> bool:
    return word.startswith("-") and word != "-" and not _NEGATIVE.match(word)


def _resolve(flag: str, spec: ParserSpec) -> tuple[Option | None, str | None, str | None]:
    """The option a spelling names, with a value attached to it (``-tp2``), or an error message."""
    if flag in spec.options:
        return spec.options[flag], None, None
    if flag.startswith("--"):
        if not spec.allow_abbrev:
            return None, None, None
        hits = sorted({o for o in spec.options if o.startswith(flag)})
        owners = {id(spec.options[h]) for h in hits}
        if len(owners) == 1:
            return spec.options[hits[0]], None, None
        if len(owners) > 1:
            return None, None, f"ambiguous option {flag}: could match {', '.join(hits[:6])}"
        return None, None, None
    short = flag[:2]
    if len(flag) > 2 and short in spec.options and spec.options[short].nargs != 0:
        return spec.options[short], flag[2:], None
    if spec.allow_abbrev:
        hits = sorted({o for o in spec.options if o.startswith(flag) and not o.startswith("--")})
        owners = {id(spec.options[h]) for h in hits}
        if len(owners) == 1:
            return spec.options[hits[0]], None, None
    return None, None, None


def _bad_value(value: str, opt: Option) -> str | None:
    """Why the option's type or choices refuse ``value``, or None."""
    if opt.optional and value in ("", "None"):
        return None
    kind = opt.type_name if opt.type_name in ("int", "float") else opt.inner
    converted = value
    if kind in ("int", "float") and opt.type_name in ("int", "float", "_optional_type", "_parse_type"):
        try:
            converted = str(int(value) if kind == "int" else float(value))
        except ValueError:
            return f"invalid {kind} value: {value!r}"
    known_type = opt.type_name in (None, "str", "int", "float")
    if opt.choices is not None and known_type and converted not in opt.choices and value not in opt.choices:
        listed = ", ".join(sorted(opt.choices)[:8])
        return f"invalid choice: {value!r} (choose from {listed}{', ...' if len(opt.choices) > 8 else ''})"
    return None


def read(words: Sequence[str], spec: ParserSpec) -> Reading:
    """How the server's parser reads ``words`` (the command line after its launcher words)."""
    out = Reading()
    pairs = _rewrite(words, spec)
    i = 0
    positionals = spec.positionals
    while i < len(pairs):
        word, origin = pairs[i]
        i += 1
        if not _looks_like_flag(word):
            if positionals > 0:
                positionals -= 1
                continue
            out.problems.append(Problem(origin, None, f"unrecognized argument {origin!r} (a value with no flag)"))
            continue
        flag, eq, explicit = word.partition("=")
        opt, attached, error = _resolve(flag, spec)
        if opt is None:
            shown = origin.split("=", 1)[0]
            msg = error or f"unrecognized argument {shown}"
            out.problems.append(Problem(origin, shown, msg, spec.nearest(flag)))
            continue
        out.used.append((origin.split("=", 1)[0], opt))
        value = explicit if eq else attached
        values: list[str] = []
        if opt.nargs == 0:
            if value is not None:
                out.problems.append(Problem(origin, flag, f"{opt.primary} takes no value (got {value!r})"))
            continue
        if value is not None:
            values = [value]
        elif opt.nargs in (1, "?") or isinstance(opt.nargs, int):
            want = 1 if opt.nargs == "?" else int(opt.nargs)
            while len(values) < want and i < len(pairs) and not _looks_like_flag(pairs[i][0]):
                values.append(pairs[i][0])
                i += 1
            if opt.nargs != "?" and len(values) < want:
                out.problems.append(Problem(origin, flag, f"{opt.primary} expects {want} value(s)"))
                continue
        else:  # "*", "+", "..."
            while i < len(pairs) and not _looks_like_flag(pairs[i][0]):
                values.append(pairs[i][0])
                i += 1
            if opt.nargs == "+" and not values:
                out.problems.append(Problem(origin, flag, f"{opt.primary} expects at least one value"))
                continue
        for v in values:
            bad = _bad_value(v, opt) if v != "{}" else None
            if bad is not None:
                out.problems.append(Problem(origin, flag, f"{opt.primary}: {bad}"))
    return out
