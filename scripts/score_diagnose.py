"""Score diagnosis on the labelled corpus: in-sample and leave-one-repository-out, per label, with a JSON report.

Each excerpt of the corpus (default tests/data/corpus/excerpts.jsonl) is written as a log file of its own and
diagnosed twice:

- in-sample, with the rules as shipped;
- held out (leave-one-repository-out), with the rules less every pattern whose provenance is the excerpt's own
  repository alone: a pattern's provenance is the set of repositories whose excerpts it helps get right in-sample
  (written to tests/data/corpus/provenance.json), so a pattern only one repository's excerpts justify is one that
  would not have been written had that repository never been read. docs/diagnosis.md explains the method and its
  limits.

wrong_output excerpts are model output, not launch logs, and are left out (the smoke test, not the log, finds them).

An excerpt marked ``evidence: outside_excerpt`` (tests/data/corpus/outside_excerpt.yaml: a reviewer found no evidence
of its cause in its text) is right when the diagnosis is its label or ``inconclusive``, wrong otherwise (healthy
included); the figures are also given over the marked and the unmarked excerpts apart.

    .venv/bin/python scripts/score_diagnose.py [--corpus FILE] [--out FILE] [--cli] [--misses]
    .venv/bin/python scripts/score_diagnose.py --heldout [FOLDER] [--out FILE] [--misses]

``--cli`` diagnoses in-sample through the real ``campaign diagnose --json FILE`` (one process per excerpt; slow);
otherwise ``campaign.diagnose.diagnose_file`` is called in-process (the same code path after argument parsing).
Exit status: 0 when the held-out accuracy is at least 90%, no failure excerpt was called healthy and no healthy
excerpt a failure (in either scoring); 1 otherwise; 2 on bad input.

``--heldout`` scores the frozen held-out folder instead (default tests/data/heldout; its README.md says when it may be
run: once, at the end): each ``labels.jsonl`` record names a log file of the folder, its kind (``unknown`` where no
kind fits) and the direction a right hint must point (``DIRECTIONS`` below). It reports top-1 kind accuracy, failures
called healthy, healthy logs called failures, and hints pointing the wrong way; exit status 0 when top-1 is at least
90% and the other three counts are zero.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
from collections import defaultdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_CORPUS = ROOT / "tests" / "data" / "corpus" / "excerpts.jsonl"
#: Each pattern's provenance: the repositories whose excerpts it helps get right (written by every scoring run).
PROVENANCE = ROOT / "tests" / "data" / "corpus" / "provenance.json"
TARGET = 0.9
FIELDS = ("id", "category", "server", "source", "excerpt")
DEFAULT_HELDOUT = ROOT / "tests" / "data" / "heldout"
HELDOUT_FIELDS = ("id", "file", "kind", "direction", "hint_direction", "url", "server", "date")

#: The direction a right hint points, per labelled direction (labels.jsonl's ``direction``; each kind has one by
#: default, see the held-out README): (what a hint pointing this way says, what a hint pointing the wrong way says).
#: A hint points the wrong way when it says something of the second before anything of the first (its first advice,
#: the step a user takes, points away), clauses that set advice aside ("… is the wrong direction here") not counted.
#: A coarse keyword judge: it catches "add RAM" on a GPU OOM, "raise the fraction" first on a capture OOM or "reduce
#: block sizes" on an unsupported architecture, not subtler misdirection; the ids it flags are listed for a person.
_SET_ASIDE = r"\bnot\b|n't\b|\bno\b|wrong direction|instead of|rather than|\busual\b"
_MEMORY_KNOB = r"fraction|utili[sz]ation|--mem-fraction|cache-max-entry-count"
_HOST_RAM = r"\b(host|system) (ram|memory)\b|add (ram|swap)|more ram|\bswap\b"
DIRECTIONS: dict[str, tuple[str, str]] = {
    "lower_gpu_memory": (
        rf"\b(lower|decrease|reduce|halve|smaller|shorter|fewer)\b[^.;]*({_MEMORY_KNOB}|batch|tokens|context|len|seqs)"
        r"|more gpu memory|headroom",
        rf"\b(raise|increase)\b[^.;]*({_MEMORY_KNOB})|{_HOST_RAM}",
    ),
    "raise_kv_budget": (
        rf"\b(raise|increase)\b[^.;]*({_MEMORY_KNOB})|\b(raise|double)\b[^.;]*(\btp\b|tensor.parallel|tp-size)",
        rf"\b(lower|decrease|reduce)\b[^.;]*({_MEMORY_KNOB})|{_HOST_RAM}",
    ),
    "more_host_memory": (
        rf"{_HOST_RAM}|\bram\b|oom.killer|dmesg|journalctl|loading workers|ranks per host|mmap",
        rf"{_MEMORY_KNOB}|cuda.graph|block size|num_stages",
    ),
    "fix_communication": (
        r"nccl|rank|network|interface|shm|shared memory|ipc|\bib\b|p2p|collective|socket|gloo|topo",
        rf"{_MEMORY_KNOB}|{_HOST_RAM}|block size|num_stages",
    ),
    "supported_build_or_hw": (
        r"arch|compute capability|sm_?\d|build|compiled for|toolkit|driver|supported|support|instruction|gpu model",
        rf"block size|num_stages|{_MEMORY_KNOB}|{_HOST_RAM}|batch",
    ),
    "fix_model_or_source": (
        r"model|checkpoint|path|token|access|gated|architecture|upgrade|file|config|weights|repository|engine",
        rf"{_MEMORY_KNOB}|{_HOST_RAM}|block size|num_stages|cuda.graph|nccl",
    ),
    "fix_flag": (
        r"flag|argument|option|value|--help|spelling|config|world size|host address",
        rf"{_MEMORY_KNOB}|{_HOST_RAM}|block size|nccl",
    ),
    "free_port": (r"port|process|address|bind", rf"{_MEMORY_KNOB}|{_HOST_RAM}|nccl"),
    "fix_dependency": (
        r"install|version|rebuild|build|package|library|module|torch|transformers|dependenc|nvcc|toolkit|pip",
        rf"{_MEMORY_KNOB}|{_HOST_RAM}|block size|num_stages|port",
    ),
    "fix_compile_toolchain": (
        r"compile|compiler|gcc|inductor|dynamo|toolchain|eager|libcuda",
        rf"{_MEMORY_KNOB}|{_HOST_RAM}|port",
    ),
    "fix_kernel_for_gpu": (r"block|num_stages|shared memory|kernel|triton|gpu|arch", rf"{_HOST_RAM}|port|nccl"),
    "debug_kernel": (
        r"cuda_launch_blocking|kernel|out of bounds|backend|graph",
        rf"{_MEMORY_KNOB}|{_HOST_RAM}|port",
    ),
    "capture_safety": (
        r"captur|eager|warm|generator|sample outside|sync|cuda.graph",
        rf"\b(lower|decrease|reduce|halve)\b[^.;]*({_MEMORY_KNOB}|cuda.graph.max.bs)|{_HOST_RAM}",
    ),
    "capture_settings": (r"captur|cuda.graph|custom.all.reduce|eager", rf"{_HOST_RAM}|port"),
    "investigate_hang": (
        r"worker|rank|hang|stuck|own log|phase|py-spy|engine",
        rf"\b(lower|decrease|reduce|raise|increase|smaller|larger)\b[^.;]*({_MEMORY_KNOB})|{_HOST_RAM}",
    ),
    "read_decisive_line": (
        r"evidence|decisive|read the|own log|other rank|faulty rank",
        rf"\b(raise|lower|increase|decrease|reduce|halve|smaller|fewer|shorter)\b[^.;]*"
        rf"({_MEMORY_KNOB}|batch|block size)|{_HOST_RAM}",
    ),
}


def load(path: Path) -> list[dict[str, Any]]:
    """The corpus records; a missing field is a ``ValueError`` naming the line."""
    records = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        record = json.loads(line)
        missing = [f for f in FIELDS if f not in record]
        if missing:
            raise ValueError(f"{path}:{n}: missing {', '.join(missing)}")
        record.setdefault("repo", record["source"].split("#", 1)[0])
        records.append(record)
    return records


def _cli(path: Path) -> str:
    exe = Path(sys.executable).with_name("campaign")
    done = subprocess.run([str(exe), "diagnose", str(path), "--json"], capture_output=True, text=True, timeout=120)
    try:
        return str(json.loads(done.stdout)["kind"])
    except (json.JSONDecodeError, KeyError):
        return f"<error: exit {done.returncode}: {done.stderr.strip()[-200:]}>"


def _all_patterns(text: str) -> dict[str, list[str]]:
    """Every droppable pattern of the rules file by where it sits: ``rules`` (by rule id) and the context lists."""
    import yaml

    data = yaml.safe_load(text)
    out: dict[str, list[str]] = {}
    for rule in data.get("rules") or []:
        out[f"rule:{rule['id']}"] = list(rule.get("patterns") or [])
    for name in ("crash", "death", "memory_pressure", "killed", "sglang_shape"):
        out[name] = list(data.get(name) or [])
    for group in ("wrappers", "ready", "phases"):
        for name, pats in (data.get(group) or {}).items():
            out[f"{group}.{name}"] = list(pats or [])
    for kind, causes in (data.get("causes") or {}).items():
        for c in causes or []:
            out[f"cause:{kind}.{c.get('id')}"] = list(c.get("evidence") or [])
    return out


def support(records: list[dict[str, Any]], rows: list[dict[str, Any]], text: str) -> dict[str, set[str]]:
    """Which repositories' excerpts each pattern helps get right (in-sample): its provenance.

    A rule's pattern supports an excerpt when the rule decided the excerpt, rightly, on a line that pattern matches.
    A context pattern (readiness, phases, wrappers, crash and death lines) supports a rightly diagnosed excerpt that
    has a line it matches.
    """
    from campaign.logscan import make_line

    found: dict[str, set[str]] = defaultdict(set)
    groups = _all_patterns(text)
    compiled = {p: re.compile(p, re.IGNORECASE) for ps in groups.values() for p in ps}
    by_id = {r["id"]: r for r in records}
    for row in rows:
        if row["in_sample"] != row["label"]:
            continue
        record = by_id[row["id"]]
        decided = row.get("decided_by")
        if decided:
            rule_id, line = decided
            for p in groups.get(f"rule:{rule_id}", []):
                if compiled[p].search(line):
                    found[p].add(row["repo"])
        lines = [make_line(i, t) for i, t in enumerate(record["excerpt"].split("\n"), start=1)]
        for name, ps in groups.items():
            if name.startswith("rule:"):
                continue
            for p in ps:
                if any(compiled[p].search(ln.message) or compiled[p].search(ln.text) for ln in lines):
                    found[p].add(row["repo"])
    return found


def score(records: list[dict[str, Any]], *, cli: bool = False) -> tuple[list[dict[str, Any]], dict[str, set[str]]]:
    """One row per launch-log excerpt (label, in-sample kind, held-out kind), and each pattern's provenance."""
    from campaign.diagnose import diagnose_file, parse_signatures, rules_text

    text = rules_text()
    rows = []
    with tempfile.TemporaryDirectory(prefix="score-diagnose-") as tmp:
        paths = {}
        for i, record in enumerate(records):
            if record["category"] == "wrong_output":
                continue
            path = paths[record["id"]] = Path(tmp) / f"{i}.log"
            path.write_text(record["excerpt"], encoding="utf-8")
            trace: list[Any] = []
            inside = diagnose_file(path, trace=trace).kind
            if cli:
                inside = _cli(path)
            rows.append(
                {
                    "id": record["id"],
                    "repo": record["repo"],
                    "label": record["category"],
                    "evidence": record.get("evidence", "in_excerpt"),
                    "in_sample": inside,
                    "decided_by": [trace[0][0].id, trace[0][1].message] if trace else None,
                }
            )
        provenance = support(records, rows, text)
        by_repo: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for row in rows:
            by_repo[row["repo"]].append(row)
        for repo, repo_rows in by_repo.items():
            # The rules as they would be had this repository's excerpts never been read: every pattern that only
            # this repository's excerpts support goes.
            drop = frozenset(p for p, repos in provenance.items() if repos == {repo})
            sigs = parse_signatures(text, drop=drop)
            for row in repo_rows:
                row["held_out"] = diagnose_file(paths[row["id"]], sigs=sigs).kind
                row["dropped_patterns"] = len(drop)
    return rows, provenance


def _pct(right: int, total: int) -> str:
    return f"{right}/{total} ({right / total:.0%})" if total else "-"


def right(row: dict[str, Any], mode: str) -> bool:
    """Whether the diagnosis in ``mode`` is right: the label, or ``inconclusive`` where the cause is not in the text."""
    kind = row[mode]
    return bool(kind == row["label"] or (row.get("evidence") == "outside_excerpt" and kind == "inconclusive"))


def _split(rows: list[dict[str, Any]]) -> dict[str, dict[str, int]]:
    out = {}
    for name, part in (
        ("outside_excerpt", [r for r in rows if r.get("evidence") == "outside_excerpt"]),
        ("in_excerpt", [r for r in rows if r.get("evidence") != "outside_excerpt"]),
    ):
        out[name] = {
            "of": len(part),
            "in_sample": sum(right(r, "in_sample") for r in part),
            "held_out": sum(right(r, "held_out") for r in part),
        }
    return out


def summarise(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Per-label and overall counts, and the two safety counts (failure called healthy, healthy called failure)."""
    per: dict[str, dict[str, int]] = defaultdict(
        lambda: {"of": 0, "in_sample": 0, "held_out": 0, "inconclusive": 0, "outside_excerpt": 0}
    )
    for r in rows:
        p = per[r["label"]]
        p["of"] += 1
        p["in_sample"] += right(r, "in_sample")
        p["held_out"] += right(r, "held_out")
        p["inconclusive"] += r["held_out"] == "inconclusive"
        p["outside_excerpt"] += r.get("evidence") == "outside_excerpt"
    bad: dict[str, list[str]] = {}
    for mode in ("in_sample", "held_out"):
        bad[f"{mode}_failure_called_healthy"] = [
            r["id"] for r in rows if r["label"] != "healthy" and r[mode] == "healthy"
        ]
        bad[f"{mode}_healthy_called_failure"] = [
            r["id"] for r in rows if r["label"] == "healthy" and r[mode] not in ("healthy", "inconclusive")
        ]
    total = len(rows)
    return {
        "excerpts": total,
        "repositories": len({r["repo"] for r in rows}),
        "in_sample": sum(right(r, "in_sample") for r in rows) / total if total else 0.0,
        "held_out": sum(right(r, "held_out") for r in rows) / total if total else 0.0,
        "by_evidence": _split(rows),
        "per_label": dict(sorted(per.items())),
        **bad,
    }


def table(summary: dict[str, Any]) -> str:
    """The per-label table in Markdown (what docs/diagnosis.md shows)."""
    out = [
        "| label | excerpts | cause outside the excerpt | in-sample | held out (leave-one-repository-out) "
        "| held out: inconclusive |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for label, p in summary["per_label"].items():
        out.append(
            f"| {label} | {p['of']} | {p['outside_excerpt']} | {_pct(p['in_sample'], p['of'])} "
            f"| {_pct(p['held_out'], p['of'])} | {p['inconclusive']} |"
        )
    n = summary["excerpts"]
    ins = round(summary["in_sample"] * n)
    held = round(summary["held_out"] * n)
    inconclusive = sum(p["inconclusive"] for p in summary["per_label"].values())
    marked = sum(p["outside_excerpt"] for p in summary["per_label"].values())
    out.append(f"| **all** | **{n}** | {marked} | **{_pct(ins, n)}** | **{_pct(held, n)}** | {inconclusive} |")
    for name, what in (("in_excerpt", "cause in the excerpt"), ("outside_excerpt", "cause outside the excerpt")):
        e = summary["by_evidence"][name]
        out.append(f"| *{what}* | {e['of']} | | {_pct(e['in_sample'], e['of'])} | {_pct(e['held_out'], e['of'])} | |")
    return "\n".join(out)


def load_heldout(folder: Path) -> list[dict[str, Any]]:
    """The held-out labels, each checked (fields, known kind and direction, the log file present).

    A bad record is a ``ValueError`` naming labels.jsonl's line and what to fix.
    """
    from campaign.diagnosis.signatures import signatures

    kinds = signatures().kinds

    path = folder / "labels.jsonl"
    records = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}:{n}: not JSON ({e.msg})") from e
        missing = [f for f in HELDOUT_FIELDS if f not in record]
        if missing:
            raise ValueError(f"{path}:{n}: missing {', '.join(missing)}")
        if record["kind"] not in kinds:
            raise ValueError(f"{path}:{n}: kind {record['kind']!r} is not a kind of campaign/signatures.yaml")
        if record["kind"] != "healthy" and record["direction"] not in DIRECTIONS:
            raise ValueError(f"{path}:{n}: direction {record['direction']!r} is not one of {', '.join(DIRECTIONS)}")
        if not (folder / record["file"]).is_file():
            raise ValueError(f"{path}:{n}: file {record['file']!r} is not in {folder}")
        records.append(record)
    return records


def wrong_way(direction: str, hint: str) -> bool:
    """Whether ``hint`` points away from ``direction`` (``DIRECTIONS``): its first advice is the wrong way."""
    if direction not in DIRECTIONS:
        return False
    right_way, away = DIRECTIONS[direction]
    # Only what the hint asserts counts: a clause that names advice to set it aside ("the usual advice to lower the
    # fraction is the wrong direction here") must not read as that advice.
    clauses = re.split(r"[.;:()\n]", hint.lower())
    text = " . ".join(c for c in clauses if not re.search(_SET_ASIDE, c))
    wrong = re.search(away, text)
    right = re.search(right_way, text)
    if wrong is None:
        return False
    return right is None or wrong.start() < right.start()


def score_heldout(folder: Path, records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per held-out excerpt: its label, the diagnosed kind and hint, whether the hint points the wrong way."""
    from campaign.diagnose import diagnose_file

    rows = []
    for record in records:
        diagnosis = diagnose_file(folder / record["file"])
        label = record["kind"]
        rows.append(
            {
                "id": record["id"],
                "file": record["file"],
                "label": label,
                "direction": record["direction"],
                "kind": diagnosis.kind,
                "hint": diagnosis.hint,
                "right": diagnosis.kind == label,
                "wrong_way": label != "healthy" and wrong_way(record["direction"], diagnosis.hint),
            }
        )
    return rows


def summarise_heldout(rows: list[dict[str, Any]], records: list[dict[str, Any]]) -> dict[str, Any]:
    """Top-1 accuracy per label and overall, and the three safety lists (ids)."""
    per: dict[str, dict[str, int]] = defaultdict(lambda: {"of": 0, "right": 0, "inconclusive": 0, "wrong_way": 0})
    for r in rows:
        p = per[r["label"]]
        p["of"] += 1
        p["right"] += r["right"]
        p["inconclusive"] += r["kind"] == "inconclusive"
        p["wrong_way"] += r["wrong_way"]
    total = len(rows)
    return {
        "excerpts": total,
        "threads": len({rec["url"] for rec in records}),
        "top1": sum(r["right"] for r in rows) / total if total else 0.0,
        "per_label": dict(sorted(per.items())),
        "failure_called_healthy": [r["id"] for r in rows if r["label"] != "healthy" and r["kind"] == "healthy"],
        "healthy_called_failure": [
            r["id"] for r in rows if r["label"] == "healthy" and r["kind"] not in ("healthy", "inconclusive")
        ],
        "hint_wrong_way": [r["id"] for r in rows if r["wrong_way"]],
    }


def heldout_table(summary: dict[str, Any]) -> str:
    """The held-out table in Markdown: top-1 per label, inconclusive and wrong-way hints."""
    out = ["| label | excerpts | top-1 | inconclusive | hint the wrong way |", "| --- | ---: | ---: | ---: | ---: |"]
    for label, p in summary["per_label"].items():
        out.append(f"| {label} | {p['of']} | {_pct(p['right'], p['of'])} | {p['inconclusive']} | {p['wrong_way']} |")
    n = summary["excerpts"]
    right_n = round(summary["top1"] * n)
    inconclusive = sum(p["inconclusive"] for p in summary["per_label"].values())
    out.append(f"| **all** | **{n}** | **{_pct(right_n, n)}** | {inconclusive} | {len(summary['hint_wrong_way'])} |")
    return "\n".join(out)


def main_heldout(folder: Path, out: Path, *, misses: bool) -> int:
    """Score the held-out folder: the table, the safety counts, the JSON; 0 iff every target is met, 2 on bad input."""
    try:
        records = load_heldout(folder)
    except (OSError, ValueError) as e:
        print(f"cannot read the held-out folder: {e}", file=sys.stderr)
        return 2
    rows = score_heldout(folder, records)
    summary = summarise_heldout(rows, records)
    print(f"{summary['excerpts']} held-out excerpts from {summary['threads']} threads ({folder})\n")
    print(heldout_table(summary))
    print()
    for key in ("failure_called_healthy", "healthy_called_failure", "hint_wrong_way"):
        ids = summary[key]
        print(f"{key.replace('_', ' ')}: {len(ids)}" + (f"  ({', '.join(ids)})" if ids else ""))
    if misses:
        print()
        for r in rows:
            if not r["right"] or r["wrong_way"]:
                mark = " (hint the wrong way)" if r["wrong_way"] else ""
                print(f"{r['label']:<28} got={r['kind']:<28} {r['file']}{mark}")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"summary": summary, "results": rows}, indent=2) + "\n", encoding="utf-8")
    print(f"\nwrote {out}")
    safe = not (summary["failure_called_healthy"] or summary["healthy_called_failure"] or summary["hint_wrong_way"])
    return 0 if summary["top1"] >= TARGET and safe else 1


def main(argv: list[str] | None = None) -> int:
    """Score, print the table and the safety counts, write the JSON; the exit status says whether targets are met."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpus", type=Path, default=DEFAULT_CORPUS, help="labelled JSONL")
    parser.add_argument("--out", type=Path, help="where the JSON goes (default runs/diagnose-score.json, or …-heldout)")
    parser.add_argument("--cli", action="store_true", help="in-sample through `campaign diagnose --json` (slow)")
    parser.add_argument("--misses", action="store_true", help="list every held-out miss")
    parser.add_argument(
        "--heldout",
        nargs="?",
        type=Path,
        const=DEFAULT_HELDOUT,
        metavar="FOLDER",
        help="score the frozen held-out folder (default tests/data/heldout) instead of the corpus",
    )
    args = parser.parse_args(argv)
    if args.heldout is not None:
        return main_heldout(args.heldout, args.out or ROOT / "runs" / "diagnose-heldout.json", misses=args.misses)
    args.out = args.out or ROOT / "runs" / "diagnose-score.json"
    try:
        records = load(args.corpus)
    except (OSError, ValueError) as e:
        print(f"cannot read the corpus: {e}", file=sys.stderr)
        return 2
    rows, provenance = score(records, cli=args.cli)
    summary = summarise(rows)
    PROVENANCE.write_text(
        json.dumps({p: sorted(r) for p, r in sorted(provenance.items())}, indent=1) + "\n", encoding="utf-8"
    )
    print(
        f"{summary['excerpts']} launch-log excerpts from {summary['repositories']} repositories "
        f"({args.corpus.relative_to(ROOT) if args.corpus.is_relative_to(ROOT) else args.corpus})\n"
    )
    print(table(summary))
    print()
    for key in (
        "in_sample_failure_called_healthy",
        "held_out_failure_called_healthy",
        "in_sample_healthy_called_failure",
        "held_out_healthy_called_failure",
    ):
        ids = summary[key]
        print(f"{key.replace('_', ' ')}: {len(ids)}" + (f"  ({', '.join(ids)})" if ids else ""))
    if args.misses:
        print()
        for r in rows:
            if not right(r, "held_out") or not right(r, "in_sample"):
                mark = " (cause outside the excerpt)" if r.get("evidence") == "outside_excerpt" else ""
                print(
                    f"{r['label']:<28} in={r['in_sample']:<28} held={r['held_out']:<28} {r['id']} [{r['repo']}]{mark}"
                )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"summary": summary, "results": rows}, indent=2) + "\n", encoding="utf-8")
    print(f"\nwrote {args.out}")
    safe = not any(summary[k] for k in summary if k.endswith(("called_healthy", "called_failure")))
    return 0 if summary["held_out"] >= TARGET and safe else 1


if __name__ == "__main__":
    sys.exit(main())
