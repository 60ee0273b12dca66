"""The offline sm_90 compile report: the tiled SIMT kernel compiles for Hopper with CUDA-core FMAs only, no spills.

Needs no GPU: Triton compiles for sm_90 on this machine and its bundled ptxas and cuobjdump read the result.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

triton = pytest.importorskip("triton")
pytest.importorskip("torch")
ROOT = Path(__file__).resolve().parents[1]
TOOLS = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
needs_tools = pytest.mark.skipif(
    not all(os.access(os.path.join(TOOLS, t), os.X_OK) for t in ("ptxas", "cuobjdump")),
    reason="Triton's bundled ptxas/cuobjdump are not on this platform",
)


def offline(tmp_path: Path, *args: str) -> list[dict]:
    """Run ``python -m mla_kernels.sass ARGS`` in a process of its own (other kernel tests in this one may have turned
    the interpreter on) and return its JSON reports."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"} | {"PYTHONPATH": str(ROOT)}
    out = tmp_path / "sass.json"
    cmd = [sys.executable, "-m", "mla_kernels.sass", *args, "--json", str(out)]
    res = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    return json.loads(out.read_text())


@needs_tools
def test_default_tiled_kernel_is_simt_at_sm90_without_spills(tmp_path: Path) -> None:
    (rep,) = offline(tmp_path, "--config", "default", "--shape", "16x32")
    assert rep["name"] == "default" and (rep["H"], rep["B"]) == (16, 32)
    assert rep["ops"].get("HMMA", 0) == 0 and rep["ops"].get("HGMMA", 0) == 0  # no tensor-core instruction
    assert rep["spill_store_bytes"] == 0 and rep["spill_load_bytes"] == 0
    assert 0 < rep["registers"] <= 255
    tile = rep["per_tile"]
    # Every q·K and p·V product of a tile (16 heads x 16 rows x (576 + 512), over 256 threads) is an FFMA, or an FMUL
    # where a reduction starts (Triton 3.6 chains the sums; 3.8 pairs them, half FMUL + FADD), plus the rescales.
    products = 16 * 16 * 1088 // 256
    assert products - 32 <= tile["FFMA"] + tile["FMUL"] <= 1.5 * products
    assert 0 < tile["ffma_share"] < 1


@needs_tools
def test_v_split_candidate_is_wgmma_with_heads_as_m_and_no_spills(tmp_path: Path) -> None:
    for rep in offline(tmp_path, "--mma"):
        assert rep["H"] == 128 and rep["ops"].get("HGMMA", 0) > 0 and rep["ops"].get("HMMA", 0) == 0
        # q·K is m64 (64 heads) x n16 (BLOCK_N rows); p·V is m64 x n256 (one half of the latent).
        assert set(rep["wgmma_shapes"]) == {"m64n16k16", "m64n256k16"}
        assert rep["spill_store_bytes"] == 0 and rep["spill_load_bytes"] == 0


@needs_tools
def test_warpgroup_kernel_is_wgmma_at_sm90_without_spills(tmp_path: Path) -> None:
    pytest.importorskip("triton.experimental.gluon", reason="this Triton has no Gluon")
    reps = offline(tmp_path, "--warpgroup")
    assert [(r["H"], r["B"]) for r in reps] == [(128, 32), (128, 128)]
    for rep in reps:
        # Both products on warpgroup MMAs: 64 heads x 32 tile rows per warpgroup for q·K, 64 x 256 latent for p·V.
        assert rep["ops"].get("HGMMA", 0) > 0 and rep["ops"].get("HMMA", 0) == 0
        assert rep["wgmma_shapes"] == ["m64n256k16", "m64n32k16"]
        assert rep["spill_store_bytes"] == 0 and rep["spill_load_bytes"] == 0
        assert 0 < rep["registers"] <= 255
        # q and two 64-row KV tiles in shared memory fit one program per SM (227 KB on Hopper).
        assert rep["shared_bytes"] <= 227 * 1024


@needs_tools
def test_mmasync_kernel_is_mma_sync_at_sm90_without_spills(tmp_path: Path) -> None:
    pytest.importorskip("triton.experimental.gluon", reason="this Triton has no Gluon")
    reps = offline(tmp_path, "--mmasync")
    assert [(r["H"], r["B"]) for r in reps] == [(16, 32), (16, 128)]
    for rep in reps:
        assert rep["ops"].get("HMMA", 0) > 0 and rep["ops"].get("HGMMA", 0) == 0
        assert rep["spill_store_bytes"] == 0 and rep["spill_load_bytes"] == 0
        # Two programs per SM: at most 255 registers for 4 warps and half of Hopper's 227 KB of shared memory.
        assert 0 < rep["registers"] <= 255 and rep["shared_bytes"] <= 227 * 1024 // 2
