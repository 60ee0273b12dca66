"""A server's own argparse parser, dumped as JSON: run on the host with the engine's Python, never imported there.

``flags.read_parser`` sends this file's text as ``python -c SOURCE KIND`` (KIND is ``vllm`` or ``sglang``) and reads
one JSON document from the last line of its output: every option with all its spellings, its ``nargs``, the name of
its value type (with the type a vLLM ``optional_type``/``parse_type`` wrapper converts to), its choices, and the
parser's own rewriting (vLLM's ``FlexibleArgumentParser`` turns underscores into dashes, ``-O3`` into
``--optimization-level 3`` and dotted ``-cc.mode=0`` into ``-cc '{"mode": 0}'``; argparse takes unique prefixes
when ``allow_abbrev`` is on). The parser is built exactly as the server builds it before parsing its command line
(``make_arg_parser(FlexibleArgumentParser())``; ``ServerArgs.add_cli_args(ArgumentParser())``), so nothing is
started and no GPU is touched. It must run on the Python of the server's own environment, so it imports nothing
of campaign's and keeps to the standard library.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from typing import Any


def _vllm() -> argparse.ArgumentParser:
    try:
        utils = importlib.import_module("vllm.utils.argparse_utils")
    except ImportError:  # releases before the argparse helpers moved (0.10 and earlier)
        utils = importlib.import_module("vllm.utils")
    # make_arg_parser has moved: openai.cli_args (to 0.2x), launchers.cli_args (0.32), common.cli_args (0.33-0.34).
    for where in ("common", "launchers", "openai"):
        try:
            cli_args = importlib.import_module(f"vllm.entrypoints.{where}.cli_args")
            break
        except ModuleNotFoundError:
            continue
    else:
        raise ModuleNotFoundError("no vllm.entrypoints.*.cli_args module has make_arg_parser")
    parser: argparse.ArgumentParser = cli_args.make_arg_parser(utils.FlexibleArgumentParser())
    return parser


def _sglang() -> argparse.ArgumentParser:
    server_args = importlib.import_module("sglang.srt.server_args")
    parser = argparse.ArgumentParser(prog="sglang serve")
    server_args.ServerArgs.add_cli_args(parser)
    return parser


def _type(t: Any, depth: int = 0) -> dict[str, Any]:
    """The value type's name, and for a wrapper function the plain type it converts to (found in its closure)."""
    if t is None:
        return {"name": "str"}
    name = getattr(t, "__name__", type(t).__name__)
    out: dict[str, Any] = {"name": name}
    if name == "_optional_type":
        out["optional"] = True
    if t in (int, float, str, bool) or depth > 3:
        return out
    for cell in getattr(t, "__closure__", None) or ():
        try:
            inner = cell.cell_contents
        except ValueError:
            continue
        if inner in (int, float, str) or callable(inner):
            found = _type(inner, depth + 1)
            if found["name"] in ("int", "float", "str"):
                out["inner"] = found["name"]
                return out
            if "inner" in found:
                out["inner"] = found["inner"]
                return out
    return out


def dump(parser: argparse.ArgumentParser) -> dict[str, Any]:
    """The parser's options and rules as plain data."""
    actions: list[dict[str, Any]] = []
    marked: set[argparse.Action] = getattr(parser, "_deprecated", set())
    for a in parser._actions:
        choices = None
        if a.choices is not None:
            try:
                choices = sorted(str(c) for c in a.choices)
            except TypeError:
                choices = None
        deprecated = bool(getattr(a, "deprecated", False)) or a in marked
        deprecated = deprecated or str(a.help or "").lower().lstrip("( ").startswith("deprecated")
        actions.append(
            {
                "options": list(a.option_strings),
                "dest": a.dest,
                # None is argparse's "exactly one value"; switches (store_true, BooleanOptionalAction, count) say 0.
                "nargs": 1 if a.nargs is None else a.nargs,
                "action": type(a).__name__,
                "type": _type(a.type) if a.nargs != 0 else None,
                "choices": choices,
                "deprecated": deprecated,
            }
        )
    flexible = any(c.__name__ == "FlexibleArgumentParser" for c in type(parser).__mro__)
    return {
        "parser": type(parser).__name__,
        "allow_abbrev": parser.allow_abbrev,
        "prefix_chars": parser.prefix_chars,
        "underscores": flexible,
        "optimization_level": flexible and any("--optimization-level" in a["options"] for a in actions),
        "dotted": flexible,
        "actions": actions,
    }


def main(argv: list[str]) -> int:
    """Build the parser named by ``argv[0]`` and print its dump as one JSON line."""
    builders = {"vllm": _vllm, "sglang": _sglang}
    if not argv or argv[0] not in builders:
        print(json.dumps({"error": f"usage: parser_dump {{{','.join(builders)}}}"}))
        return 2
    try:
        parser = builders[argv[0]]()
    except Exception as e:  # any import failure is reported, and the caller falls back to --help
        print(json.dumps({"error": f"{type(e).__name__}: {e}"[:500]}))
        return 1
    print(json.dumps(dump(parser)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
