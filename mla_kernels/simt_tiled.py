"""The tiled SIMT sparse-MLA decode kernel: the fair CUDA-core baseline, written as a serving stack would ship it.

Like the MMA kernel's layout, without ``tl.dot``: grid (B, ceil(H/BLOCK_H), S), each program gathers BLOCK_N KV rows
of its slice of the top-k axis once for its BLOCK_H heads (contiguous, 16-byte row loads), and does both products as
fp32 multiply-adds on CUDA cores (``tl.sum`` of broadcast products), with an online softmax and split-K merged by
mla_kernels.merge. Compared with mla_kernels.simt (one program per head, every KV row re-read H times) it moves each
row once per head group and keeps the reductions inside threads:

- q·K runs in an inner loop over BLOCK_D-wide column chunks of the whole row (latent and rope alike), as a
  [BLOCK_D, BLOCK_H, BLOCK_N] product summed over its first axis: Triton's default layout puts threads on (head,
  row) and the chunk's columns in each thread, so the sum is a chain of FMAs with no shuffles. The loop is a real
  loop, not unrolled: unrolled, Triton hoists all of q's chunks out of the tile loop and spills them.
- p·V is one [BLOCK_N, BLOCK_H, D_v] product summed over the rows, with threads on the latent's columns.
- q enters as fp32 (the wrapper converts a bf16 q once, B·H·D_qk values), so only the KV side is converted per use.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from mla_kernels.device import require_triton_device
from mla_kernels.merge import LOG2E, downcast, emulate_rtne, merge, outputs, plan_head_groups


@dataclass(frozen=True)
class TiledConfig:
    """Tile sizes and launch settings of the tiled SIMT kernel."""

    block_h: int
    block_n: int
    # Columns of the q·K chunk (the inner loop's step over the D_qk-wide row).
    block_d: int
    num_warps: int
    num_stages: int = 2
    # Software-pipelining depth of the chunk loop (tl.range num_stages): at 2 or more the next chunk's gather is an
    # async copy issued before this chunk's FMAs; 1 leaves each chunk's load to wait for its data.
    chunk_stages: int = 1
    # Programs per SM the split plan aims for; one whole wave of them when ``whole_wave``.
    programs_per_sm: int = 1
    whole_wave: bool = True


# Chosen offline (sm_90 compile with Triton 3.6, mla_kernels/NOTES.md "Tiled SIMT"): 208 registers, no spills, 34%
# of a tile's issued instructions are FFMA; 8 warps, one program per SM, chunk gathers double-buffered.
DEFAULT_CONFIG = TiledConfig(block_h=16, block_n=16, block_d=32, num_warps=8, chunk_stages=2)
# The alternatives the benchmark times against it: half the heads per program (128 registers, two programs per
# SM, each KV row read twice at H = 16), and the default without the chunk pipelining.
HALF_HEADS_CONFIG = TiledConfig(block_h=8, block_n=32, block_d=32, num_warps=8, programs_per_sm=2, chunk_stages=2)
UNPIPELINED_CONFIG = TiledConfig(block_h=16, block_n=16, block_d=32, num_warps=8, chunk_stages=1)


@triton.jit
def _tiled_decode_kernel(
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
    D_QK: tl.constexpr,
    D_V: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_DV: tl.constexpr,
    NUM_CHUNKS: tl.constexpr,
    CHUNK_STAGES: tl.constexpr,
    DIRECT: tl.constexpr,
    OUT_RTNE: tl.constexpr,
):
    """One (row, head group, split): online softmax over the split's tiles, every product an fp32 FMA."""
    pid_b = tl.program_id(0)
    pid_g = tl.program_id(1)
    pid_s = tl.program_id(2)
    heads = pid_g * BLOCK_H + tl.arange(0, BLOCK_H)
    hmask = heads < H
    dv = tl.arange(0, BLOCK_DV)
    q_heads = q_ptr + pid_b * stride_qb + heads * stride_qh

    # torch.compile passes the scale as fp64; keep the softmax state fp32.
    scale = tl.cast(scale_log2, tl.float32)
    m_i = tl.full([BLOCK_H], -1.0e30, tl.float32)
    l_i = tl.zeros([BLOCK_H], tl.float32)
    acc = tl.zeros([BLOCK_H, BLOCK_DV], tl.float32)
    first = pid_s * TILES_PER_SPLIT * BLOCK_N
    for t in range(0, TILES_PER_SPLIT):
        pos = first + t * BLOCK_N + tl.arange(0, BLOCK_N)
        idx = tl.load(idx_ptr + pid_b * stride_ib + pos, mask=pos < K, other=-1)
        valid = (idx >= 0) & (idx < N)
        # Unused slots point at row 0 and are masked off (no bytes moved) and out of the softmax.
        rows = tl.where(valid, idx, 0).to(tl.int64)
        s = tl.zeros([BLOCK_H, BLOCK_N], tl.float32)
        for c in tl.range(0, NUM_CHUNKS, num_stages=CHUNK_STAGES):
            d = c * BLOCK_D + tl.arange(0, BLOCK_D)
            dmask = d < D_QK
            # Transposed tiles [BLOCK_D, rows] and [BLOCK_D, heads]: the reduced axis first (see the module doc).
            k_c = tl.load(kv_ptr + rows[None, :] * stride_kv + d[:, None], mask=dmask[:, None] & valid[None, :],
                          other=0.0).to(tl.float32)  # fmt: skip
            q_c = tl.load(q_heads[None, :] + d[:, None], mask=dmask[:, None] & hmask[None, :], other=0.0)
            s += tl.sum(q_c.to(tl.float32)[:, :, None] * k_c[:, None, :], axis=0)
        s = tl.where(valid[None, :], s * scale, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        # The same rows again as V (their latent part; the chunk loads above left them in L1).
        v = tl.load(kv_ptr + rows[:, None] * stride_kv + dv[None, :], mask=valid[:, None] & (dv[None, :] < D_V),
                    other=0.0).to(tl.float32)  # fmt: skip
        acc = acc * alpha[:, None] + tl.sum(tl.trans(p)[:, :, None] * v[:, None, :], axis=0)
        m_i = m_new

    acc = acc / tl.where(l_i > 0.0, l_i, 1.0)[:, None]
    lse2 = tl.where(l_i > 0.0, m_i + tl.log2(tl.where(l_i > 0.0, l_i, 1.0)), float("-inf"))
    omask = hmask[:, None] & (dv[None, :] < D_V)
    if DIRECT:
        o_ptrs = out_ptr + (pid_b * H + heads[:, None]) * D_V + dv[None, :]
        tl.store(o_ptrs, downcast(acc, out_ptr.dtype.element_ty, OUT_RTNE), mask=omask)
        tl.store(lse_ptr + pid_b * H + heads, lse2 * 0.6931471805599453, mask=hmask)
    else:
        slot = (pid_b * H + heads) * NUM_SPLITS + pid_s
        tl.store(part_ptr + slot[:, None] * D_V + dv[None, :], acc, mask=omask)
        tl.store(plse_ptr + slot, lse2, mask=hmask)


# The split plan the kernel launches with for q's shape, K indices and a config (num_splits overrides).
plan = plan_head_groups


def decode(
    q: torch.Tensor,
    kv: torch.Tensor,
    indices: torch.Tensor,
    sm_scale: float,
    d_v: int,
    *,
    config: TiledConfig | None = None,
    num_splits: int | None = None,
    out: torch.Tensor | None = None,
    lse: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Run the tiled SIMT kernel (and the merge when the top-k axis is split); return (out, lse) as the contract says.

    ``config`` and ``num_splits`` override the defaults; ``out`` and ``lse`` are optional caller-owned buffers.
    """
    require_triton_device(q)
    b, h, d_qk = q.shape
    n, k = kv.shape[0], indices.shape[1]
    cfg = config or DEFAULT_CONFIG
    # One fp32 copy of q (B·H·D_qk values): the kernel re-reads q every tile, and converting it there costs an
    # instruction per multiply-add.
    q32 = q.to(torch.float32).contiguous()
    kv = kv if kv.stride(1) == 1 else kv.contiguous()
    indices = indices if indices.stride(1) == 1 else indices.contiguous()
    splits = plan(q, k, cfg, num_splits)
    out, lse, part, plse = outputs(q, d_v, splits, out, lse)
    _tiled_decode_kernel[(b, triton.cdiv(h, cfg.block_h), splits.num_splits)](
        q32,
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
        q32.stride(0),
        q32.stride(1),
        kv.stride(0),
        indices.stride(0),
        TILES_PER_SPLIT=splits.tiles_per_split,
        NUM_SPLITS=splits.num_splits,
        D_QK=d_qk,
        D_V=d_v,
        BLOCK_H=cfg.block_h,
        BLOCK_N=cfg.block_n,
        BLOCK_D=cfg.block_d,
        BLOCK_DV=triton.next_power_of_2(d_v),
        NUM_CHUNKS=triton.cdiv(d_qk, cfg.block_d),
        CHUNK_STAGES=cfg.chunk_stages,
        DIRECT=splits.num_splits == 1,
        OUT_RTNE=emulate_rtne(out.dtype),
        num_warps=cfg.num_warps,
        num_stages=cfg.num_stages,
    )
    if splits.num_splits > 1:
        merge(part, plse, out, lse)
    return out, lse


@triton.jit
def _fma_probe_kernel(out_ptr, a, b, ITERS, BLOCK: tl.constexpr):
    """Four independent chains x = x·a + b per element, ITERS times: CUDA-core FMA throughput, nothing else."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x0 = offs.to(tl.float32) * 1.0e-7
    x1 = x0 + 1.0
    x2 = x0 + 2.0
    x3 = x0 + 3.0
    for _ in range(0, ITERS):
        x0 = x0 * a + b
        x1 = x1 * a + b
        x2 = x2 * a + b
        x3 = x3 * a + b
    tl.store(out_ptr + offs, x0 + x1 + x2 + x3)


def fma_probe(out: torch.Tensor, iters: int, block: int = 1024) -> float:
    """Launch the FMA probe over ``out`` (fp32, a multiple of ``block`` long); return the FLOPs it does."""
    require_triton_device(out)
    # a < 1 and b small keep the values finite whatever ITERS is.
    _fma_probe_kernel[(out.numel() // block,)](out, 0.999, 1.0e-3, iters, BLOCK=block, num_warps=4)
    return 2.0 * 4 * out.numel() * iters
