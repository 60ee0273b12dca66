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

``--cli`` diagnoses in-sample through the real ``campaign diagnose --json FILE`` (one process per excerpt; slow);
otherwise ``campaign.diagnose.diagnose_file`` is called in-process (the same code path after argument parsing).
Exit status: 0 when the held-out accuracy is at least 90%, no failure excerpt was called healthy and no healthy
excerpt a failure (in either scoring); 1 otherwise; 2 on bad input.
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


def main(argv: list[str] | None = None) -> int:
    """Score, print the table and the safety counts, write the JSON; the exit status says whether targets are met."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpus", type=Path, default=DEFAULT_CORPUS, help="labelled JSONL")
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "diagnose-score.json", help="where the JSON goes")
    parser.add_argument("--cli", action="store_true", help="in-sample through `campaign diagnose --json` (slow)")
    parser.add_argument("--misses", action="store_true", help="list every held-out miss")
    args = parser.parse_args(argv)
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
