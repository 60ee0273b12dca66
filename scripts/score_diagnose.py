"""Score ``campaign diagnose`` on the shared labelled excerpts: a per-label table, the overall accuracy, a JSON file.

Each excerpt of real-failures.jsonl is written as a log file of its own and diagnosed with
``campaign diagnose --json FILE`` (the real command, as a user runs it). Where that command does not exist yet the
script says so and calls ``campaign.diagnose.diagnose_file`` in-process instead. wrong_output excerpts are model
output, not launch logs, and are left out of the accuracy (the smoke test, not the log, finds them).

    .venv/bin/python scripts/score_diagnose.py [--excerpts FILE] [--out FILE] [--in-process]

Exit status: 0 when the accuracy is at least 90% and no healthy log was called a failure, 1 otherwise, 2 on bad input.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from collections import defaultdict
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_EXCERPTS = ROOT.parent / "shared" / "logs" / "real-failures.jsonl"
FALLBACK_EXCERPTS = ROOT / "tests" / "data" / "real-failures.jsonl"
TARGET = 0.9


def _campaign_command() -> list[str] | None:
    """The ``campaign`` console script if it has a ``diagnose`` command, else None."""
    exe = Path(sys.executable).with_name("campaign")
    command = [str(exe)] if exe.exists() else ([found] if (found := shutil.which("campaign")) else None)
    if command is None:
        return None
    probe = subprocess.run([*command, "diagnose", "--help"], capture_output=True, text=True, timeout=60)
    return command if probe.returncode == 0 else None


def _diagnose_cli(command: list[str], path: Path, server: str | None) -> dict[str, Any]:
    args = [*command, "diagnose", str(path), "--json"] + (["--server", server] if server else [])
    done = subprocess.run(args, capture_output=True, text=True, timeout=60)
    try:
        result: dict[str, Any] = json.loads(done.stdout)
    except json.JSONDecodeError:
        return {"kind": f"<error: exit {done.returncode}: {done.stderr.strip()[-200:]}>"}
    return result


def _diagnose_in_process(path: Path, server: str | None) -> dict[str, Any]:
    from campaign.diagnose import diagnose_file

    return diagnose_file(path, server=server).model_dump()


def main(argv: list[str] | None = None) -> int:
    """Score every excerpt, print the table, write the JSON; the exit status says whether the target is met."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--excerpts", type=Path, default=None, help="labelled JSONL (default: the shared file)")
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "diagnose-score.json", help="where the JSON goes")
    parser.add_argument("--in-process", action="store_true", help="call diagnose_file instead of the CLI")
    parser.add_argument("--server-hint", action="store_true", help="pass each excerpt's server as --server")
    args = parser.parse_args(argv)
    console = Console(highlight=False, width=None if sys.stdout.isatty() else 140)
    err = Console(stderr=True, highlight=False)

    source = args.excerpts or (DEFAULT_EXCERPTS if DEFAULT_EXCERPTS.exists() else FALLBACK_EXCERPTS)
    try:
        records = [json.loads(line) for line in source.read_text(encoding="utf-8").splitlines() if line.strip()]
    except (OSError, json.JSONDecodeError) as e:
        err.print(f"cannot read excerpts from {source}: {e}")
        return 2

    command = None if args.in_process else _campaign_command()
    how = f"{' '.join(command)} diagnose --json" if command else "campaign.diagnose.diagnose_file (in-process)"
    if command is None and not args.in_process:
        err.print("`campaign diagnose` is not available here; scoring in-process instead")

    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="score-diagnose-") as tmp:
        for record in records:
            path = Path(tmp) / f"{record['id']}.log"
            path.write_text(record["excerpt"], encoding="utf-8")
            server = record.get("server") if args.server_hint and record.get("server") != "other" else None
            result = _diagnose_cli(command, path, server) if command else _diagnose_in_process(path, server)
            rows.append(
                {
                    "id": record["id"],
                    "label": record["category"],
                    "kind": result.get("kind"),
                    "confidence": result.get("confidence"),
                    "correct": result.get("kind") == record["category"],
                    "summary": result.get("summary", ""),
                }
            )

    scored = [r for r in rows if r["label"] != "wrong_output"]
    per_label: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in scored:
        per_label[r["label"]].append(r)
    table = Table(title=f"diagnose on {source.name} ({how})", title_justify="left")
    table.add_column("label")
    table.add_column("right", justify="right")
    table.add_column("of", justify="right")
    table.add_column("misses", overflow="fold")
    for label in sorted(per_label):
        items = per_label[label]
        misses = ", ".join(f"{r['id']} -> {r['kind']}" for r in items if not r["correct"])
        table.add_row(label, str(sum(r["correct"] for r in items)), str(len(items)), misses)
    console.print(table)

    right = sum(r["correct"] for r in scored)
    accuracy = right / len(scored) if scored else 0.0
    healthy_failed = [r["id"] for r in scored if r["label"] == "healthy" and r["kind"] != "healthy"]
    console.print(f"accuracy {right}/{len(scored)} = {accuracy:.1%} (wrong_output excerpts left out)")
    console.print(f"healthy logs called a failure: {len(healthy_failed)}")

    report = {
        "source": str(source),
        "how": how,
        "accuracy": accuracy,
        "right": right,
        "scored": len(scored),
        "healthy_called_failure": healthy_failed,
        "per_label": {k: {"right": sum(r["correct"] for r in v), "of": len(v)} for k, v in sorted(per_label.items())},
        "results": rows,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    console.print(f"wrote {args.out}")
    return 0 if accuracy >= TARGET and not healthy_failed else 1


if __name__ == "__main__":
    sys.exit(main())
