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

from kernels.device import interpreting, program_slots, require_triton_device
from kernels.merge import (
    LOG2E,
    MIN_TILES_PER_SPLIT,
    SplitPlan,
    downcast,
    emulate_rtne,
    merge,
    outputs,
    plan_splits,
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
    # Stream-K schedule (plain layout only): programs_per_sm × SMs programs, each walking one contiguous range of
    # the flattened (row·group, tile) space; partial items are merged in the same launch by the last of their
    # owners (atomic ticket), so there is no merge kernel. num_splits then means programs per item. Measured
    # slower on the H200 (58.7 µs against 35.2 at H=16, B=32; docs/kernels.md, run 6): the one-CTA merge of an
    # item's partials sits on the critical path at ~1 µs per partial. Off in both defaults.
    persistent: bool = False
    # Persistent kernel only: skip the MMAs of tiles whose indices are all unused; walk each item's share in its
    # own pipelined loop (q then stays loop-invariant) instead of one loop over the whole range.
    skip_empty: bool = False
    nested: bool = False


def default_config(h: int, d_v: int) -> MmaConfig:
    """Return the tuned configuration for H heads and latent width D_v (H200 sweep of 2026-12-02, docs/kernels.md)."""
    if h >= 64 and d_v >= 256:
        # Swapped operands, 32 heads per program, 8 warps: wgmma with split p and no spills (189 registers);
        # 186 µs at B=32 against 272 for the BLOCK_H=32 mma.sync form. 189 KB of shared memory: one program per SM.
        return MmaConfig(block_h=32, block_n=64, num_warps=8, num_stages=3, swap=True, programs_per_sm=1)
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
):
    """One (row, head group, split): online softmax over the split's tiles of gathered KV rows.

    The latent is one BLOCK_DA-wide part, or with HALVES two (columns [0, BLOCK_DA) and [BLOCK_DA, 2·BLOCK_DA)).
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
        acc = acc * alpha[:, None] + _dot(p_hi, k_a, PRECISION, UPCAST)
        if HALVES:
            acc_b = acc_b * alpha[:, None] + _dot(p_hi, k_b, PRECISION, UPCAST)
        if SPLIT_P:
            p_lo = downcast(p - p_hi.to(tl.float32), kv_ty, P_RTNE)
            acc += _dot(p_lo, k_a, PRECISION, UPCAST)
            if HALVES:
                acc_b += _dot(p_lo, k_b, PRECISION, UPCAST)
        m_i = m_new

    inv = 1.0 / tl.where(l_i > 0.0, l_i, 1.0)
    lse2 = tl.where(l_i > 0.0, m_i + tl.log2(tl.where(l_i > 0.0, l_i, 1.0)), float("-inf"))
    _store(acc * inv[:, None], da, heads, hmask, lse2, out_ptr, lse_ptr, part_ptr, plse_ptr, pid_b, pid_s, H, D_V,
           NUM_SPLITS, DIRECT, OUT_RTNE, STORE_LSE=True)  # fmt: skip
    if HALVES:
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


@triton.jit
def _owner(x, P, W):
    """The program whose tile range holds flattened tile x: the largest p with p·W // P <= x."""
    return ((x + 1) * P - 1) // W


@triton.jit
def _persistent_kernel(
    q_ptr,
    kv_ptr,
    idx_ptr,
    out_ptr,
    lse_ptr,
    part_ptr,
    plse_ptr,
    cnt_ptr,
    scale_log2,
    H,
    N,
    K,
    stride_qb,
    stride_qh,
    stride_kv,
    stride_ib,
    TILES,
    GROUPS,
    W,
    P,
    SLOTS,
    D_V: tl.constexpr,
    D_R: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_DA: tl.constexpr,
    BLOCK_DR: tl.constexpr,
    HALVES: tl.constexpr,
    MASK_ROWS: tl.constexpr,
    SKIP_EMPTY: tl.constexpr,
    NESTED: tl.constexpr,
    PRECISION: tl.constexpr,
    UPCAST: tl.constexpr,
    P_RTNE: tl.constexpr,
    OUT_RTNE: tl.constexpr,
    SPLIT_P: tl.constexpr,
):
    """Stream-K: one contiguous range of the flattened (row·group, tile) space per program.

    Work item = one (batch row, head group) with TILES tiles of BLOCK_N indices; W = items·TILES tiles in all,
    program p takes tiles [p·W // P, (p+1)·W // P). At the last tile of an item (or of the range) the program
    flushes: straight to out/lse when it covered the whole item, else an fp32 partial and its log2-sum-exp into
    slot (p − first owner) of the item. After the loop, for each item it covered only in part, it takes a ticket
    (atomic counter per item); the last of the item's owners merges the partials and resets the counter to 0 for
    the next launch (so CUDA-graph replays need no reset). The range is walked in one loop (q reloaded at item
    boundaries, so the pipeliner prefetches across them) or, with NESTED, one pipelined loop per item.
    """
    pid = tl.program_id(0)
    start = (pid * W) // P
    end = ((pid + 1) * W) // P
    hb = tl.arange(0, BLOCK_H)
    da = tl.arange(0, BLOCK_DA)
    dr = tl.arange(0, BLOCK_DR)
    db = BLOCK_DA + tl.arange(0, BLOCK_DA)
    kv_ty = kv_ptr.dtype.element_ty
    scale = tl.cast(scale_log2, tl.float32)
    item0 = start // TILES
    item1 = (end - 1) // TILES

    if NESTED:
        item = item0
        while item <= item1:
            row = item // GROUPS
            heads = (item - row * GROUPS) * BLOCK_H + hb
            hmask = heads < H
            q_a, q_b, q_pe = _load_q(q_ptr, row, heads, hmask, da, db, dr, stride_qb, stride_qh, D_V, D_R, kv_ty,
                                     HALVES)  # fmt: skip
            m_i = tl.full([BLOCK_H], -1.0e30, tl.float32)
            l_i = tl.zeros([BLOCK_H], tl.float32)
            acc = tl.zeros([BLOCK_H, BLOCK_DA], tl.float32)
            acc_b = tl.zeros([BLOCK_H, BLOCK_DA], tl.float32)
            lo = tl.maximum(start, item * TILES) - item * TILES
            hi = tl.minimum(end, item * TILES + TILES) - item * TILES
            if UPCAST:
                # The interpreter cannot take program-dependent range bounds (1-element scalars): `while` there.
                t = lo
                while t < hi:
                    m_i, l_i, acc, acc_b = _tile(t, row, q_a, q_b, q_pe, m_i, l_i, acc, acc_b, kv_ptr, idx_ptr,
                                                 scale, N, K, stride_kv, stride_ib, da, db, dr, kv_ty, D_V, D_R,
                                                 BLOCK_N, BLOCK_DA, HALVES, MASK_ROWS, SKIP_EMPTY, PRECISION,
                                                 UPCAST, P_RTNE, SPLIT_P)  # fmt: skip
                    t += 1
            else:
                for t in range(lo, hi):
                    m_i, l_i, acc, acc_b = _tile(t, row, q_a, q_b, q_pe, m_i, l_i, acc, acc_b, kv_ptr, idx_ptr,
                                                 scale, N, K, stride_kv, stride_ib, da, db, dr, kv_ty, D_V, D_R,
                                                 BLOCK_N, BLOCK_DA, HALVES, MASK_ROWS, SKIP_EMPTY, PRECISION,
                                                 UPCAST, P_RTNE, SPLIT_P)  # fmt: skip
            _flush(item, (lo == 0) & (hi == TILES), pid, row, heads, hmask, m_i, l_i, acc, acc_b, out_ptr,
                   lse_ptr, part_ptr, plse_ptr, H, TILES, W, P, SLOTS, hb, da, db, D_V, HALVES, OUT_RTNE)  # fmt: skip
            item += 1
    else:
        row = item0 // GROUPS
        heads = (item0 - row * GROUPS) * BLOCK_H + hb
        q_a, q_b, q_pe = _load_q(q_ptr, row, heads, heads < H, da, db, dr, stride_qb, stride_qh, D_V, D_R, kv_ty,
                                 HALVES)  # fmt: skip
        m_i = tl.full([BLOCK_H], -1.0e30, tl.float32)
        l_i = tl.zeros([BLOCK_H], tl.float32)
        acc = tl.zeros([BLOCK_H, BLOCK_DA], tl.float32)
        acc_b = tl.zeros([BLOCK_H, BLOCK_DA], tl.float32)
        if UPCAST:
            i = start
            while i < end:
                q_a, q_b, q_pe, m_i, l_i, acc, acc_b = _flat_step(i, start, end, pid, q_a, q_b, q_pe, m_i, l_i, acc,
                    acc_b, q_ptr, kv_ptr, idx_ptr, out_ptr, lse_ptr, part_ptr, plse_ptr, scale, H, N, K, stride_qb,
                    stride_qh, stride_kv, stride_ib, TILES, GROUPS, W, P, SLOTS, hb, da, db, dr, kv_ty, D_V, D_R,
                    BLOCK_H, BLOCK_N, BLOCK_DA, HALVES, MASK_ROWS, SKIP_EMPTY, PRECISION, UPCAST, P_RTNE,
                    OUT_RTNE, SPLIT_P)  # fmt: skip
                i += 1
        else:
            for i in range(start, end):
                q_a, q_b, q_pe, m_i, l_i, acc, acc_b = _flat_step(i, start, end, pid, q_a, q_b, q_pe, m_i, l_i, acc,
                    acc_b, q_ptr, kv_ptr, idx_ptr, out_ptr, lse_ptr, part_ptr, plse_ptr, scale, H, N, K, stride_qb,
                    stride_qh, stride_kv, stride_ib, TILES, GROUPS, W, P, SLOTS, hb, da, db, dr, kv_ty, D_V, D_R,
                    BLOCK_H, BLOCK_N, BLOCK_DA, HALVES, MASK_ROWS, SKIP_EMPTY, PRECISION, UPCAST, P_RTNE,
                    OUT_RTNE, SPLIT_P)  # fmt: skip

    # Items this program covered only in part: its first (if it began inside it or ended before its end) and its
    # last (if different and cut by the range's end).
    if (start > item0 * TILES) | (end < item0 * TILES + TILES):
        _ticket_merge(item0, part_ptr, plse_ptr, cnt_ptr, out_ptr, lse_ptr, TILES, GROUPS, W, P, SLOTS, H, hb, da,
                      db, D_V, BLOCK_H, BLOCK_DA, HALVES, OUT_RTNE)  # fmt: skip
    if (item1 != item0) & (end < item1 * TILES + TILES):
        _ticket_merge(item1, part_ptr, plse_ptr, cnt_ptr, out_ptr, lse_ptr, TILES, GROUPS, W, P, SLOTS, H, hb, da,
                      db, D_V, BLOCK_H, BLOCK_DA, HALVES, OUT_RTNE)  # fmt: skip


@triton.jit
def _tile(t, row, q_a, q_b, q_pe, m_i, l_i, acc, acc_b, kv_ptr, idx_ptr, scale, N, K, stride_kv, stride_ib, da, db,
          dr, kv_ty, D_V: tl.constexpr, D_R: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_DA: tl.constexpr,
          HALVES: tl.constexpr, MASK_ROWS: tl.constexpr, SKIP_EMPTY: tl.constexpr, PRECISION: tl.constexpr,
          UPCAST: tl.constexpr, P_RTNE: tl.constexpr, SPLIT_P: tl.constexpr):  # fmt: skip
    """Tile t of batch row ``row``: gather its KV rows, update the online softmax; return (m, l, acc, acc_b)."""
    pos = t * BLOCK_N + tl.arange(0, BLOCK_N)
    idx = tl.load(idx_ptr + row * stride_ib + pos, mask=pos < K, other=-1)
    valid = (idx >= 0) & (idx < N)
    rows = tl.where(valid, idx, 0).to(tl.int64)
    k_a = _gather(kv_ptr, rows, valid, da, stride_kv, D_V, BLOCK_DA, MASK_ROWS)
    k_pe = _gather(kv_ptr + D_V, rows, valid, dr, stride_kv, D_R, dr.shape[0], MASK_ROWS)
    if HALVES:  # noqa: SIM108 (statement form: Triton's frontend evaluates only the constexpr branch taken)
        k_b = _gather(kv_ptr + BLOCK_DA, rows, valid, da, stride_kv, D_V - BLOCK_DA, BLOCK_DA, MASK_ROWS)
    else:
        k_b = k_a
    if SKIP_EMPTY:  # noqa: SIM108
        live = tl.max(valid.to(tl.int32), axis=0) > 0
    else:
        live = True
    if live:
        s = _dot(q_a, tl.trans(k_a), PRECISION, UPCAST) + _dot(q_pe, tl.trans(k_pe), PRECISION, UPCAST)
        if HALVES:
            s += _dot(q_b, tl.trans(k_b), PRECISION, UPCAST)
        s = tl.where(valid[None, :], s * scale, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        p_hi = downcast(p, kv_ty, P_RTNE)
        acc = acc * alpha[:, None] + _dot(p_hi, k_a, PRECISION, UPCAST)
        if HALVES:
            acc_b = acc_b * alpha[:, None] + _dot(p_hi, k_b, PRECISION, UPCAST)
        if SPLIT_P:
            p_lo = downcast(p - p_hi.to(tl.float32), kv_ty, P_RTNE)
            acc += _dot(p_lo, k_a, PRECISION, UPCAST)
            if HALVES:
                acc_b += _dot(p_lo, k_b, PRECISION, UPCAST)
        m_i = m_new
    return m_i, l_i, acc, acc_b


@triton.jit
def _flush(item, whole, pid, row, heads, hmask, m_i, l_i, acc, acc_b, out_ptr, lse_ptr, part_ptr, plse_ptr, H, TILES,
           W, P, SLOTS, hb, da, db, D_V: tl.constexpr, HALVES: tl.constexpr, OUT_RTNE: tl.constexpr):  # fmt: skip
    """End of this program's share of ``item``: normalized output to out (``whole``) or to the item's partial slot."""
    inv = 1.0 / tl.where(l_i > 0.0, l_i, 1.0)
    lse2 = tl.where(l_i > 0.0, m_i + tl.log2(tl.where(l_i > 0.0, l_i, 1.0)), float("-inf"))
    if whole:
        _store_direct(acc * inv[:, None], da, row, heads, hmask, lse2, out_ptr, lse_ptr, H, D_V, OUT_RTNE, True)
        if HALVES:
            _store_direct(acc_b * inv[:, None], db, row, heads, hmask, lse2, out_ptr, lse_ptr, H, D_V, OUT_RTNE, False)
    else:
        slot = (item * SLOTS + pid - _owner(item * TILES, P, W)) * hb.shape[0] + hb
        tl.store(part_ptr + slot[:, None] * D_V + da[None, :], acc * inv[:, None], da[None, :] < D_V)
        if HALVES:
            tl.store(part_ptr + slot[:, None] * D_V + db[None, :], acc_b * inv[:, None], db[None, :] < D_V)
        tl.store(plse_ptr + slot, lse2)


@triton.jit
def _flat_step(i, start, end, pid, q_a, q_b, q_pe, m_i, l_i, acc, acc_b, q_ptr, kv_ptr, idx_ptr, out_ptr, lse_ptr,
               part_ptr, plse_ptr, scale, H, N, K, stride_qb, stride_qh, stride_kv, stride_ib, TILES, GROUPS, W, P,
               SLOTS, hb, da, db, dr, kv_ty, D_V: tl.constexpr, D_R: tl.constexpr, BLOCK_H: tl.constexpr,
               BLOCK_N: tl.constexpr, BLOCK_DA: tl.constexpr, HALVES: tl.constexpr, MASK_ROWS: tl.constexpr,
               SKIP_EMPTY: tl.constexpr, PRECISION: tl.constexpr, UPCAST: tl.constexpr, P_RTNE: tl.constexpr,
               OUT_RTNE: tl.constexpr, SPLIT_P: tl.constexpr):  # fmt: skip
    """Flattened tile i of the single-loop form: q at an item's first tile, the tile, a flush at its last."""
    item = i // TILES
    t = i - item * TILES
    row = item // GROUPS
    heads = (item - row * GROUPS) * BLOCK_H + hb
    hmask = heads < H
    if (t == 0) & (i != start):
        # A new item: its query heads (L2 hits; the next tiles' KV gathers are already in flight).
        q_a, q_b, q_pe = _load_q(q_ptr, row, heads, hmask, da, db, dr, stride_qb, stride_qh, D_V, D_R, kv_ty,
                                 HALVES)  # fmt: skip
    m_i, l_i, acc, acc_b = _tile(t, row, q_a, q_b, q_pe, m_i, l_i, acc, acc_b, kv_ptr, idx_ptr, scale, N, K,
                                 stride_kv, stride_ib, da, db, dr, kv_ty, D_V, D_R, BLOCK_N, BLOCK_DA, HALVES,
                                 MASK_ROWS, SKIP_EMPTY, PRECISION, UPCAST, P_RTNE, SPLIT_P)  # fmt: skip
    if (t == TILES - 1) | (i == end - 1):
        _flush(item, (i - t >= start) & (i - t + TILES <= end), pid, row, heads, hmask, m_i, l_i, acc, acc_b,
               out_ptr, lse_ptr, part_ptr, plse_ptr, H, TILES, W, P, SLOTS, hb, da, db, D_V, HALVES,
               OUT_RTNE)  # fmt: skip
        m_i = tl.full([BLOCK_H], -1.0e30, tl.float32)
        l_i = tl.zeros([BLOCK_H], tl.float32)
        acc = tl.zeros([BLOCK_H, BLOCK_DA], tl.float32)
        acc_b = tl.zeros([BLOCK_H, BLOCK_DA], tl.float32)
    return q_a, q_b, q_pe, m_i, l_i, acc, acc_b


@triton.jit
def _load_q(q_ptr, row, heads, hmask, da, db, dr, stride_qb, stride_qh, D_V, D_R, kv_ty, HALVES: tl.constexpr):
    """Load one item's query heads: latent columns da (and db with HALVES) and the rope part, in the KV dtype."""
    q_row = q_ptr + row * stride_qb + heads[:, None] * stride_qh
    q_a = tl.load(q_row + da[None, :], mask=hmask[:, None] & (da[None, :] < D_V), other=0.0).to(kv_ty)
    q_pe = tl.load(q_row + D_V + dr[None, :], mask=hmask[:, None] & (dr[None, :] < D_R), other=0.0).to(kv_ty)
    if HALVES:
        q_b = tl.load(q_row + db[None, :], mask=hmask[:, None] & (db[None, :] < D_V), other=0.0).to(kv_ty)
    else:
        q_b = q_a
    return q_a, q_b, q_pe


@triton.jit
def _store_direct(o, cols, row, heads, hmask, lse2, out_ptr, lse_ptr, H, D_V, OUT_RTNE: tl.constexpr,
                  STORE_LSE: tl.constexpr):  # fmt: skip
    """Write normalized output columns ``cols`` of ``heads`` of batch row ``row`` (and, with STORE_LSE, the lse)."""
    omask = hmask[:, None] & (cols[None, :] < D_V)
    tl.store(out_ptr + (row * H + heads[:, None]) * D_V + cols[None, :], downcast(o, out_ptr.dtype.element_ty,
             OUT_RTNE), omask)  # fmt: skip
    if STORE_LSE:
        tl.store(lse_ptr + row * H + heads, lse2 * 0.6931471805599453, hmask)


@triton.jit
def _ticket_merge(item, part_ptr, plse_ptr, cnt_ptr, out_ptr, lse_ptr, TILES, GROUPS, W, P, SLOTS, H, hb, da, db,
                  D_V: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_DA: tl.constexpr, HALVES: tl.constexpr,
                  OUT_RTNE: tl.constexpr):  # fmt: skip
    """Count this program's partial of ``item`` in; the last of its owners merges all of them into out and lse."""
    owners = _owner(item * TILES + TILES - 1, P, W) - _owner(item * TILES, P, W) + 1
    # Every thread's partial stores happen before the (one-thread) release below: the barrier orders them in the
    # CTA and the release makes them visible at GPU scope to whoever acquires the counter next.
    tl.debug_barrier()
    ticket = tl.atomic_add(cnt_ptr + item, 1, sem="acq_rel", scope="gpu")
    if ticket == owners - 1:
        base = item * SLOTS * BLOCK_H + hb
        peak = tl.full([BLOCK_H], float("-inf"), tl.float32)
        # `while`, not `for`: the interpreter cannot take program-dependent range bounds (see the main loop).
        s = 0
        while s < owners:
            peak = tl.maximum(peak, tl.load(plse_ptr + base + s * BLOCK_H, cache_modifier=".cg"))
            s += 1
        # All partials empty: shift by 0 so exp2 gives exact zeros instead of NaN.
        peak = tl.where(peak == float("-inf"), 0.0, peak)
        total = tl.zeros([BLOCK_H], tl.float32)
        o_a = tl.zeros([BLOCK_H, BLOCK_DA], tl.float32)
        o_b = tl.zeros([BLOCK_H, BLOCK_DA], tl.float32)
        s = 0
        while s < owners:
            slot = base + s * BLOCK_H
            w = tl.exp2(tl.load(plse_ptr + slot, cache_modifier=".cg") - peak)
            total += w
            ptrs = part_ptr + slot[:, None] * D_V
            o_a += w[:, None] * tl.load(ptrs + da[None, :], mask=da[None, :] < D_V, other=0.0, cache_modifier=".cg")
            if HALVES:
                o_b += w[:, None] * tl.load(ptrs + db[None, :], mask=db[None, :] < D_V, other=0.0,
                                            cache_modifier=".cg")  # fmt: skip
            s += 1
        inv = 1.0 / tl.where(total > 0.0, total, 1.0)
        lse2 = tl.where(total > 0.0, tl.log2(tl.where(total > 0.0, total, 1.0)) + peak, float("-inf"))
        row = item // GROUPS
        heads = (item - row * GROUPS) * BLOCK_H + hb
        hmask = heads < H
        _store_direct(o_a * inv[:, None], da, row, heads, hmask, lse2, out_ptr, lse_ptr, H, D_V, OUT_RTNE, True)
        if HALVES:
            _store_direct(o_b * inv[:, None], db, row, heads, hmask, lse2, out_ptr, lse_ptr, H, D_V, OUT_RTNE, False)
        # Every owner has counted in: reset for the next launch (graph replays reuse the counters).
        tl.atomic_xchg(cnt_ptr + item, 0, sem="relaxed", scope="gpu")


def plan(q: torch.Tensor, k: int, cfg: MmaConfig, num_splits: int | None = None) -> SplitPlan:
    """The split plan the kernel launches with for q's shape, K indices and ``cfg`` (``num_splits`` overrides).

    For a persistent config: ``num_splits`` is the programs per item (rounded up) and ``tiles_per_split`` the
    largest tile range of one program (see ``stream_plan`` for the exact schedule).
    """
    if cfg.persistent:
        sp = stream_plan(q, k, cfg, num_splits)
        return SplitPlan(cfg.block_n, triton.cdiv(sp.programs, sp.items), triton.cdiv(sp.tiles * sp.items,
                         sp.programs))  # fmt: skip
    b, h, _ = q.shape
    programs = b * triton.cdiv(h, cfg.block_h)
    return plan_splits(q, k, cfg.block_n, programs, num_splits, cfg.programs_per_sm, cfg.whole_wave)


@dataclass(frozen=True)
class StreamPlan:
    """The persistent kernel's schedule: ``items`` (row, head group) pairs of ``tiles`` tiles over ``programs``."""

    items: int
    tiles: int
    programs: int
    # Partial slots per item: an upper bound on how many programs share one item.
    slots: int


def stream_plan(q: torch.Tensor, k: int, cfg: MmaConfig, num_splits: int | None = None) -> StreamPlan:
    """Programs for the persistent kernel: programs_per_sm per SM, or ``num_splits`` per item, never above the tiles."""
    b, h, _ = q.shape
    items = b * triton.cdiv(h, cfg.block_h)
    tiles = max(1, triton.cdiv(k, cfg.block_n))
    work = items * tiles
    if num_splits is not None:
        programs = max(1, min(work, items * num_splits))
    else:
        # A range of one tile spends more on its partial and the merge than it saves (the split plan's rule too).
        programs = max(1, min(cfg.programs_per_sm * program_slots(q), max(items, work // MIN_TILES_PER_SPLIT)))
    least = work // programs  # every program has at least this many tiles
    return StreamPlan(items, tiles, programs, min(programs, triton.cdiv(tiles, least) + 1))


# Tickets of the persistent kernel, per device: zero between launches (the last owner of an item resets its
# counter). Shared by all streams of a device, so two persistent launches must not run concurrently on one device.
_COUNTERS: dict[torch.device, torch.Tensor] = {}


def counters(q: torch.Tensor, n: int) -> torch.Tensor:
    """Return at least ``n`` int32 counters that are zero now and that the kernel leaves zero."""
    if torch.compiler.is_compiling():
        return torch.zeros(n, dtype=torch.int32, device=q.device)
    buf = _COUNTERS.get(q.device)
    if buf is None or buf.numel() < n:
        if q.device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            # First use inside a capture: the zero fill becomes part of the graph (the cache wants eager memory).
            return torch.zeros(n, dtype=torch.int32, device=q.device)
        buf = torch.zeros(max(n, 4096), dtype=torch.int32, device=q.device)
        _COUNTERS[q.device] = buf
    return buf


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
    h = q.shape[1]
    cfg = config or default_config(h, d_v)
    q = q if q.stride(2) == 1 else q.contiguous()
    kv = kv if kv.stride(1) == 1 else kv.contiguous()
    indices = indices if indices.stride(1) == 1 else indices.contiguous()
    if cfg.persistent and not cfg.swap:
        sp = stream_plan(q, indices.shape[1], cfg, num_splits)
        out, lse, _, _ = outputs(q, d_v, SplitPlan(cfg.block_n, 1, sp.tiles), out, lse)
        _launch_persistent(q, kv, indices, sm_scale, d_v, cfg, sp, out, lse)
        return out, lse
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
    return kernel[(b, triton.cdiv(h, cfg.block_h), plan.num_splits)](
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
    )


def _launch_persistent(
    q: torch.Tensor,
    kv: torch.Tensor,
    indices: torch.Tensor,
    sm_scale: float,
    d_v: int,
    cfg: MmaConfig,
    sp: StreamPlan,
    out: torch.Tensor,
    lse: torch.Tensor,
) -> Any:
    """Launch the persistent kernel (partials, tickets and merge inside); return the compiled-kernel handle."""
    _, h, d_qk = q.shape
    n, k = kv.shape[0], indices.shape[1]
    d_r = d_qk - d_v
    block_dv = triton.next_power_of_2(d_v)
    halves = cfg.halves and block_dv >= 32
    groups = triton.cdiv(h, cfg.block_h)
    rows = sp.items * sp.slots * cfg.block_h
    part = torch.empty((rows, d_v), dtype=torch.float32, device=q.device)
    plse = torch.empty((rows,), dtype=torch.float32, device=q.device)
    return _persistent_kernel[(sp.programs,)](
        q,
        kv,
        indices,
        out,
        lse,
        part,
        plse,
        counters(q, sp.items),
        sm_scale * LOG2E,
        h,
        n,
        k,
        q.stride(0),
        q.stride(1),
        kv.stride(0),
        indices.stride(0),
        sp.tiles,
        groups,
        sp.items * sp.tiles,
        sp.programs,
        sp.slots,
        D_V=d_v,
        D_R=d_r,
        BLOCK_H=cfg.block_h,
        BLOCK_N=cfg.block_n,
        BLOCK_DA=block_dv // 2 if halves else block_dv,
        BLOCK_DR=max(16, triton.next_power_of_2(max(d_r, 1))),
        HALVES=halves,
        MASK_ROWS=cfg.mask_rows,
        SKIP_EMPTY=cfg.skip_empty,
        NESTED=cfg.nested,
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
    (``versionMajor`` 3 is wgmma, 2 is mma.sync), the registers/spills the compiler reported, the TTGIR's async
    global-to-shared copies (the software pipeliner's) and how many KV tiles its shared ring buffers hold.
    """
    cfg = config or default_config(q.shape[1], d_v)
    if cfg.persistent and not cfg.swap:
        sp = stream_plan(q, indices.shape[1], cfg, num_splits)
        out, lse, _, _ = outputs(q, d_v, SplitPlan(cfg.block_n, 1, sp.tiles), None, None)
        compiled = _launch_persistent(q, kv, indices, sm_scale, d_v, cfg, sp, out, lse)
    else:
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
