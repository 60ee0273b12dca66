"""The architecture page, executed: floors as data, every room on the page, the refserver boundary, no cycle.

``FLOORS`` is the floor table of docs/architecture.md as data: a room imports only rooms on lower floors, every room
of campaign/ has a floor, and the page lists each room on its floor. The reference server is a program of its own:
the orchestrator never imports it (one stdlib-only leaf excepted, below) and it imports nothing of the orchestrator.

Read from the source (every ``import`` statement, at any depth, TYPE_CHECKING blocks included), not from a running
interpreter, so an import that only some code path reaches counts too.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ROOT = REPO / "campaign"
PAGE = REPO / "docs" / "architecture.md"

#: Each room of the orchestrator (a module or a package of campaign/) and its floor, as docs/architecture.md draws
#: them. A new room gets a line here and a row on the page; an import that goes up or sideways fails below.
FLOORS: dict[str, int] = {
    "records": 1,
    "errors": 1,
    "answer": 1,
    "fingerprint": 1,
    "interruption": 1,
    "statistics": 1,
    "version": 1,
    "needles": 1,
    "argspec": 1,
    "parser_dump": 1,
    "redaction": 2,
    "logscan": 2,
    "runindex": 2,
    "store": 3,
    "gates": 2,
    "golden": 2,
    "attribution": 2,
    "comparison": 2,
    "outcome": 2,
    "config": 3,
    "bench": 3,
    "compare": 3,
    "plot": 3,
    "diagnosis": 4,
    "hosts": 4,
    "smoke": 4,
    "estimate": 4,
    "resume": 4,
    "diagnose": 5,
    "retry": 5,
    "ownership": 5,
    "running": 5,
    "processes": 5,
    "flags": 5,
    "profile": 5,
    "parking": 5,
    "lock": 6,
    "jobs": 6,
    "effective": 6,
    "server": 7,
    "readiness": 8,
    "box": 9,
    "pipeline": 9,
    "fleet": 10,
    "tune": 10,
    "operations": 11,
    "console": 12,
    "cli": 13,
}
#: The one module of the reference server the orchestrator may import: the question table and filler words, pure
#: and stdlib-only, which the bench's long-context prompts must share with the model trained on them.
SHARED_WITH_REFSERVER = {"campaign.refserver.questions"}
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
    "campaign.cli.tune",
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


def _room(module: str) -> str:
    """``campaign.config.loader`` -> ``config``; the package root ``campaign`` -> ``""``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def test_every_room_has_a_floor() -> None:
    edges, _ = _graph()
    rooms = {_room(m) for m in edges} - {""}
    assert sorted(rooms - set(FLOORS)) == [], "a new room: give it a floor in FLOORS and a row on the page"
    assert sorted(set(FLOORS) - rooms) == [], "a room that is gone: take it out of FLOORS and off the page"


def test_a_room_imports_only_rooms_below_it() -> None:
    edges, _ = _graph()
    wrong = sorted(
        (m, t)
        for m, targets in edges.items()
        for t in targets
        if _room(m) and _room(t) != _room(m) and FLOORS[_room(t)] >= FLOORS[_room(m)]
    )
    assert wrong == []


def test_the_floor_check_finds_an_import_that_goes_up() -> None:
    assert FLOORS["records"] < FLOORS["config"] < FLOORS["hosts"] < FLOORS["server"] < FLOORS["cli"]


def _page_floors() -> dict[str, int]:
    """Room -> floor as the page's table says (``| 3 | `config/`, `bench/` | ... |``)."""
    out: dict[str, int] = {}
    for line in PAGE.read_text().splitlines():
        m = re.match(r"\|\s*(\d+)\s*\|([^|]*)\|", line)
        if m:
            for name in re.findall(r"`([a-z_]+)(?:\.py|/)`", m.group(2)):
                out[name] = int(m.group(1))
    return out


def test_the_page_lists_every_room_on_its_floor() -> None:
    page = _page_floors()
    assert {r: page.get(r) for r in FLOORS if page.get(r) != FLOORS[r]} == {}


def _imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return {n for n in names if n == "campaign" or n.startswith("campaign.")}


def test_the_orchestrator_and_the_reference_server_stay_apart() -> None:
    server = ROOT / "refserver"
    into_server = {
        str(p.relative_to(REPO)): sorted(n for n in _imports(p) if n.startswith("campaign.refserver"))
        for p in ROOT.rglob("*.py")
        if server not in p.parents
    }
    assert {p: n for p, n in into_server.items() if set(n) - SHARED_WITH_REFSERVER} == {}
    out_of_server = {
        str(p.relative_to(REPO)): sorted(n for n in _imports(p) if not n.startswith("campaign.refserver"))
        for p in server.rglob("*.py")
    }
    assert {p: n for p, n in out_of_server.items() if n} == {}
    for shared in SHARED_WITH_REFSERVER:
        path = REPO / (shared.replace(".", "/") + ".py")
        assert _imports(path) == set(), f"{shared} is shared by both programs: it imports neither"


def test_the_pages_paths_exist() -> None:
    """Every file the page names (its rooms and its change recipes) is where it says; NAME/KIND are placeholders."""
    named = set(re.findall(r"`((?:campaign|tests|docs|scripts|configs)/[A-Za-z0-9_./-]+)`", PAGE.read_text()))
    missing = sorted(p for p in named if not re.search(r"NAME|KIND|WHAT", p) and not (REPO / p).exists())
    assert missing == []


def test_every_script_is_indexed() -> None:
    index = (REPO / "scripts" / "README.md").read_text()
    listed = set(re.findall(r"^\| `([^`]+)` \|", index, flags=re.MULTILINE))
    present = {p.name for p in (REPO / "scripts").iterdir() if p.is_file() and p.name != "README.md"}
    assert sorted(present - listed) == [] and sorted(listed - present) == []
