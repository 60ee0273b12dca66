"""The MMA (tensor-core) sparse-MLA decode kernel: Triton ``tl.dot``, BLOCK_H query heads per program.

Each program owns one batch row, one group of BLOCK_H heads and one slice of the top-k axis. It gathers BLOCK_N KV
rows by index, once for all heads of the group, and computes scores = q_nope·K_nopeᵀ + q_pe·K_peᵀ and
acc += p·V with V the same latent tile (MLA's absorbed form: V is the first D_v values of each row). Softmax is
online, in base 2, with a finite starting max so a fully masked tile gives zeros rather than NaN. tl.dot needs
M >= 16, so fewer heads than BLOCK_H are padded by masking.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Any

import torch
import triton
import triton.language as tl

from mla_kernels.device import interpreting, require_triton_device
from mla_kernels.merge import (
    LOG2E,
    SplitPlan,
    downcast,
    emulate_rtne,
    merge,
    outputs,
    plan_head_groups,
    trigger_dependents,
    use_pdl,
)


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
    # Process the latent in two halves (two gathers, two accumulators): the operand tiles held in registers halve.
    halves: bool = False
    # Swap the products' operands (sᵀ = K·qᵀ, accᵀ = Vᵀ·pᵀ): the KV tile becomes the M side, so BLOCK_N = 64 meets
    # wgmma's M % 64 rule even with 16 heads, and both MMAs read the tile from shared memory.
    swap: bool = False
    # Mask the gathers of unused slots (-1) so they move no bytes (off: they read row 0, as before).
    mask_rows: bool = True
    # Programs per SM that the split plan aims for (it splits the top-k axis until B·groups·S reaches this), and
    # whether it rounds the split count down so that every program is resident in one wave.
    programs_per_sm: int = 2
    whole_wave: bool = False
    # Launch the merge as a programmatic dependent launch, so that its launch overlaps the split kernel's tail.
    pdl: bool = False
    # With halves: two programs per head group, each accumulating one half of the latent (p·V_half) after the full
    # q·K, so that a 64-head fp32 accumulator is 64 x 256 (FlashMLA splits V between warpgroups the same way). The
    # tile is gathered by both programs and q·K done twice (1.53x the FLOPs); the point is wgmma with the heads as M
    # and split p without spills (issue 15: BLOCK_H 64, BLOCK_N 16, 4 warps: 241 registers, 0 spilled, offline).
    v_split: bool = False


def default_config(h: int, d_v: int) -> MmaConfig:
    """Return the tuned configuration for H heads and latent width D_v (H200 sweep of 2026-12-02, docs/kernels.md)."""
    if h >= 64 and d_v >= 256:
        # V split: 64 heads as wgmma's M, the latent in halves, each half of p·V in its own program (241 registers,
        # 0 spilled, 102 KB shared: two programs per SM). H200, 2026-12-03: 156.0 µs at B=32 against 184.6 for the
        # previous default (swapped operands, BLOCK_H 32, 8 warps) in the same call; 605 against 736 µs at B=128.
        return MmaConfig(64, 16, 4, 3, halves=True, v_split=True, programs_per_sm=2, whole_wave=True)
    # mma.sync (16 heads cannot fill wgmma's M=64). num_stages 5 is the first depth at which Triton's pipeliner
    # keeps two KV tiles in flight; the latent in two halves measured 10-14% faster; two programs per SM (236
    # registers, 92 KB shared) in one whole wave.
    return MmaConfig(block_h=16, block_n=32, num_warps=4, num_stages=5, halves=True, whole_wave=True)


@triton.jit
def _gather(base, rows, rmask, cols, stride, N_COLS: tl.constexpr, BLOCK_COLS: tl.constexpr, MASK_ROWS: tl.constexpr):
    """Load the tile base[rows, cols]; columns past N_COLS, and with MASK_ROWS the rows off in rmask, read as 0.

    A masked-off row issues no memory request, so unused slots cost no bandwidth. The masks are constant along a
    row, which keeps the loads 16 bytes wide.
    """
    ptrs = base + rows[:, None] * stride + cols[None, :]
    if MASK_ROWS:
        if N_COLS == BLOCK_COLS:
            return tl.load(ptrs, mask=rmask[:, None], other=0.0)
        else:
            return tl.load(ptrs, mask=rmask[:, None] & (cols[None, :] < N_COLS), other=0.0)
    else:
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
    BLOCK_DA: tl.constexpr,
    BLOCK_DR: tl.constexpr,
    HALVES: tl.constexpr,
    MASK_ROWS: tl.constexpr,
    DIRECT: tl.constexpr,
    PRECISION: tl.constexpr,
    UPCAST: tl.constexpr,
    P_RTNE: tl.constexpr,
    OUT_RTNE: tl.constexpr,
    SPLIT_P: tl.constexpr,
    TRIGGER: tl.constexpr,
    V_SPLIT: tl.constexpr = False,
):
    """One (row, head group, split): online softmax over the split's tiles of gathered KV rows.

    The latent is one BLOCK_DA-wide part, or with HALVES two (columns [0, BLOCK_DA) and [BLOCK_DA, 2·BLOCK_DA)).
    With V_SPLIT (needs HALVES) grid axis 1 is 2·groups and each program accumulates only its half of p·V.
    """
    pid_b = tl.program_id(0)
    if V_SPLIT:
        pid_g = tl.program_id(1) // 2
        half = tl.program_id(1) % 2
    else:
        pid_g = tl.program_id(1)
        half = 0
    pid_s = tl.program_id(2)
    trigger_dependents(TRIGGER)
    heads = pid_g * BLOCK_H + tl.arange(0, BLOCK_H)
    hmask = heads < H
    da = tl.arange(0, BLOCK_DA)
    dr = tl.arange(0, BLOCK_DR)
    kv_ty = kv_ptr.dtype.element_ty

    q_row = q_ptr + pid_b * stride_qb + heads[:, None] * stride_qh
    q_a = tl.load(q_row + da[None, :], mask=hmask[:, None] & (da[None, :] < D_V), other=0.0).to(kv_ty)
    q_pe = tl.load(q_row + D_V + dr[None, :], mask=hmask[:, None] & (dr[None, :] < D_R), other=0.0).to(kv_ty)
    if HALVES:
        db = BLOCK_DA + tl.arange(0, BLOCK_DA)
        q_b = tl.load(q_row + db[None, :], mask=hmask[:, None] & (db[None, :] < D_V), other=0.0).to(kv_ty)
        acc_b = tl.zeros([BLOCK_H, BLOCK_DA], tl.float32)

    # torch.compile passes the scale as fp64; keep the softmax state fp32.
    scale = tl.cast(scale_log2, tl.float32)
    m_i = tl.full([BLOCK_H], -1.0e30, tl.float32)
    l_i = tl.zeros([BLOCK_H], tl.float32)
    acc = tl.zeros([BLOCK_H, BLOCK_DA], tl.float32)
    first = pid_s * TILES_PER_SPLIT * BLOCK_N
    for t in range(0, TILES_PER_SPLIT):
        pos = first + t * BLOCK_N + tl.arange(0, BLOCK_N)
        idx = tl.load(idx_ptr + pid_b * stride_ib + pos, mask=pos < K, other=-1)
        valid = (idx >= 0) & (idx < N)
        # Unused slots point at row 0 (always in bounds) and are masked out of the softmax below.
        rows = tl.where(valid, idx, 0).to(tl.int64)
        k_a = _gather(kv_ptr, rows, valid, da, stride_kv, D_V, BLOCK_DA, MASK_ROWS)
        k_pe = _gather(kv_ptr + D_V, rows, valid, dr, stride_kv, D_R, BLOCK_DR, MASK_ROWS)
        s = _dot(q_a, tl.trans(k_a), PRECISION, UPCAST) + _dot(q_pe, tl.trans(k_pe), PRECISION, UPCAST)
        if HALVES:
            k_b = _gather(kv_ptr + BLOCK_DA, rows, valid, da, stride_kv, D_V - BLOCK_DA, BLOCK_DA, MASK_ROWS)
            s += _dot(q_b, tl.trans(k_b), PRECISION, UPCAST)
        s = tl.where(valid[None, :], s * scale, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        p_hi = downcast(p, kv_ty, P_RTNE)
        if V_SPLIT:
            # This program's half of V; acc_b stays zero and is not stored.
            k_a = tl.where(half == 0, k_a, k_b)
        acc = acc * alpha[:, None] + _dot(p_hi, k_a, PRECISION, UPCAST)
        if HALVES and not V_SPLIT:
            acc_b = acc_b * alpha[:, None] + _dot(p_hi, k_b, PRECISION, UPCAST)
        if SPLIT_P:
            p_lo = downcast(p - p_hi.to(tl.float32), kv_ty, P_RTNE)
            acc += _dot(p_lo, k_a, PRECISION, UPCAST)
            if HALVES and not V_SPLIT:
                acc_b += _dot(p_lo, k_b, PRECISION, UPCAST)
        m_i = m_new

    inv = 1.0 / tl.where(l_i > 0.0, l_i, 1.0)
    lse2 = tl.where(l_i > 0.0, m_i + tl.log2(tl.where(l_i > 0.0, l_i, 1.0)), float("-inf"))
    # With V_SPLIT both halves write the same lse (same q·K, same bits).
    _store(acc * inv[:, None], da + half * BLOCK_DA, heads, hmask, lse2, out_ptr, lse_ptr, part_ptr, plse_ptr, pid_b,
           pid_s, H, D_V, NUM_SPLITS, DIRECT, OUT_RTNE, STORE_LSE=True)  # fmt: skip
    if HALVES and not V_SPLIT:
        _store(acc_b * inv[:, None], db, heads, hmask, lse2, out_ptr, lse_ptr, part_ptr, plse_ptr, pid_b, pid_s, H,
               D_V, NUM_SPLITS, DIRECT, OUT_RTNE, STORE_LSE=False)  # fmt: skip


@triton.jit
def _store(
    o, cols, heads, hmask, lse2, out_ptr, lse_ptr, part_ptr, plse_ptr, pid_b, pid_s, H, D_V, NUM_SPLITS,
    DIRECT: tl.constexpr, OUT_RTNE: tl.constexpr, STORE_LSE: tl.constexpr,
):  # fmt: skip
    """Write normalized output columns ``cols`` of ``heads``: to out (DIRECT) or to this split's fp32 partial."""
    omask = hmask[:, None] & (cols[None, :] < D_V)
    if DIRECT:
        tl.store(
            out_ptr + (pid_b * H + heads[:, None]) * D_V + cols[None, :],
            downcast(o, out_ptr.dtype.element_ty, OUT_RTNE),
            omask,
        )
        if STORE_LSE:
            tl.store(lse_ptr + pid_b * H + heads, lse2 * 0.6931471805599453, hmask)
    else:
        slot = (pid_b * H + heads) * NUM_SPLITS + pid_s
        tl.store(part_ptr + slot[:, None] * D_V + cols[None, :], o, omask)
        if STORE_LSE:
            tl.store(plse_ptr + slot, lse2, hmask)


@triton.jit
def _mma_swap_kernel(
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
    BLOCK_DA: tl.constexpr,
    BLOCK_DR: tl.constexpr,
    HALVES: tl.constexpr,
    MASK_ROWS: tl.constexpr,
    DIRECT: tl.constexpr,
    PRECISION: tl.constexpr,
    UPCAST: tl.constexpr,
    P_RTNE: tl.constexpr,
    OUT_RTNE: tl.constexpr,
    SPLIT_P: tl.constexpr,
    TRIGGER: tl.constexpr,
):
    """The same computation with every product transposed: sᵀ = K·qᵀ [BLOCK_N, BLOCK_H], accᵀ += Vᵀ·pᵀ.

    The KV tile is the M side of both products (M = BLOCK_N and D_v), the heads the N side, so with BLOCK_N a
    multiple of 64 and 4 or 8 warps Triton can emit wgmma with the tile read straight from shared memory.
    """
    pid_b = tl.program_id(0)
    pid_g = tl.program_id(1)
    pid_s = tl.program_id(2)
    trigger_dependents(TRIGGER)
    heads = pid_g * BLOCK_H + tl.arange(0, BLOCK_H)
    hmask = heads < H
    da = tl.arange(0, BLOCK_DA)
    dr = tl.arange(0, BLOCK_DR)
    kv_ty = kv_ptr.dtype.element_ty

    q_col = q_ptr + pid_b * stride_qb + heads[None, :] * stride_qh
    qt = tl.load(q_col + da[:, None], mask=hmask[None, :] & (da[:, None] < D_V), other=0.0).to(kv_ty)
    qt_pe = tl.load(q_col + D_V + dr[:, None], mask=hmask[None, :] & (dr[:, None] < D_R), other=0.0).to(kv_ty)

    scale = tl.cast(scale_log2, tl.float32)
    m_i = tl.full([BLOCK_H], -1.0e30, tl.float32)
    l_i = tl.zeros([BLOCK_H], tl.float32)
    acc = tl.zeros([BLOCK_DA, BLOCK_H], tl.float32)
    first = pid_s * TILES_PER_SPLIT * BLOCK_N
    for t in range(0, TILES_PER_SPLIT):
        pos = first + t * BLOCK_N + tl.arange(0, BLOCK_N)
        idx = tl.load(idx_ptr + pid_b * stride_ib + pos, mask=pos < K, other=-1)
        valid = (idx >= 0) & (idx < N)
        rows = tl.where(valid, idx, 0).to(tl.int64)
        k_a = _gather(kv_ptr, rows, valid, da, stride_kv, D_V, BLOCK_DA, MASK_ROWS)
        k_pe = _gather(kv_ptr + D_V, rows, valid, dr, stride_kv, D_R, BLOCK_DR, MASK_ROWS)
        s = _dot(k_a, qt, PRECISION, UPCAST) + _dot(k_pe, qt_pe, PRECISION, UPCAST)
        s = tl.where(valid[:, None], s * scale, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=0))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[None, :])
        l_i = l_i * alpha + tl.sum(p, axis=0)
        p_hi = downcast(p, kv_ty, P_RTNE)
        acc = acc * alpha[None, :] + _dot(tl.trans(k_a), p_hi, PRECISION, UPCAST)
        if SPLIT_P:
            p_lo = downcast(p - p_hi.to(tl.float32), kv_ty, P_RTNE)
            acc += _dot(tl.trans(k_a), p_lo, PRECISION, UPCAST)
        m_i = m_new

    inv = 1.0 / tl.where(l_i > 0.0, l_i, 1.0)
    lse2 = tl.where(l_i > 0.0, m_i + tl.log2(tl.where(l_i > 0.0, l_i, 1.0)), float("-inf"))
    o = tl.trans(acc * inv[None, :])
    _store(o, da, heads, hmask, lse2, out_ptr, lse_ptr, part_ptr, plse_ptr, pid_b, pid_s, H, D_V, NUM_SPLITS,
           DIRECT, OUT_RTNE, STORE_LSE=True)  # fmt: skip


def plan(q: torch.Tensor, k: int, cfg: MmaConfig, num_splits: int | None = None) -> SplitPlan:
    """The split plan the kernel launches with for q's shape, K indices and ``cfg`` (``num_splits`` overrides)."""
    return plan_head_groups(q, k, cfg, num_splits, per_group=2 if cfg.v_split else 1)


# MLA_KERNELS_GLUON=0 keeps every input on the tl.dot kernels (read once, at import).
_GLUON = os.environ.get("MLA_KERNELS_GLUON", "1") != "0"


def gluon_enabled() -> bool:
    """Return whether the Gluon kernels may run at all (MLA_KERNELS_GLUON is not 0; read once, at import)."""
    return _GLUON


def gluon_module(q: torch.Tensor, kv: torch.Tensor, d_v: int) -> Any:
    """Return the Gluon kernel module ``decode`` without a config runs these inputs on, or None for the tl.dot kernels.

    On a Hopper GPU, for bf16 inputs at DeepSeek's 576/512 widths (H200, 2026-12-04, docs/kernels.md): 64k heads go
    to ``warpgroup`` (75.5 us at H = 128, B = 32, against 157.0 for this module's V split) and 16 heads or fewer to
    ``mmasync`` (31.6 against 35.3 us at H = 16, B = 32; 96.9 against 105.9 at B = 128). Never while torch.compile
    traces (Inductor does not wrap Gluon kernels), nor where this Triton has no Gluon, nor with MLA_KERNELS_GLUON=0
    in the environment.
    """
    if q.device.type != "cuda" or torch.compiler.is_compiling() or not _GLUON:
        return None
    if torch.cuda.get_device_capability(q.device)[0] != 9:
        return None
    try:
        from mla_kernels import mmasync, warpgroup
    except ImportError:
        return None
    for module in (warpgroup, mmasync):
        if module.supports(q, kv, d_v):
            return module
    return None


def kernel_name(q: torch.Tensor, kv: torch.Tensor, d_v: int) -> str:
    """Name the kernel ``decode`` without a config runs for inputs like these: "warpgroup", "mmasync" or "tl.dot".

    Only shapes, dtypes and the device matter, so one-row tensors of the real widths answer for a whole server.
    """
    module = gluon_module(q, kv, d_v)
    return "tl.dot" if module is None else str(module.__name__).rsplit(".", 1)[-1]


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

    Without ``config``, inputs a Gluon kernel takes go to it (``gluon_module``). ``config`` and
    ``num_splits`` override the defaults (the benchmark sweeps them); ``out`` and ``lse`` are optional caller-owned
    buffers (static outputs for CUDA graphs; poisoned buffers in tests).
    """
    require_triton_device(q)
    if config is None:
        gluon_kernel = gluon_module(q, kv, d_v)
        if gluon_kernel is not None:
            return gluon_kernel.decode(q, kv, indices, sm_scale, d_v, num_splits=num_splits, out=out, lse=lse)
    h = q.shape[1]
    cfg = config or default_config(h, d_v)
    q = q if q.stride(2) == 1 else q.contiguous()
    kv = kv if kv.stride(1) == 1 else kv.contiguous()
    indices = indices if indices.stride(1) == 1 else indices.contiguous()
    splits = plan(q, indices.shape[1], cfg, num_splits)
    out, lse, part, plse = outputs(q, d_v, splits, out, lse)
    _launch(q, kv, indices, sm_scale, d_v, cfg, splits, out, lse, part, plse)
    if splits.num_splits > 1:
        merge(part, plse, out, lse, pdl=cfg.pdl)
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
    block_dv = triton.next_power_of_2(d_v)
    # Halves need each half to be a valid tl.dot width (>= 16); the swapped kernel keeps the latent whole.
    halves = cfg.halves and not cfg.swap and block_dv >= 32
    kernel = _mma_swap_kernel if cfg.swap else _mma_decode_kernel
    v_split = cfg.v_split and halves
    extra = {} if cfg.swap else {"V_SPLIT": v_split}
    return kernel[(b, triton.cdiv(h, cfg.block_h) * (2 if v_split else 1), plan.num_splits)](
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
        BLOCK_DA=block_dv // 2 if halves else block_dv,
        BLOCK_DR=max(16, triton.next_power_of_2(max(d_r, 1))),
        HALVES=halves,
        MASK_ROWS=cfg.mask_rows,
        DIRECT=plan.num_splits == 1,
        PRECISION="ieee" if kv.dtype == torch.float32 else "tf32",
        UPCAST=interpreting(),
        P_RTNE=emulate_rtne(kv.dtype),
        OUT_RTNE=emulate_rtne(out.dtype),
        SPLIT_P=cfg.split_p and kv.dtype != torch.float32,
        TRIGGER=cfg.pdl and plan.num_splits > 1 and use_pdl(q),
        num_warps=cfg.num_warps,
        num_stages=cfg.num_stages,
        **extra,
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
    (``versionMajor`` 3 is wgmma, 2 is mma.sync), the registers/spills the compiler reported, the TTGIR's async
    global-to-shared copies (the software pipeliner's) and how many KV tiles its shared ring buffers hold.
    """
    cfg = config or default_config(q.shape[1], d_v)
    splits = plan(q, indices.shape[1], cfg, num_splits)
    out, lse, part, plse = outputs(q, d_v, splits, None, None)
    compiled = _launch(q, kv, indices, sm_scale, d_v, cfg, splits, out, lse, part, plse)
    ptx = compiled.asm.get("ptx", "")
    ttgir = compiled.asm.get("ttgir", "")
    versions = sorted(set(re.findall(r"versionMajor = (\d+)", ttgir)))
    # Shared-memory ring buffers the pipeliner made for the KV gathers: "2x32x512xbf16" means 2 tiles in flight.
    rings = [int(n) for n in re.findall(r"ttg\.local_alloc : \(\) -> !ttg\.memdesc<(\d+)x\d+x\d+x(?:bf16|f32)", ttgir)]
    first = re.search(r"^\s*((?:wgmma\.mma_async|mma\.sync)\S*)", ptx, re.MULTILINE)
    return {
        "wgmma": len(re.findall(r"\bwgmma\.mma_async", ptx)),
        "mma.sync": len(re.findall(r"\bmma\.sync", ptx)),
        "ttgir_mma_versions": ",".join(versions),
        "registers": int(getattr(compiled, "n_regs", -1)),
        "spills": int(getattr(compiled, "n_spills", -1)),
        "shared_bytes": int(getattr(getattr(compiled, "metadata", None), "shared", -1)),
        "first_instruction": first.group(1) if first else "",
        "async_copies": len(re.findall(r"ttg\.async_copy_global_to_local", ttgir)),
        "kv_buffers": max(rings, default=0),
    }
