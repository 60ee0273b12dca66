"""The orchestrator's import graph: no cycle, the records at the bottom, no imports hidden inside functions.

Read from the source (every ``import`` statement, at any depth, TYPE_CHECKING blocks included), not from a running
interpreter, so an import that only some code path reaches counts too.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "campaign"
#: Modules that may import inside functions, and why: the CLI keeps `campaign --help` fast by importing a command's
#: machinery only when that command runs; ``open_host`` loads paramiko only for an SSH host; ``campaign.__version__``
#: asks git only when read.
LAZY_OK = {
    "campaign",
    "campaign.cli",
    "campaign.cli.app",
    "campaign.cli.control",
    "campaign.cli.history",
    "campaign.cli.analysis",
    "campaign.hosts",
}


def _module(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _graph() -> tuple[dict[str, set[str]], dict[str, list[str]]]:
    """Module -> the campaign modules it imports; module -> imports written below its top level."""
    files = {_module(p): p for p in ROOT.rglob("*.py") if "refserver" not in p.parts}
    edges: dict[str, set[str]] = {m: set() for m in files}
    nested: dict[str, list[str]] = {}
    for mod, path in files.items():
        tree = ast.parse(path.read_text(), str(path))
        top = {id(n) for n in tree.body}
        for node in ast.walk(tree):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            targets = {n for n in names if n in files and n != mod and n.startswith("campaign.")}
            if not targets:
                continue
            # `from campaign.bench import sse` names a module; `from campaign.bench import run_bench` names the package.
            edges[mod] |= {t for t in targets if not any(o != t and o.startswith(t + ".") for o in targets)}
            if id(node) not in top:
                nested.setdefault(mod, []).extend(sorted(targets))
    return edges, nested


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def test_no_import_cycle() -> None:
    edges, _ = _graph()
    assert "campaign.bench" in edges and "campaign.records" in edges
    assert _cycles(edges) == []


def test_the_cycle_check_finds_one() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_records_are_the_ground_floor() -> None:
    """The record tree imports no other room, so every room can import it."""
    edges, _ = _graph()
    for mod, targets in edges.items():
        if mod.startswith("campaign.records"):
            assert all(t.startswith("campaign.records") for t in targets), (mod, targets)


def test_no_imports_inside_functions() -> None:
    _, nested = _graph()
    assert {m: t for m, t in nested.items() if m not in LAZY_OK} == {}
