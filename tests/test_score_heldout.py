"""``scripts/score_diagnose.py --heldout``: the held-out scoring, run as a user runs it, on a folder of its own.

The folder here is made of the repository's variant logs (tests/data/variants), never of tests/data/heldout: that
folder is scored once, at the end (its README.md), and no test reads it beyond checking that it is well formed.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "score_diagnose.py"
VARIANTS = ROOT / "tests" / "data" / "variants"
HELDOUT = ROOT / "tests" / "data" / "heldout"


def _folder(tmp_path: Path, labels: list[tuple[str, str, str]]) -> Path:
    """A held-out-shaped folder: each (variant file, labelled kind, direction) copied and labelled."""
    folder = tmp_path / "heldout"
    folder.mkdir()
    lines = []
    for n, (name, kind, direction) in enumerate(labels, start=1):
        shutil.copy(VARIANTS / name, folder / name)
        record = {
            "id": f"{n:03d}",
            "file": name,
            "kind": kind,
            "direction": direction,
            "hint_direction": "(test)",
            "url": f"https://example.invalid/{n}",
            "server": "test",
            "version": None,
            "date": "2026-12-05",
        }
        lines.append(json.dumps(record))
    (folder / "labels.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return folder


def _run(folder: Path, out: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), "--heldout", str(folder), "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def test_right_labels_meet_the_targets(tmp_path: Path) -> None:
    folder = _folder(
        tmp_path,
        [
            ("healthy--sglang-full-startup.log", "healthy", "n/a"),
            ("port_in_use--refserver-uvicorn-errno98.log", "port_in_use", "free_port"),
            ("gpu_oom--vllm-import-warning-then-kv-too-small.log", "gpu_oom", "raise_kv_budget"),
        ],
    )
    done = _run(folder, tmp_path / "out.json")
    assert done.returncode == 0, done.stdout + done.stderr
    summary = json.loads((tmp_path / "out.json").read_text(encoding="utf-8"))["summary"]
    assert summary["excerpts"] == 3
    assert summary["top1"] == 1.0
    assert summary["failure_called_healthy"] == summary["healthy_called_failure"] == summary["hint_wrong_way"] == []
    assert "| **all** | **3** | **3/3 (100%)** |" in done.stdout


def test_a_missed_failure_and_a_hint_the_wrong_way_are_counted_and_fail_the_run(tmp_path: Path) -> None:
    folder = _folder(
        tmp_path,
        [
            # A healthy log labelled as a failure: the diagnosis (healthy) is a failure called healthy.
            ("healthy--vllm-v1-full-startup.log", "gpu_oom", "lower_gpu_memory"),
            # The KV pool is too small and the hint's first step is to raise the fraction: against "lower GPU memory"
            # that is the wrong way (its aside about the usual advice to lower it does not count as advice).
            ("gpu_oom--vllm-import-warning-then-kv-too-small.log", "gpu_oom", "lower_gpu_memory"),
        ],
    )
    done = _run(folder, tmp_path / "out.json")
    assert done.returncode == 1, done.stdout + done.stderr
    summary = json.loads((tmp_path / "out.json").read_text(encoding="utf-8"))["summary"]
    assert summary["failure_called_healthy"] == ["001"]
    assert summary["hint_wrong_way"] == ["002"]
    assert "failure called healthy: 1  (001)" in done.stdout
    assert "hint wrong way: 1  (002)" in done.stdout


def test_a_bad_label_is_a_clear_message_and_exit_2(tmp_path: Path) -> None:
    folder = _folder(tmp_path, [("healthy--sglang-full-startup.log", "healthy", "n/a")])
    with (folder / "labels.jsonl").open("a", encoding="utf-8") as f:
        f.write(json.dumps({"id": "002", "file": "missing.log", "kind": "no_such_kind"}) + "\n")
    done = _run(folder, tmp_path / "out.json")
    assert done.returncode == 2
    assert "labels.jsonl:2: missing direction" in done.stderr
    assert "Traceback" not in done.stderr


def test_the_frozen_folder_is_well_formed() -> None:
    """Only its shape: every label names a file of the folder, every file is labelled, threads.txt lists the URLs."""
    labels = [json.loads(line) for line in (HELDOUT / "labels.jsonl").read_text(encoding="utf-8").splitlines()]
    files = {p.name for p in HELDOUT.glob("*.log")}
    assert {r["file"] for r in labels} == files
    assert len(labels) >= 70
    urls = (HELDOUT / "threads.txt").read_text(encoding="utf-8").split()
    assert sorted(set(urls)) == sorted({r["url"] for r in labels})
    assert len(urls) >= 40
