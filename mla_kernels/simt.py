"""The SIMT sparse-MLA decode kernel: Triton without ``tl.dot``, so every multiply-add runs on CUDA cores.

Laid out like the stock SIMT decode kernels (one program per batch row, query head and split): q·k is a broadcast
multiply and a row sum, p·V a broadcast multiply and a column sum. Because each program serves one head, every
gathered KV row is read once per head (mostly from L2), which is the cost the MMA kernel's head grouping removes.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from mla_kernels.device import require_triton_device
from mla_kernels.merge import LOG2E, downcast, emulate_rtne, merge, outputs, plan_splits


@dataclass(frozen=True)
class SimtConfig:
    """Tile size and launch settings of the SIMT kernel."""

    block_n: int
    num_warps: int
    num_stages: int


DEFAULT_CONFIG = SimtConfig(block_n=16, num_warps=4, num_stages=2)


@triton.jit
def _gather(base, rows, cols, stride, N_COLS: tl.constexpr, BLOCK_COLS: tl.constexpr):
    """Load the tile base[rows, cols] as fp32 (columns past N_COLS read as 0)."""
    ptrs = base + rows[:, None] * stride + cols[None, :]
    if N_COLS == BLOCK_COLS:
        return tl.load(ptrs).to(tl.float32)
    else:
        return tl.load(ptrs, mask=cols[None, :] < N_COLS, other=0.0).to(tl.float32)


@triton.jit
def _simt_decode_kernel(
    q_ptr,
    kv_ptr,
    idx_ptr,
    out_ptr,
    lse_ptr,
    part_ptr,
    plse_ptr,
    scale_log2,
    H,
    N,
    K,
    stride_qb,
    stride_qh,
    stride_kv,
    stride_ib,
    TILES_PER_SPLIT: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
    D_V: tl.constexpr,
    D_R: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_DV: tl.constexpr,
    BLOCK_DR: tl.constexpr,
    DIRECT: tl.constexpr,
    OUT_RTNE: tl.constexpr,
):
    """One (row, head, split): online softmax over the split's tiles, all arithmetic as fp32 FMAs."""
    pid_b = tl.program_id(0)
    pid_h = tl.program_id(1)
    pid_s = tl.program_id(2)
    dv = tl.arange(0, BLOCK_DV)
    dr = tl.arange(0, BLOCK_DR)
    q_row = q_ptr + pid_b * stride_qb + pid_h * stride_qh
    q_nope = tl.load(q_row + dv, mask=dv < D_V, other=0.0).to(tl.float32)
    q_pe = tl.load(q_row + D_V + dr, mask=dr < D_R, other=0.0).to(tl.float32)

    # torch.compile passes the scale as fp64; keep the softmax state fp32.
    scale = tl.cast(scale_log2, tl.float32)
    m_i = -1.0e30
    l_i = 0.0
    acc = tl.zeros([BLOCK_DV], tl.float32)
    first = pid_s * TILES_PER_SPLIT * BLOCK_N
    for t in range(0, TILES_PER_SPLIT):
        pos = first + t * BLOCK_N + tl.arange(0, BLOCK_N)
        idx = tl.load(idx_ptr + pid_b * stride_ib + pos, mask=pos < K, other=-1)
        valid = (idx >= 0) & (idx < N)
        rows = tl.where(valid, idx, 0).to(tl.int64)
        k_nope = _gather(kv_ptr, rows, dv, stride_kv, D_V, BLOCK_DV)
        k_pe = _gather(kv_ptr + D_V, rows, dr, stride_kv, D_R, BLOCK_DR)
        s = tl.sum(k_nope * q_nope[None, :], axis=1) + tl.sum(k_pe * q_pe[None, :], axis=1)
        s = tl.where(valid, s * scale, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=0))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new)
        l_i = l_i * alpha + tl.sum(p, axis=0)
        acc = acc * alpha + tl.sum(p[:, None] * k_nope, axis=0)
        m_i = m_new

    acc = acc / tl.where(l_i > 0.0, l_i, 1.0)
    lse2 = tl.where(l_i > 0.0, m_i + tl.log2(tl.where(l_i > 0.0, l_i, 1.0)), float("-inf"))
    if DIRECT:
        tl.store(
            out_ptr + (pid_b * H + pid_h) * D_V + dv, downcast(acc, out_ptr.dtype.element_ty, OUT_RTNE), mask=dv < D_V
        )
        tl.store(lse_ptr + pid_b * H + pid_h, lse2 * 0.6931471805599453)
    else:
        slot = (pid_b * H + pid_h) * NUM_SPLITS + pid_s
        tl.store(part_ptr + slot * D_V + dv, acc, mask=dv < D_V)
        tl.store(plse_ptr + slot, lse2)


def decode(
    q: torch.Tensor,
    kv: torch.Tensor,
    indices: torch.Tensor,
    sm_scale: float,
    d_v: int,
    *,
    config: SimtConfig | None = None,
    num_splits: int | None = None,
    out: torch.Tensor | None = None,
    lse: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Run the SIMT kernel (and the merge when the top-k axis is split); return (out, lse) as the contract says.

    ``config`` and ``num_splits`` override the defaults (the benchmark sweeps them); ``out`` and ``lse`` are
    optional caller-owned buffers (static outputs for CUDA graphs; poisoned buffers in tests).
    """
    require_triton_device(q)
    b, h, d_qk = q.shape
    n, k = kv.shape[0], indices.shape[1]
    d_r = d_qk - d_v
    cfg = config or DEFAULT_CONFIG
    q = q if q.stride(2) == 1 else q.contiguous()
    kv = kv if kv.stride(1) == 1 else kv.contiguous()
    indices = indices if indices.stride(1) == 1 else indices.contiguous()
    plan = plan_splits(q, k, cfg.block_n, b * h, num_splits)
    out, lse, part, plse = outputs(q, d_v, plan, out, lse)
    direct = plan.num_splits == 1
    _simt_decode_kernel[(b, h, plan.num_splits)](
        q,
        kv,
        indices,
        out,
        lse,
        part,
        plse,
        sm_scale * LOG2E,
        h,
        n,
        k,
        q.stride(0),
        q.stride(1),
        kv.stride(0),
        indices.stride(0),
        TILES_PER_SPLIT=plan.tiles_per_split,
        NUM_SPLITS=plan.num_splits,
        D_V=d_v,
        D_R=d_r,
        BLOCK_N=cfg.block_n,
        BLOCK_DV=triton.next_power_of_2(d_v),
        BLOCK_DR=max(2, triton.next_power_of_2(max(d_r, 1))),
        DIRECT=direct,
        OUT_RTNE=emulate_rtne(out.dtype),
        num_warps=cfg.num_warps,
        num_stages=cfg.num_stages,
    )
    if not direct:
        merge(part, plse, out, lse)
    return out, lse
