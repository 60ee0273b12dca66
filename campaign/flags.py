"""Server flags: what a server accepts, read from its own ``--help``, and the check of a plan's flags against it.

A recipe's ``help`` section names the command that prints the server's flag list. ``read_help`` runs it on the host
once per host, recipe and server version (the version is the recipe's ``server_version`` probe) and keeps the text in
the run store (``<runs>/help-cache/``), so later runs and dry runs against the same build read no help at all.
``check_plan`` then looks at every word of every planned command that is a flag (after the recipe's launcher words)
and refuses the plan, as a ``ConfigError`` (exit 2), when the server does not list one: it names the flag, the
server's version and the nearest spellings its help does list. Nothing is stopped or launched before this check.

Only the option lines of argparse's (or click's) help count (an indented line that starts with ``-``): flags named
in prose ("Use --cuda-graph-backend-decode instead") are not flags the server takes. A flag whose help says
"Deprecated" is accepted with a note. vLLM's dotted form (``-cc.mode=0``, ``--compilation-config.mode``) is checked
by its head (``-cc``).

Where the recipe names the server's parser (``help.parser``), the server's own argparse parser is asked first:
``parser_dump.py``, run with the engine's Python on the host, prints its options (every alias, nargs, type,
choices) and rewriting rules as JSON, kept in the same cache, and ``campaign.argspec`` reads each planned command
the way that parser will (abbreviations, ``--max_num_seqs``, ``-O3``, ``-cc.mode=0``, a typed value it cannot
convert). When the parser cannot be built there (an import that fails), the help text is the fallback, with a note.
An experiment's ``flag_check: warn`` turns a refusal into a note.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import re
import secrets
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from campaign import argspec
from campaign.config import (
    Experiment,
    KnobRule,
    Loaded,
    PlannedVariant,
    Recipe,
    Spelling,
    VariantConfig,
    line_of,
    plan,
    template_vars,
)
from campaign.errors import ConfigError, HostError
from campaign.hosts.base import Host

#: Seconds a ``--help`` or version probe may take (vLLM's imports take a few seconds on a fast box).
HELP_TIMEOUT_S = 180.0
_OPTION_LINE = re.compile(r"^ {1,6}(-{1,2}[A-Za-z0-9?][^ ]*(?: [^ ]+)*?)(?: {2,}(.*)|$)")
_FLAG = re.compile(r"-{1,2}[A-Za-z0-9][\w-]*")
_NUMBER = re.compile(r"^-\d")


class HelpUnavailable(Exception):
    """The server's help could not be read on the host (why, in the message); never leaves this module."""


@dataclass(frozen=True)
class HelpFlags:
    """The flags one server build lists in its ``--help``."""

    flags: frozenset[str]
    deprecated: frozenset[str] = frozenset()
    #: The values a flag accepts where its help lists them (argparse's ``{a,b,c}``).
    choices: Mapping[str, frozenset[str]] = field(default_factory=dict)

    def nearest(self, flag: str, n: int = 3) -> list[str]:
        """The listed spellings closest to ``flag`` (difflib), best first."""
        return difflib.get_close_matches(flag, sorted(self.flags), n=n, cutoff=0.6)


@dataclass(frozen=True)
class ServerHelp:
    """A server's help as read for one host: its version, where the text came from, and the flags in it."""

    recipe: str
    host: str
    version: str | None
    source: str  # "cache" or "host"
    flags: HelpFlags
    text: str = ""
    #: The server's own parser where it could be built on the host; None: the help text is what is checked.
    parser: argspec.ParserSpec | None = None
    #: Why the parser could not be built (the check fell back to the help text), or None.
    fallback: str | None = None


@dataclass
class FlagCheck:
    """The outcome of checking a plan: which build it was checked against and the notes (deprecated flags)."""

    help: ServerHelp | None
    planned: list[PlannedVariant]
    notes: list[str] = field(default_factory=list)


def parse_help(text: str) -> HelpFlags:
    """The flags of an argparse ``--help`` text: every spelling on each option line, with the deprecated ones."""
    flags: set[str] = set()
    deprecated: set[str] = set()
    choices: dict[str, frozenset[str]] = {}
    lines = text.splitlines()
    for i, line in enumerate(lines):
        m = _OPTION_LINE.match(line)
        if m is None:
            continue
        # argparse lists spellings as "-h, --help"; click and typer list switch pairs as "--compile / --no-compile".
        parts = re.split(r", | / ", m.group(1))
        names = [f.group(0) for part in parts if (f := _FLAG.match(part.strip()))]
        flags.update(names)
        listed = re.search(r" \{([^{}]+)\}", m.group(1))
        if listed is not None:
            choices.update({n: frozenset(listed.group(1).split(",")) for n in names})
        described = m.group(2) or (lines[i + 1] if i + 1 < len(lines) else "")
        if re.match(r"\s*\(?deprecated", described, re.IGNORECASE):
            deprecated.update(names)
    return HelpFlags(frozenset(flags), frozenset(deprecated), choices)


def rendered_flags(command: Sequence[str], launcher: int) -> list[str]:
    """The flags among ``command``'s words after the first ``launcher`` ones, as the server's parser sees them.

    ``--flag=value`` is ``--flag``; vLLM's dotted ``-cc.mode=0`` is ``-cc``; negative numbers are values.
    """
    out: list[str] = []
    for word in command[launcher:]:
        if not word.startswith("-") or word in ("-", "--") or _NUMBER.match(word):
            continue
        head = word.split("=", 1)[0]
        m = _FLAG.match(head)
        out.append(m.group(0) if m else head)
    return out


def help_cache_path(runs: Path, host: str, recipe: str, version: str, command: Sequence[str]) -> Path:
    """Where the help of one build is kept: per host and recipe, by version and the exact help command."""
    digest = hashlib.sha256("\0".join([version, *command]).encode()).hexdigest()[:16]
    safe = re.sub(r"[^A-Za-z0-9._-]", "_", f"{host}/{recipe}")
    return runs / "help-cache" / safe / f"{digest}.txt"


def read_help(host: Host, recipe: Recipe, tmpl_vars: Mapping[str, str], runs: Path) -> ServerHelp | None:
    """The server's help on ``host``: from the cache when this build's is there, else run it (read-only) and keep it.

    None when the recipe declares no help command. A help command that fails (the server is not installed there, a
    missing dependency) raises ``HelpUnavailable``: the flags stay unchecked and the launch shows the real cause.
    """
    spec = recipe.help
    if spec is None:
        return None
    values = {**recipe.vars, **tmpl_vars}
    version = _probe_version(host, recipe, values)
    fallback = None
    if spec.parser is not None:
        try:
            parser = _read_parser(host, recipe, values, version, runs)
        except HelpUnavailable as e:
            fallback = str(e)
        else:
            names = frozenset(parser.options)
            flags = HelpFlags(names, parser.deprecated, {})
            return ServerHelp(recipe.name, host.name, version, parser.source, flags, parser=parser.spec)
    found = _read_help_text(host, recipe, values, version, runs)
    if found is not None and fallback is not None:
        found = ServerHelp(
            found.recipe, found.host, found.version, found.source, found.flags, found.text, fallback=fallback
        )
    return found


@dataclass(frozen=True)
class _Parser:
    spec: argspec.ParserSpec
    source: str

    @property
    def options(self) -> list[str]:
        return sorted(self.spec.options)

    @property
    def deprecated(self) -> frozenset[str]:
        return self.spec.deprecated


#: The parser dump's source, sent to the host as ``python -c``: it must run on the engine's own Python.
_DUMP_SOURCE = Path(__file__).with_name("parser_dump.py")


def _read_parser(host: Host, recipe: Recipe, values: Mapping[str, str], version: str | None, runs: Path) -> _Parser:
    """The server's parser dumped on the host (or read from the cache for this build); HelpUnavailable if it fails."""
    assert recipe.help is not None and recipe.help.parser is not None
    src = recipe.help.parser
    python = _fill([src.python], values, recipe.name)[0]
    source = _DUMP_SOURCE.read_text()
    command = [python, "-c", source, src.kind]
    key = [python, "parser_dump", hashlib.sha256(source.encode()).hexdigest()[:12], src.kind]
    cached = help_cache_path(runs, host.name, recipe.name, version, key).with_suffix(".json") if version else None
    if cached is not None and cached.is_file():
        return _Parser(argspec.ParserSpec.from_dump(json.loads(cached.read_text())), "cache")
    res = host.run(" ".join(shlex.quote(w) for w in command) + " 2>/dev/null", timeout=HELP_TIMEOUT_S)
    tail = res.stdout.strip().splitlines()[-1:] or [""]
    try:
        doc = json.loads(tail[0])
    except ValueError:
        doc = {"error": f"exit status {res.exit_code}, no parser dump ({tail[0][:160]})"}
    if not isinstance(doc, dict) or "actions" not in doc:
        why = doc.get("error") if isinstance(doc, dict) else None
        raise HelpUnavailable(f"{src.kind}'s parser could not be built with {python} on {host.name}: {why}")
    if cached is not None:
        _keep(cached, json.dumps(doc))
    return _Parser(argspec.ParserSpec.from_dump(doc), "host")


def _keep(path: Path, text: str) -> None:
    """Write a cache file under a name of its own first: a fleet's hosts may read one build's help at once."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp-{secrets.token_hex(4)}")
    tmp.write_text(text)
    tmp.replace(path)


def _read_help_text(
    host: Host, recipe: Recipe, values: Mapping[str, str], version: str | None, runs: Path
) -> ServerHelp:
    """The server's ``--help`` text on the host, from the cache when this build's is there."""
    assert recipe.help is not None
    spec = recipe.help
    command = _fill(spec.command, values, recipe.name)
    cached = help_cache_path(runs, host.name, recipe.name, version, command) if version else None
    if cached is not None and cached.is_file():
        text = cached.read_text()
        return ServerHelp(recipe.name, host.name, version, "cache", parse_help(text), text)
    line = " ".join(shlex.quote(w) for w in command)
    res = host.run(line + " 2>&1", timeout=HELP_TIMEOUT_S)
    text = res.stdout
    flags = parse_help(text)
    if not res.ok or len(flags.flags) < 2:
        tail = text.strip().splitlines()[-1:] or [f"exit status {res.exit_code}"]
        raise HelpUnavailable(f"`{line}` on {host.name} printed no flag list ({tail[0].strip()[:200]})")
    if cached is not None:
        _keep(cached, text)
    return ServerHelp(recipe.name, host.name, version, "host", flags, text)


def check_plan(
    experiment: Experiment,
    recipe: Recipe,
    planned: Sequence[PlannedVariant],
    server: ServerHelp,
    *,
    file: str | None = None,
) -> list[str]:
    """Every rendered flag of ``planned`` checked against ``server``'s help; returns notes (deprecated flags).

    Raises ``ConfigError`` naming the first unknown flag, the variant and where the flag came from (a knob of the
    recipe, the variant's args or the recipe's command), the server's version and the nearest listed spellings.
    """
    launcher = recipe.help.launcher if recipe.help is not None else 0
    version = server.version or "(version unknown)"
    if server.parser is not None:
        return _check_parsed(experiment, recipe, planned, server, server.parser, launcher, file)
    notes: list[str] = (
        [f"{recipe.name}'s parser not used: {server.fallback}; checked against --help"] if (server.fallback) else []
    )
    for pv in planned:
        _check_choices(recipe, pv, server, launcher, file)
        for flag in rendered_flags(pv.spec.command, launcher):
            if flag in server.flags.flags:
                if flag in server.flags.deprecated:
                    note = f"{flag} is deprecated in {recipe.name} {version} (variant {pv.name})"
                    if note not in notes:
                        notes.append(note)
                continue
            near = server.flags.nearest(flag)
            raise ConfigError(
                f"{recipe.name} {version} on {server.host} has no flag {flag} "
                f"(variant {pv.name}, from {_origin(flag, pv, experiment.baseline, recipe)})",
                file=file,
                field=f"{pv.name}.flags",
                hint=("nearest spellings it lists: " + ", ".join(near)) if near else "its --help lists nothing close",
            )
    return notes


def _check_parsed(
    experiment: Experiment,
    recipe: Recipe,
    planned: Sequence[PlannedVariant],
    server: ServerHelp,
    parser: argspec.ParserSpec,
    launcher: int,
    file: str | None,
) -> list[str]:
    """Every planned command read by the server's own parser (see ``campaign.argspec``); the first refusal raises."""
    version = server.version or "(version unknown)"
    notes: list[str] = []
    for pv in planned:
        reading = argspec.read(pv.spec.command[launcher:], parser)
        for spelling, opt in reading.used:
            if opt.deprecated:
                note = f"{spelling} is deprecated in {recipe.name} {version} (variant {pv.name})"
                if note not in notes:
                    notes.append(note)
        if not reading.problems:
            continue
        p = reading.problems[0]
        origin = _origin(p.flag, pv, experiment.baseline, recipe) if p.flag else "its command"
        raise ConfigError(
            f"{recipe.name} {version} on {server.host} refuses {p.word!r}: {p.message} "
            f"(variant {pv.name}, from {origin}; read by the server's own parser)",
            file=file,
            field=f"{pv.name}.flags",
            hint=("nearest spellings it takes: " + ", ".join(p.nearest)) if p.nearest else None,
        )
    return notes


def _check_choices(recipe: Recipe, pv: PlannedVariant, server: ServerHelp, launcher: int, file: str | None) -> None:
    """A value the server's help does not list for its flag (``--attention-backend mma`` unregistered) is refused."""
    words = pv.spec.command[launcher:]
    for i, word in enumerate(words):
        flag, eq, value = word.partition("=")
        allowed = server.flags.choices.get(flag)
        if allowed is None:
            continue
        if not eq:
            if i + 1 >= len(words) or words[i + 1].startswith("-"):
                continue
            value = words[i + 1]
        if value not in allowed:
            near = difflib.get_close_matches(value, sorted(allowed), n=3, cutoff=0.5)
            raise ConfigError(
                f"{recipe.name} {server.version or '(version unknown)'} on {server.host} does not accept "
                f"{flag} {value} (variant {pv.name}); it lists {len(allowed)} values",
                file=file,
                field=f"{pv.name}.flags",
                hint=("nearest: " + ", ".join(near) + "; " if near else "")
                + "an out-of-tree value must be registered before the server parses its flags",
            )


def _origin(flag: str, pv: PlannedVariant, baseline: VariantConfig, recipe: Recipe) -> str:
    """Where a rendered flag came from, in the words of the files a user edits."""
    for where, args in (("args", pv.config.args if pv.config else []), ("baseline.args", baseline.args)):
        if any(rendered_flags([a], 0) == [flag] for a in args):
            return f"its {where}"
    for knob, rule in recipe.knobs.items():
        spellings: list[KnobRule | Spelling] = [rule, *rule.older]
        words = [w for s in spellings for w in [*(s.when_true), *(s.when_false), *([s.flag] if s.flag else [])]]
        if knob in pv.knobs and any(rendered_flags([w], 0) == [flag] for w in words):
            return f"knob {knob} of recipe {recipe.name}"
    for extra in recipe.together:
        if any(rendered_flags([w], 0) == [flag] for w in extra.args):
            return f"recipe {recipe.name}'s `together` args"
    return f"recipe {recipe.name}'s command"


def _probe_version(host: Host, recipe: Recipe, values: Mapping[str, str]) -> str | None:
    """The build's version on the host (the help's ``version`` command, else the ``server_version`` probe), or None."""
    template = (recipe.help.version if recipe.help is not None else None) or recipe.probes.get("server_version")
    if not template:
        return None
    try:
        words = _fill(template, values, recipe.name)
        res = host.run(" ".join(shlex.quote(w) for w in words) + " 2>/dev/null", timeout=HELP_TIMEOUT_S)
    except (ConfigError, HostError):
        return None
    tail = res.stdout.strip().splitlines()
    return tail[-1].strip() if res.ok and tail else None


def _fill(template: Sequence[str], values: Mapping[str, str], recipe: str) -> list[str]:
    try:
        return [w.format(**values) for w in template]
    except (KeyError, IndexError, ValueError) as e:
        raise ConfigError(f"recipe {recipe}'s help command needs the variable {e}", field="vars") from None


def checked_plan(loaded: Loaded, host: Host, runs: Path, only: Sequence[str] = ()) -> FlagCheck:
    """The experiment's plan rendered in the spellings of the server on ``host`` and checked against its help.

    What both ``campaign run`` (before anything is stopped) and ``campaign run --dry-run`` use. Raises
    ``ConfigError`` for a flag the server does not list.
    """
    exp = loaded.experiment
    try:
        server = read_help(host, loaded.recipe, template_vars(exp), runs)
    except HelpUnavailable as e:
        return FlagCheck(None, plan(exp, loaded.recipe, only), [f"flags not checked: {e}"])
    version = server.version if server is not None else None
    planned = plan(exp, loaded.recipe, only, version)
    if server is None:
        return FlagCheck(None, planned)
    try:
        notes = check_plan(exp, loaded.recipe, planned, server, file=str(loaded.path))
    except ConfigError as e:
        if exp.flag_check == "warn":
            return FlagCheck(
                server, planned, [f"flag check (warn only): {e.detail}" + (f"; {e.hint}" if e.hint else "")]
            )
        raise ConfigError(e.detail, file=e.file, line=_line(loaded, e.field), field=e.field, hint=e.hint) from None
    return FlagCheck(server, planned, notes)


def _line(loaded: Loaded, field: str | None) -> int | None:
    """The line of the experiment file that declares the variant named in ``field`` (``NAME.flags``)."""
    name = (field or "").rpartition(".flags")[0]
    exp = loaded.experiment
    try:
        text = loaded.path.read_text()
    except OSError:
        return None
    if name == exp.baseline.name:
        return line_of(text, ["baseline"])
    for i, v in enumerate(exp.variants):
        if v.name == name:
            return line_of(text, ["variants", i])
    return line_of(text, ["matrix", "axes"]) if exp.matrix is not None else None
