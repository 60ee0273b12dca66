"""The MMA (tensor-core) sparse-MLA decode kernel: Triton ``tl.dot``, BLOCK_H query heads per program.

Each program owns one batch row, one group of BLOCK_H heads and one slice of the top-k axis. It gathers BLOCK_N KV
rows by index, once for all heads of the group, and computes scores = q_nope·K_nopeᵀ + q_pe·K_peᵀ and
acc += p·V with V the same latent tile (MLA's absorbed form: V is the first D_v values of each row). Softmax is
online, in base 2, with a finite starting max so a fully masked tile gives zeros rather than NaN. tl.dot needs
M >= 16, so fewer heads than BLOCK_H are padded by masking.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import torch
import triton
import triton.language as tl

from kernels.device import interpreting, require_triton_device
from kernels.merge import LOG2E, SplitPlan, downcast, emulate_rtne, merge, outputs, plan_splits


@dataclass(frozen=True)
class MmaConfig:
    """Tile sizes and launch settings of the MMA kernel."""

    block_h: int
    block_n: int
    num_warps: int
    num_stages: int
    # Feed p to the p·V product as bf16 hi + lo parts: p's rounding error drops from 2^-9 to 2^-17 for one more
    # MMA per tile. Off, a peaked softmax (few tokens, or sm_scale 0.1352) can miss FlashMLA's 1e-3 / 2.01/128 rule.
    split_p: bool = True


def default_config(h: int, d_v: int) -> MmaConfig:
    """Return the tuned configuration for H heads and latent width D_v."""
    if h >= 64 and d_v >= 256:
        # 32 heads per program, mma.sync, with p split hi + lo. The wgmma form (BLOCK_H=64, 8 warps) measured
        # 1.6x faster on the H200 with bf16 p, but then misses FlashMLA's rule on ~1e-4 of the elements at the model's
        # softmax scale 0.1352, and with split p it spills (1558 registers) and runs 14x slower. See docs/kernels.md.
        return MmaConfig(block_h=32, block_n=32, num_warps=8, num_stages=3, split_p=True)
    return MmaConfig(block_h=16, block_n=32, num_warps=4, num_stages=3)


@triton.jit
def _gather(base, rows, cols, stride, N_COLS: tl.constexpr, BLOCK_COLS: tl.constexpr):
    """Load the tile base[rows, cols] (columns past N_COLS read as 0)."""
    ptrs = base + rows[:, None] * stride + cols[None, :]
    if N_COLS == BLOCK_COLS:
        return tl.load(ptrs)
    else:
        return tl.load(ptrs, mask=cols[None, :] < N_COLS, other=0.0)


@triton.jit
def _dot(a, b, PRECISION: tl.constexpr, UPCAST: tl.constexpr):
    """tl.dot of a and b with fp32 accumulation; UPCAST feeds fp32 operands (exact for bf16 values)."""
    if UPCAST:
        # Triton 3.6's interpreter multiplies bf16 tiles as their raw uint16 bits; fp32 holds bf16 exactly.
        return tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
    else:
        return tl.dot(a, b, input_precision=PRECISION)


@triton.jit
def _mma_decode_kernel(
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
    BLOCK_H: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_DV: tl.constexpr,
    BLOCK_DR: tl.constexpr,
    DIRECT: tl.constexpr,
    PRECISION: tl.constexpr,
    UPCAST: tl.constexpr,
    P_RTNE: tl.constexpr,
    OUT_RTNE: tl.constexpr,
    SPLIT_P: tl.constexpr,
):
    """One (row, head group, split): online softmax over the split's tiles of gathered KV rows."""
    pid_b = tl.program_id(0)
    pid_g = tl.program_id(1)
    pid_s = tl.program_id(2)
    heads = pid_g * BLOCK_H + tl.arange(0, BLOCK_H)
    hmask = heads < H
    dv = tl.arange(0, BLOCK_DV)
    dr = tl.arange(0, BLOCK_DR)
    kv_ty = kv_ptr.dtype.element_ty

    q_row = q_ptr + pid_b * stride_qb + heads[:, None] * stride_qh
    q_nope = tl.load(q_row + dv[None, :], mask=hmask[:, None] & (dv[None, :] < D_V), other=0.0).to(kv_ty)
    q_pe = tl.load(q_row + D_V + dr[None, :], mask=hmask[:, None] & (dr[None, :] < D_R), other=0.0).to(kv_ty)

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
        # Unused slots read row 0 (always in bounds) and are masked out of the softmax below.
        rows = tl.where(valid, idx, 0).to(tl.int64)
        k_nope = _gather(kv_ptr, rows, dv, stride_kv, D_V, BLOCK_DV)
        k_pe = _gather(kv_ptr + D_V, rows, dr, stride_kv, D_R, BLOCK_DR)
        s = _dot(q_nope, tl.trans(k_nope), PRECISION, UPCAST) + _dot(q_pe, tl.trans(k_pe), PRECISION, UPCAST)
        s = tl.where(valid[None, :], s * scale, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        p_hi = downcast(p, kv_ty, P_RTNE)
        acc = acc * alpha[:, None] + _dot(p_hi, k_nope, PRECISION, UPCAST)
        if SPLIT_P:
            p_lo = downcast(p - p_hi.to(tl.float32), kv_ty, P_RTNE)
            acc += _dot(p_lo, k_nope, PRECISION, UPCAST)
        m_i = m_new

    acc = acc / tl.where(l_i > 0.0, l_i, 1.0)[:, None]
    lse2 = tl.where(l_i > 0.0, m_i + tl.log2(tl.where(l_i > 0.0, l_i, 1.0)), float("-inf"))
    omask = hmask[:, None] & (dv[None, :] < D_V)
    if DIRECT:
        tl.store(
            out_ptr + (pid_b * H + heads[:, None]) * D_V + dv[None, :],
            downcast(acc, out_ptr.dtype.element_ty, OUT_RTNE),
            omask,
        )
        tl.store(lse_ptr + pid_b * H + heads, lse2 * 0.6931471805599453, hmask)
    else:
        slot = (pid_b * H + heads) * NUM_SPLITS + pid_s
        tl.store(part_ptr + slot[:, None] * D_V + dv[None, :], acc, omask)
        tl.store(plse_ptr + slot, lse2, hmask)


def decode(
    q: torch.Tensor,
    kv: torch.Tensor,
    indices: torch.Tensor,
    sm_scale: float,
    d_v: int,
    *,
    config: MmaConfig | None = None,
    num_splits: int | None = None,
    out: torch.Tensor | None = None,
    lse: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Run the MMA kernel (and the merge when the top-k axis is split); return (out, lse) as the contract says.

    ``config`` and ``num_splits`` override the defaults (the benchmark sweeps them); ``out`` and ``lse`` are
    optional caller-owned buffers (static outputs for CUDA graphs; poisoned buffers in tests).
    """
    require_triton_device(q)
    b, h, _ = q.shape
    cfg = config or default_config(h, d_v)
    q = q if q.stride(2) == 1 else q.contiguous()
    kv = kv if kv.stride(1) == 1 else kv.contiguous()
    indices = indices if indices.stride(1) == 1 else indices.contiguous()
    plan = plan_splits(q, indices.shape[1], cfg.block_n, b * triton.cdiv(h, cfg.block_h), num_splits)
    out, lse, part, plse = outputs(q, d_v, plan, out, lse)
    _launch(q, kv, indices, sm_scale, d_v, cfg, plan, out, lse, part, plse)
    if plan.num_splits > 1:
        merge(part, plse, out, lse)
    return out, lse


def _launch(
    q: torch.Tensor,
    kv: torch.Tensor,
    indices: torch.Tensor,
    sm_scale: float,
    d_v: int,
    cfg: MmaConfig,
    plan: SplitPlan,
    out: torch.Tensor,
    lse: torch.Tensor,
    part: torch.Tensor,
    plse: torch.Tensor,
) -> Any:
    """Launch the split kernel; return Triton's compiled-kernel handle (None under the interpreter)."""
    b, h, d_qk = q.shape
    n, k = kv.shape[0], indices.shape[1]
    d_r = d_qk - d_v
    direct = plan.num_splits == 1
    return _mma_decode_kernel[(b, triton.cdiv(h, cfg.block_h), plan.num_splits)](
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
        BLOCK_H=cfg.block_h,
        BLOCK_N=cfg.block_n,
        BLOCK_DV=triton.next_power_of_2(d_v),
        BLOCK_DR=max(16, triton.next_power_of_2(max(d_r, 1))),
        DIRECT=direct,
        PRECISION="ieee" if kv.dtype == torch.float32 else "tf32",
        UPCAST=interpreting(),
        P_RTNE=emulate_rtne(kv.dtype),
        OUT_RTNE=emulate_rtne(out.dtype),
        SPLIT_P=cfg.split_p and kv.dtype != torch.float32,
        num_warps=cfg.num_warps,
        num_stages=cfg.num_stages,
    )


def matrix_instructions(
    q: torch.Tensor,
    kv: torch.Tensor,
    indices: torch.Tensor,
    sm_scale: float,
    d_v: int,
    *,
    config: MmaConfig | None = None,
    num_splits: int | None = None,
) -> dict[str, Any]:
    """Compile and run the MMA kernel for these inputs; count the matrix instructions in its TTGIR and PTX.

    Returns counts of ``wgmma`` (Hopper warpgroup MMA) and ``mma.sync`` in the PTX, the TTGIR's MMA encoding
    (``versionMajor`` 3 is wgmma, 2 is mma.sync), and the registers/spills the compiler reported.
    """
    b, h, _ = q.shape
    cfg = config or default_config(h, d_v)
    plan = plan_splits(q, indices.shape[1], cfg.block_n, b * triton.cdiv(h, cfg.block_h), num_splits)
    out, lse, part, plse = outputs(q, d_v, plan, None, None)
    compiled = _launch(q, kv, indices, sm_scale, d_v, cfg, plan, out, lse, part, plse)
    ptx = compiled.asm.get("ptx", "")
    ttgir = compiled.asm.get("ttgir", "")
    versions = sorted(set(re.findall(r"versionMajor = (\d+)", ttgir)))
    first = re.search(r"^\s*((?:wgmma\.mma_async|mma\.sync)\S*)", ptx, re.MULTILINE)
    return {
        "wgmma": len(re.findall(r"\bwgmma\.mma_async", ptx)),
        "mma.sync": len(re.findall(r"\bmma\.sync", ptx)),
        "ttgir_mma_versions": ",".join(versions),
        "registers": int(getattr(compiled, "n_regs", -1)),
        "spills": int(getattr(compiled, "n_spills", -1)),
        "shared_bytes": int(getattr(getattr(compiled, "metadata", None), "shared", -1)),
        "first_instruction": first.group(1) if first else "",
    }
