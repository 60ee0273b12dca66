"""Split-K for decode: how many splits of the top-k axis to launch, and the kernel that merges their partials.

Flash-decoding: when B·(head programs) alone cannot fill the GPU, each program takes one slice of the top-k axis
and writes a normalized fp32 partial output plus its log-sum-exp; the merge weighs the partials by exp(lse).
Partials cost B·H·S·(D_v + 1)·4 bytes written and read again, so S is only as large as needed to fill the GPU.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from mla_kernels.device import interpreting, program_slots

LOG2E = 1.4426950408889634
LN2 = 0.6931471805599453
# Aim for this many programs per multiprocessor before splitting further: a second wave hides gather latency.
PROGRAMS_PER_SM = 2
# A split shorter than this many tiles spends more on its partial than it saves.
MIN_TILES_PER_SPLIT = 2


@triton.jit
def downcast(x, DST: tl.constexpr, EMULATE_RTNE: tl.constexpr):
    """Convert fp32 ``x`` to DST; with EMULATE_RTNE, round to nearest even by hand first.

    Triton 3.6's interpreter truncates fp32 to bf16 (the GPU rounds to nearest even); rounding the fp32 bits to a
    bf16-representable value first makes both give the same numbers.
    """
    if EMULATE_RTNE:
        bits = x.to(tl.int32, bitcast=True)
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & -65536
        x = bits.to(tl.float32, bitcast=True)
    return x.to(DST)


def emulate_rtne(dtype: torch.dtype) -> bool:
    """Return whether kernels must round fp32 to ``dtype`` by hand (bf16 under the interpreter)."""
    return dtype == torch.bfloat16 and interpreting()


@dataclass(frozen=True)
class SplitPlan:
    """How the top-k axis of length K is cut: ``num_splits`` slices of ``tiles_per_split`` tiles of ``block_n``."""

    block_n: int
    num_splits: int
    tiles_per_split: int


def plan_splits(
    t: torch.Tensor,
    k: int,
    block_n: int,
    programs: int,
    num_splits: int | None = None,
    programs_per_sm: int = PROGRAMS_PER_SM,
    whole_wave: bool = False,
    slots: int | None = None,
) -> SplitPlan:
    """Choose the number of splits for K indices when ``programs`` programs already run without splitting.

    The plan aims at ``programs_per_sm`` programs per SM; ``whole_wave`` rounds the split count down, so that all
    programs are resident at once (1.45 waves of programs measured 19% slower than one full wave on the H200).
    ``slots`` is the SM count to plan for (default: t's device's).
    """
    tiles = max(1, triton.cdiv(k, block_n))
    if num_splits is None:
        target = programs_per_sm * (program_slots(t) if slots is None else slots)
        per_row = target // max(programs, 1) if whole_wave else triton.cdiv(target, max(programs, 1))
        num_splits = max(1, min(per_row, tiles // MIN_TILES_PER_SPLIT))
    num_splits = max(1, min(num_splits, tiles))
    per_split = triton.cdiv(tiles, num_splits)
    # Re-derive S so that no split is empty.
    return SplitPlan(block_n=block_n, num_splits=triton.cdiv(tiles, per_split), tiles_per_split=per_split)


def plan_head_groups(
    q: torch.Tensor,
    k: int,
    cfg: Any,
    num_splits: int | None = None,
    slots: int | None = None,
    per_group: int = 1,
) -> SplitPlan:
    """The split plan of a kernel with B·ceil(H/cfg.block_h)·per_group programs before splitting (q [B, H, D]).

    ``cfg`` is any kernel configuration with block_h, block_n, programs_per_sm and whole_wave (MmaConfig,
    TiledConfig); ``num_splits`` overrides the split count, ``slots`` the SM count.
    """
    b, h, _ = q.shape
    programs = b * triton.cdiv(h, cfg.block_h) * per_group
    return plan_splits(q, k, cfg.block_n, programs, num_splits, cfg.programs_per_sm, cfg.whole_wave, slots)


def outputs(
    q: torch.Tensor, d_v: int, plan: SplitPlan, out: torch.Tensor | None, lse: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Return (out, lse, partials, partial_lse): the caller's buffers or new ones, and the split scratch.

    With one split the kernel writes out and lse itself, and the scratch names them only to fill the argument list.
    """
    b, h, _ = q.shape
    if out is None:
        out = torch.empty((b, h, d_v), dtype=q.dtype, device=q.device)
    if lse is None:
        lse = torch.empty((b, h), dtype=torch.float32, device=q.device)
    if tuple(out.shape) != (b, h, d_v) or out.dtype != q.dtype or not out.is_contiguous():
        raise ValueError(f"out must be a contiguous [{b}, {h}, {d_v}] {q.dtype} tensor")
    if tuple(lse.shape) != (b, h) or lse.dtype != torch.float32 or not lse.is_contiguous():
        raise ValueError(f"lse must be a contiguous [{b}, {h}] float32 tensor")
    if plan.num_splits == 1:
        return out, lse, out, lse
    part = torch.empty((b, h, plan.num_splits, d_v), dtype=torch.float32, device=q.device)
    plse = torch.empty((b, h, plan.num_splits), dtype=torch.float32, device=q.device)
    return out, lse, part, plse


@triton.jit
def _merge_kernel(
    part_ptr,
    plse_ptr,
    out_ptr,
    lse_ptr,
    H,
    NUM_SPLITS,
    D_V: tl.constexpr,
    BLOCK_S: tl.constexpr,
    BLOCK_DV: tl.constexpr,
    OUT_RTNE: tl.constexpr,
    WAIT: tl.constexpr,
):
    """Merge S partials of one (row, head): out = Σ_s exp(lse_s − lse)·out_s, lse = log Σ_s exp(lse_s)."""
    if WAIT:
        # Launched early (programmatic dependent launch): wait here until the split kernel's writes are visible.
        gdc_wait()
    pid = tl.program_id(0)  # b * H + h
    s = tl.arange(0, BLOCK_S)
    dv = tl.arange(0, BLOCK_DV)
    smask = s < NUM_SPLITS
    # partials are [B, H, S, D_v] and [B, H, S] in base-2 log units.
    plse = tl.load(plse_ptr + pid * NUM_SPLITS + s, mask=smask, other=float("-inf"))
    peak = tl.max(plse, axis=0)
    # All splits empty: shift by 0 so exp2 gives exact zeros instead of NaN.
    peak = tl.where(peak == float("-inf"), 0.0, peak)
    w = tl.exp2(plse - peak)
    total = tl.sum(w, axis=0)
    part = tl.load(
        part_ptr + (pid * NUM_SPLITS + s[:, None]) * D_V + dv[None, :],
        mask=smask[:, None] & (dv[None, :] < D_V),
        other=0.0,
    )
    acc = tl.sum(part * w[:, None], axis=0)
    acc = acc / tl.where(total > 0.0, total, 1.0)
    tl.store(out_ptr + pid * D_V + dv, downcast(acc, out_ptr.dtype.element_ty, OUT_RTNE), mask=dv < D_V)
    lse2 = tl.where(total > 0.0, tl.log2(tl.where(total > 0.0, total, 1.0)) + peak, float("-inf"))
    tl.store(lse_ptr + pid, lse2 * 0.6931471805599453)


def merge(
    partials: torch.Tensor, partial_lse: torch.Tensor, out: torch.Tensor, lse: torch.Tensor, *, pdl: bool = False
) -> None:
    """Merge ``partials`` [B, H, S, D_v] fp32 and ``partial_lse`` [B, H, S] (log2) into ``out`` and ``lse`` (ln).

    ``pdl`` launches the merge as a programmatic dependent launch (Hopper): it is scheduled while the split kernel
    drains instead of after it, and waits on the device for the partials. Off under the interpreter and while
    torch.compile traces (Inductor's launcher does not take the option).
    """
    b, h, s, d_v = partials.shape
    pdl = pdl and use_pdl(partials)
    extra = {"launch_pdl": True} if pdl else {}
    _merge_kernel[(b * h,)](
        partials,
        partial_lse,
        out,
        lse,
        h,
        s,
        D_V=d_v,
        BLOCK_S=triton.next_power_of_2(s),
        BLOCK_DV=triton.next_power_of_2(d_v),
        OUT_RTNE=emulate_rtne(out.dtype),
        WAIT=pdl,
        num_warps=4,
        **extra,
    )


def use_pdl(t: torch.Tensor) -> bool:
    """Return whether a programmatic dependent launch is possible for kernels on ``t``'s device (sm_90 or newer)."""
    if interpreting() or t.device.type != "cuda" or torch.compiler.is_compiling():
        return False
    return torch.cuda.get_device_capability(t.device)[0] >= 9


@triton.jit
def trigger_dependents(TRIGGER: tl.constexpr):
    """With TRIGGER, let a programmatically dependent kernel (the merge) launch now; a no-op otherwise."""
    if TRIGGER:
        gdc_launch_dependents()


@triton.jit
def empty_kernel():
    """Does nothing: the benchmark times two launches of it as the launch floor."""
    pass
