"""Attribution on the real reference server: a knob that really fails on this CPU-only host is named, alone.

CUDA graphs cannot be captured without a GPU, so in a matrix of attention backend x cuda_graph every cuda_graph=on
variant fails, with either backend. The simt backend runs under Triton's interpreter on the CPU.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import yaml

from tests.test_loop import campaign, free_port


def _experiment(tmp: Path, name: str, **body: Any) -> Path:
    doc: dict[str, Any] = {
        "name": name,
        "host": {"kind": "local", "workdir": str(tmp / "box")},
        "recipe": "refserver",
        "vars": {"python": sys.executable},
        "baseline": {
            "knobs": {"device": "cpu", "attention": "torch", "cuda_graph": False, "port": free_port()},
            "env": {"TRITON_INTERPRET": "1"},
        },
        "smoke": {"questions": 2, "seed": 1},
        "timeouts": {"ready_s": 90, "stop_grace_s": 5},
        "at_end": "stop",
        **body,
    }
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def _explained(doc: dict[str, Any]) -> list[dict[str, Any]]:
    return [f for f in doc["attribution"] if f.get("status") == "explained"]


def test_matrix_names_the_failing_knob_and_only_it(tmp_path: Path) -> None:
    """attention {torch, simt} x cuda_graph {off, on}: the failure is cuda_graph=on, independent of attention."""
    # Bursts to 8, not 32: simt decodes under Triton's interpreter, so each simt server (the variant, then the restore
    # of it as the last known-good) spends minutes in a burst of 32; the isolation test below keeps the full burst.
    path = _experiment(
        tmp_path,
        "matrix",
        matrix={"axes": {"attention": ["torch", "simt"], "cuda_graph": [False, True]}},
        smoke={"questions": 2, "seed": 1, "burst_max": 8},
    )
    runs = tmp_path / "runs"
    dry = json.loads(campaign("run", str(path), "--dry-run", "--json", runs=runs).stdout)
    assert len(dry["variants"]) == 4 and dry["matrix"]["axes"]["cuda_graph"] == [False, True]
    res = campaign("run", str(path), "--json", runs=runs)
    assert res.returncode == 1, res.stderr
    doc = json.loads(res.stdout)
    variants = [a for a in doc["attempts"] if a["role"] == "variant"]
    failed = [a for a in variants if a["outcome"] == "failed"]
    assert {a["knobs"]["attention"] for a in failed} == {"torch", "simt"}
    assert all(a["knobs"]["cuda_graph"] is True for a in failed)
    assert all(a["outcome"] == "passed" for a in variants if a["knobs"]["cuda_graph"] is False)
    findings = _explained(doc)
    assert len(findings) == 1
    finding = findings[0]
    assert finding["cause"] == {"cuda_graph": True}
    assert sorted(finding["independent_of"]["attention"]) == ["simt", "torch"]
    assert "cuda_graph" in finding["statement"]
    # The same conclusion is in the stored report and in `campaign show`.
    shown = campaign("show", doc["run_id"], runs=runs)
    assert "Attribution" in shown.stdout and "cuda_graph" in shown.stdout


def test_isolate_runs_the_controlled_experiment(tmp_path: Path) -> None:
    """One failing variant (simt + CUDA graphs) with --isolate: each knob set back alone localises the cause."""
    path = _experiment(
        tmp_path, "isolate", variants=[{"name": "simt-graphs", "knobs": {"attention": "simt", "cuda_graph": True}}]
    )
    runs = tmp_path / "runs"
    res = campaign("run", str(path), "--isolate", "--json", runs=runs)
    assert res.returncode == 1, res.stderr
    doc = json.loads(res.stdout)
    iso = [a for a in doc["attempts"] if a["role"] == "isolation"]
    assert sorted((a["knobs"]["attention"], a["knobs"]["cuda_graph"]) for a in iso) == [
        ("simt", False),
        ("torch", True),
    ]
    outcome = {(a["knobs"]["attention"], a["knobs"]["cuda_graph"]): a["outcome"] for a in iso}
    assert outcome == {("simt", False): "passed", ("torch", True): "failed"}
    findings = _explained(doc)
    assert [f["cause"] for f in findings] == [{"cuda_graph": True}]
    assert doc["restore"]["outcome"] == "restored"
    assert doc["final"]["healthy"] is True
