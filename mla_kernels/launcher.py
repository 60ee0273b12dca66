"""The host side the two Gluon kernels share: compile-time arguments, a decode call with its merge, the PTX report.

``mla_kernels.warpgroup`` and ``mla_kernels.mmasync`` differ in their kernel, its grid and what inputs they take;
each passes its own ``plan`` and ``_launch`` here and keeps its own input check and refusal message.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from mla_kernels.merge import SplitPlan, merge, outputs

#: ``plan(q, k, cfg, num_splits)`` of a Gluon kernel module.
Planner = Callable[[torch.Tensor, int, Any, "int | None"], SplitPlan]
#: ``_launch(q, kv, indices, sm_scale, d_v, cfg, plan, out, lse, part, plse)``: Triton's compiled-kernel handle.
Launcher = Callable[..., Any]


def launch_constexprs(cfg: Any, plan: SplitPlan) -> dict[str, Any]:
    """The kernel's compile-time arguments for ``cfg`` (block_n, num_buf, split_p) and ``plan``.

    The launch and the offline compile report (``mla_kernels.sass.gluon_report``) both take them from here.
    """
    return {
        "TILES_PER_SPLIT": plan.tiles_per_split, "NUM_SPLITS": plan.num_splits, "BLOCK_N": cfg.block_n,
        "NUM_BUF": cfg.num_buf, "DIRECT": plan.num_splits == 1, "SPLIT_P": cfg.split_p,
    }  # fmt: skip


def decode(
    plan: Planner,
    launch: Launcher,
    q: torch.Tensor,
    kv: torch.Tensor,
    indices: torch.Tensor,
    sm_scale: float,
    d_v: int,
    cfg: Any,
    num_splits: int | None,
    out: torch.Tensor | None,
    lse: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Run a checked Gluon kernel on these inputs, then the merge when the top-k axis is split; return (out, lse)."""
    q = q if q.stride(2) == 1 else q.contiguous()
    kv = kv if kv.stride(1) == 1 else kv.contiguous()
    indices = indices if indices.stride(1) == 1 else indices.contiguous()
    splits = plan(q, indices.shape[1], cfg, num_splits)
    out, lse, part, plse = outputs(q, d_v, splits, out, lse)
    launch(q, kv, indices, sm_scale, d_v, cfg, splits, out, lse, part, plse)
    if splits.num_splits > 1:
        merge(part, plse, out, lse)
    return out, lse


def matrix_instructions(
    plan: Planner,
    launch: Launcher,
    q: torch.Tensor,
    kv: torch.Tensor,
    indices: torch.Tensor,
    sm_scale: float,
    d_v: int,
    cfg: Any,
    num_splits: int | None,
) -> dict[str, Any]:
    """Compile and run the kernel; return its matrix instructions, registers, spills, shared bytes and copies.

    The keys are those of ``mla_kernels.mma.matrix_instructions``, so the tuning sweep prints every kernel alike.
    """
    splits = plan(q, indices.shape[1], cfg, num_splits)
    out, lse, part, plse = outputs(q, d_v, splits, None, None)
    compiled = launch(q, kv, indices, sm_scale, d_v, cfg, splits, out, lse, part, plse)
    ptx = compiled.asm.get("ptx", "")
    return {
        "wgmma": ptx.count("wgmma.mma_async"),
        "mma.sync": ptx.count("mma.sync"),
        "registers": int(getattr(compiled, "n_regs", -1)),
        "spills": int(getattr(compiled, "n_spills", -1)),
        "shared_bytes": int(getattr(getattr(compiled, "metadata", None), "shared", -1)),
        "async_copies": ptx.count("cp.async.cg") + ptx.count("cp.async.ca"),
        "kv_buffers": cfg.num_buf,
    }
