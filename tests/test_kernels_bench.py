"""The benchmark script runs end to end (tiny shapes, CPU interpreter) and refuses plainly without a GPU."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
ROOT = Path(__file__).resolve().parents[1]


def bench(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-m", "mla_kernels.bench", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_smoke_run_writes_every_section(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    res = bench("--smoke", "--json", str(out))
    assert res.returncode == 0, res.stderr[-2000:]
    report = json.loads(out.read_text())
    assert {"environment", "ceilings", "decode", "indexer", "summary"} <= report.keys()
    backends = ["torch", "simt", "simt-tiled", "simt-tiled-h8", "simt-tiled-s1", "mma"]
    assert [r["backend"] for r in report["decode"]] == backends
    # The SIMT rows carry their own floor (measured FMA rate or bytes), the summary the fair ratio.
    simt_rows = [r for r in report["decode"] if r["backend"].startswith("simt")]
    assert all(r["simt_floor_us"] > 0 and r["fraction_of_simt_floor"] > 0 for r in simt_rows)
    assert report["ceilings"]["fma_flops_per_s"] > 0
    assert report["summary"]["H=4 B=2 L=256"]["mma_over_simt_tiled"] > 0
    assert all(r["check_ok"] and r["median_us"] > 0 for r in report["decode"])
    assert {(r["form"], r["M"]) for r in report["indexer"]} == {(f, m) for f in ("aware", "naive") for m in (256, 1024)}
    assert "mma over" not in res.stdout  # the table prints figures, not prose
    assert "H=4 B=2 L=256" in report["summary"]
    # The short table comes last: one line per backend at the largest context.
    tail = res.stdout.strip().splitlines()[-6:]
    assert [line.split()[2] for line in tail] == backends


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU refusal")
def test_without_a_gpu_it_says_so_and_exits_2() -> None:
    res = bench()
    assert res.returncode == 2
    assert "CUDA GPU" in res.stderr and "Traceback" not in res.stderr


def test_position_order_and_a_subset_of_backends(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    res = bench(
        "--smoke", "--skip", "indexer", "--backends", "torch,mma", "--index-order", "position", "--json", str(out)
    )
    assert res.returncode == 0, res.stderr[-2000:]
    report = json.loads(out.read_text())
    assert report["index_order"] == "position"
    assert [(r["backend"], r["index_order"]) for r in report["decode"]] == [("torch", "position"), ("mma", "position")]
    assert all(r["check_ok"] for r in report["decode"])


def test_an_unknown_backend_is_named_with_the_choices() -> None:
    res = bench("--smoke", "--backends", "mma,wgmma")
    assert res.returncode == 2
    assert "unknown wgmma" in res.stderr and "mma-tl" in res.stderr and "Traceback" not in res.stderr
