"""The warpgroup (wgmma) sparse-MLA decode kernel for 64+ heads, written in Gluon: heads as wgmma's M dimension.

Issue 15's compute-bound design. Each program owns one batch row, 64 query heads and one slice of the top-k axis,
and runs 8 warps (two warpgroups). q (64 x 576) stays in shared memory for the whole program; each KV tile
(BLOCK_N gathered rows, latent and rope parts) is copied once into shared memory with cp.async, NUM_BUF tiles in
flight, and read from there by every product:

- scores = q·Kᵀ as wgmma with the 64 heads as M; the two warpgroups take half of the tile's rows each (N);
- p·V as wgmma with V the tile's latent part; the two warpgroups take half of the 512 latent columns each, so each
  holds a 64 x 256 fp32 accumulator (128 registers a thread), the split FlashMLA makes between its warpgroups.

What Triton's ``tl.dot`` form could not express (mla_kernels/mma.py): one program holding both latent halves of a
64-head accumulator spilled, so its V split ran q·K twice in two programs. Gluon lets the layout say which
warpgroup owns which columns, so here q·K is done once and the tile gathered once per 64 heads.

Needs a Hopper GPU (sm_90), bf16 q and kv, D_qk 576 with D_v 512, and H a multiple of 64. No CPU interpreter
(Gluon has none): mla_kernels.mma stays the portable backend.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    async_copy,
    fence_async_shared,
    warpgroup_mma,
    warpgroup_mma_wait,
)

from mla_kernels import launcher
from mla_kernels.launcher import launch_constexprs
from mla_kernels.merge import LOG2E, SplitPlan, plan_splits

HEADS_PER_PROGRAM = 64
NUM_WARPS = 8
D_LATENT = gl.constexpr(512)
D_ROPE = gl.constexpr(64)
# A CTA-wide barrier: gl.thread_barrier in Triton 3.6, renamed gl.barrier later.
cta_barrier = getattr(gl, "barrier", None) or gl.thread_barrier


@dataclass(frozen=True)
class WarpgroupConfig:
    """Tile sizes of the warpgroup kernel."""

    # KV rows per tile (each warpgroup scores half of them) and KV buffers. H200, 2026-12-04 (docs/kernels.md): 64
    # rows in two buffers (225 KB of shared memory with q) 81.3 us at H = 128, B = 32, against 107.6 for 32 in three.
    block_n: int = 64
    num_buf: int = 2
    # p fed to p·V as bf16 hi + lo parts (as mla_kernels.mma): exact to 2^-17 for one more MMA per tile.
    split_p: bool = True
    programs_per_sm: int = 1
    whole_wave: bool = True


def supports(q: torch.Tensor, kv: torch.Tensor, d_v: int) -> bool:
    """Return whether this kernel can run these inputs (Hopper or newer, bf16, 64k heads, 576/512 rows)."""
    return (
        q.device.type == "cuda"
        and torch.cuda.get_device_capability(q.device)[0] == 9
        and q.dtype == kv.dtype == torch.bfloat16
        and q.shape[1] % HEADS_PER_PROGRAM == 0
        and q.shape[2] == D_LATENT.value + D_ROPE.value
        and d_v == D_LATENT.value
    )


@gluon.jit
def _gather(smem, kv_ptr, rows, valid, stride_kv, COL0: gl.constexpr, WIDTH: gl.constexpr, layout: gl.constexpr):
    """cp.async the columns [COL0, COL0 + WIDTH) of the KV rows ``rows`` into ``smem``; invalid rows read zeros."""
    cols = COL0 + gl.arange(0, WIDTH, layout=gl.SliceLayout(0, layout))
    r = gl.convert_layout(rows, gl.SliceLayout(1, layout))
    v = gl.convert_layout(valid, gl.SliceLayout(1, layout))
    ptrs = kv_ptr + r[:, None] * stride_kv + cols[None, :]
    async_copy.async_copy_global_to_shared(smem, ptrs, mask=v[:, None])


@gluon.jit
def tile_indices(idx_ptr, pid_b, stride_ib, K, pos0, BLOCK_N: gl.constexpr, row_layout: gl.constexpr):
    """Load the KV slots at top-k positions [pos0, pos0 + BLOCK_N) of row ``pid_b`` (-1 at and past ``K``).

    The kernels load them one tile ahead of the gather they address, so the gather's issue does not wait on them.
    """
    pos = pos0 + gl.arange(0, BLOCK_N, layout=row_layout)
    return gl.load(idx_ptr + pid_b * stride_ib + pos, mask=pos < K, other=-1)


@gluon.jit
def gather_tile(
    kn_bufs, kr_bufs, buf, kv_ptr, idx, stride_kv, N, lat_layout: gl.constexpr, rope_layout: gl.constexpr
):  # fmt: skip
    """Issue the gathers of the KV rows ``idx`` (latent and rope parts) into buffer ``buf``; commit them as a group."""
    valid = (idx >= 0) & (idx < N)
    rows = gl.where(valid, idx, 0).to(gl.int64)
    _gather(kn_bufs.index(buf), kv_ptr, rows, valid, stride_kv, 0, D_LATENT, lat_layout)
    _gather(kr_bufs.index(buf), kv_ptr, rows, valid, stride_kv, D_LATENT, D_ROPE, rope_layout)
    async_copy.commit_group()


@gluon.jit
def _scores(qn_smem, qr_smem, kn, kr, s_zero):
    """Issue q·Kᵀ for one tile (latent part, then rope part) as two asynchronous wgmma groups; return the token."""
    s = warpgroup_mma(qn_smem, kn.permute((1, 0)), s_zero, use_acc=False, is_async=True)
    return warpgroup_mma(qr_smem, kr.permute((1, 0)), s, is_async=True)


@gluon.jit
def _pv(p, kn, o, p_layout: gl.constexpr, SPLIT_P: gl.constexpr):
    """Issue o += p·V (V = the tile's latent part) asynchronously: one wgmma group, or two with p split hi + lo.

    p arrives split by columns between the warpgroups and each needs all of it: the layout change goes through
    shared memory (converting fp32 p once instead compiled to the same shared-memory traffic, offline).
    """
    p_hi = p.to(gl.bfloat16)
    o = warpgroup_mma(gl.convert_layout(p_hi, p_layout), kn, o, is_async=True)
    if SPLIT_P:
        p_lo = (p - p_hi.to(gl.float32)).to(gl.bfloat16)
        o = warpgroup_mma(gl.convert_layout(p_lo, p_layout), kn, o, is_async=True)
    return o


@gluon.jit
def _warpgroup_decode_kernel(
    q_ptr, kv_ptr, idx_ptr, out_ptr, lse_ptr, part_ptr, plse_ptr, scale_log2, H, N, K,
    stride_qb, stride_qh, stride_kv, stride_ib,
    TILES_PER_SPLIT: gl.constexpr, NUM_SPLITS: gl.constexpr, BLOCK_N: gl.constexpr, NUM_BUF: gl.constexpr,
    DIRECT: gl.constexpr, SPLIT_P: gl.constexpr,
):  # fmt: skip
    """One (64-head group, row, split): online softmax over the split's tiles, both products on wgmma."""
    BLOCK_H: gl.constexpr = 64
    pid_g = gl.program_id(0)
    pid_b = gl.program_id(1)
    pid_s = gl.program_id(2)

    # Registers: the scores' accumulator split by rows of the tile, the output's by latent columns, between the two
    # warpgroups ([4, 2] warps: 4 along M, as wgmma needs, 2 along N).
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 2], instr_shape=[16, BLOCK_N // 2, 16]
    )
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 2], instr_shape=[16, 256, 16])
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    # Global loads: 16-byte vectors along a row.
    lat_layout: gl.constexpr = gl.BlockedLayout([1, 8], [1, 32], [8, 1], [1, 0])
    rope_layout: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [8, 1], [1, 0])
    row_layout: gl.constexpr = gl.SliceLayout(1, lat_layout)

    # Shared memory: q (73.7 KB) and NUM_BUF KV tiles (73.7 KB each at BLOCK_N 64), wgmma's swizzled layouts.
    qn_sl: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_H, D_LATENT], gl.bfloat16)
    qr_sl: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_H, D_ROPE], gl.bfloat16)
    kn_sl: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_N, D_LATENT], gl.bfloat16)
    kr_sl: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_N, D_ROPE], gl.bfloat16)
    kn_bufs = gl.allocate_shared_memory(gl.bfloat16, [NUM_BUF, BLOCK_N, D_LATENT], kn_sl)
    kr_bufs = gl.allocate_shared_memory(gl.bfloat16, [NUM_BUF, BLOCK_N, D_ROPE], kr_sl)

    first = pid_s * TILES_PER_SPLIT * BLOCK_N
    # The prefetch past this split's last tile must not read the next split's rows.
    end = gl.minimum(K, first + TILES_PER_SPLIT * BLOCK_N)
    # Start the first tiles' gathers before anything else: they are the long pole.
    for i in gl.static_range(NUM_BUF - 1):
        idx_i = tile_indices(idx_ptr, pid_b, stride_ib, end, first + i * BLOCK_N, BLOCK_N, row_layout)
        gather_tile(kn_bufs, kr_bufs, i, kv_ptr, idx_i, stride_kv, N, lat_layout, rope_layout)
    idx_next = tile_indices(idx_ptr, pid_b, stride_ib, end, first + (NUM_BUF - 1) * BLOCK_N, BLOCK_N, row_layout)

    heads = pid_g * BLOCK_H + gl.arange(0, BLOCK_H, layout=gl.SliceLayout(1, lat_layout))
    q_row = q_ptr + pid_b * stride_qb + heads[:, None] * stride_qh
    qn = gl.load(q_row + gl.arange(0, D_LATENT, layout=gl.SliceLayout(0, lat_layout))[None, :])
    qr_heads = gl.convert_layout(heads, gl.SliceLayout(1, rope_layout))
    qr_row = q_ptr + pid_b * stride_qb + qr_heads[:, None] * stride_qh + D_LATENT
    qr = gl.load(qr_row + gl.arange(0, D_ROPE, layout=gl.SliceLayout(0, rope_layout))[None, :])
    qn_smem = gl.allocate_shared_memory(gl.bfloat16, [BLOCK_H, D_LATENT], qn_sl, qn)
    qr_smem = gl.allocate_shared_memory(gl.bfloat16, [BLOCK_H, D_ROPE], qr_sl, qr)

    # torch.compile passes the scale as fp64; keep the softmax state fp32.
    scale = scale_log2.to(gl.float32)
    m_i = gl.full([BLOCK_H], -1.0e30, gl.float32, layout=gl.SliceLayout(1, s_layout))
    l_i = gl.zeros([BLOCK_H], gl.float32, layout=gl.SliceLayout(1, s_layout))
    o = gl.zeros([BLOCK_H, D_LATENT], gl.float32, layout=o_layout)
    s_zero = gl.zeros([BLOCK_H, BLOCK_N], gl.float32, layout=s_layout)
    s_cols = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))
    for t in range(TILES_PER_SPLIT):
        buf = t % NUM_BUF
        # Every warp is past tile t-1's products, so its buffer can take tile t + NUM_BUF - 1, whose indices were
        # loaded one tile ago (waiting for them here cost a global load's latency before every gather: 6-8 % at
        # H = 128). Queuing tile t's q·K behind tile t-1's p·V instead, with this gather after it, measured 8 % slower:
        # the gather starts later and each tile waits for it.
        cta_barrier()
        gather_tile(kn_bufs, kr_bufs, (t + NUM_BUF - 1) % NUM_BUF, kv_ptr, idx_next, stride_kv, N, lat_layout,
                    rope_layout)  # fmt: skip
        idx_next = tile_indices(idx_ptr, pid_b, stride_ib, end, first + (t + NUM_BUF) * BLOCK_N, BLOCK_N, row_layout)
        async_copy.wait_group(NUM_BUF - 1)
        # Each thread waited for its own copies; the barrier makes all of them visible, the fence to wgmma's proxy.
        cta_barrier()
        fence_async_shared()
        kn = kn_bufs.index(buf)
        kr = kr_bufs.index(buf)
        s = _scores(qn_smem, qr_smem, kn, kr, s_zero)
        pos = first + t * BLOCK_N + s_cols
        idx = gl.load(idx_ptr + pid_b * stride_ib + pos, mask=pos < end, other=-1)
        s = warpgroup_mma_wait(num_outstanding=0, deps=(s,))
        valid = (idx >= 0) & (idx < N)
        s = gl.where(valid[None, :], s * scale, float("-inf"))
        m_new = gl.maximum(m_i, gl.max(s, axis=1))
        alpha = gl.exp2(m_i - m_new)
        p = gl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + gl.sum(p, axis=1)
        m_i = m_new
        o = o * gl.convert_layout(alpha, gl.SliceLayout(1, o_layout))[:, None]
        o = _pv(p, kn, o, p_layout, SPLIT_P)
        o = warpgroup_mma_wait(num_outstanding=0, deps=(o,))
    async_copy.wait_group(0)

    ok = l_i > 0.0
    inv = 1.0 / gl.where(ok, l_i, 1.0)
    lse2 = gl.where(ok, m_i + gl.log2(gl.where(ok, l_i, 1.0)), float("-inf"))
    o = o * gl.convert_layout(inv, gl.SliceLayout(1, o_layout))[:, None]
    o_heads = pid_g * BLOCK_H + gl.arange(0, BLOCK_H, layout=gl.SliceLayout(1, o_layout))
    o_cols = gl.arange(0, D_LATENT, layout=gl.SliceLayout(0, o_layout))
    l_heads = pid_g * BLOCK_H + gl.arange(0, BLOCK_H, layout=gl.SliceLayout(1, s_layout))
    if DIRECT:
        gl.store(out_ptr + (pid_b * H + o_heads[:, None]) * D_LATENT + o_cols[None, :], o.to(gl.bfloat16))
        gl.store(lse_ptr + pid_b * H + l_heads, lse2 * 0.6931471805599453)
    else:
        slot = (pid_b * H + o_heads) * NUM_SPLITS + pid_s
        gl.store(part_ptr + slot[:, None] * D_LATENT + o_cols[None, :], o)
        gl.store(plse_ptr + (pid_b * H + l_heads) * NUM_SPLITS + pid_s, lse2)


def plan(
    q: torch.Tensor,
    k: int,
    cfg: WarpgroupConfig | None = None,
    num_splits: int | None = None,
    slots: int | None = None,
) -> SplitPlan:
    """The split plan for q's shape and K indices: B·H/64 programs, split until the GPU is one wave.

    ``slots`` is the SM count to plan for (default: q's device's; the offline compile report passes 132).
    """
    cfg = cfg or WarpgroupConfig()
    programs = q.shape[0] * (q.shape[1] // HEADS_PER_PROGRAM)
    return plan_splits(q, k, cfg.block_n, programs, num_splits, cfg.programs_per_sm, cfg.whole_wave, slots)


def decode(
    q: torch.Tensor,
    kv: torch.Tensor,
    indices: torch.Tensor,
    sm_scale: float,
    d_v: int,
    *,
    config: WarpgroupConfig | None = None,
    num_splits: int | None = None,
    out: torch.Tensor | None = None,
    lse: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Run the warpgroup kernel (and the merge when the top-k axis is split); return (out, lse) as the contract says.

    Raises ValueError for inputs the kernel does not take (see ``supports``).
    """
    if not supports(q, kv, d_v):
        raise ValueError(
            "the warpgroup kernel needs a Hopper GPU, bf16 q and kv, H a multiple of 64 and 576-wide rows with "
            f"d_v 512; got {q.device}, {q.dtype}/{kv.dtype}, q {tuple(q.shape)}, d_v {d_v}"
        )
    return launcher.decode(
        plan, _launch, q, kv, indices, sm_scale, d_v, config or WarpgroupConfig(), num_splits, out, lse
    )


def _launch(
    q: torch.Tensor,
    kv: torch.Tensor,
    indices: torch.Tensor,
    sm_scale: float,
    d_v: int,
    cfg: WarpgroupConfig,
    plan: SplitPlan,
    out: torch.Tensor,
    lse: torch.Tensor,
    part: torch.Tensor,
    plse: torch.Tensor,
) -> Any:
    """Launch the split kernel; return Triton's compiled-kernel handle (``d_v`` is 512, as ``supports`` checked)."""
    b, h, _ = q.shape
    grid = (h // HEADS_PER_PROGRAM, b, plan.num_splits)
    return _warpgroup_decode_kernel[grid](
        q, kv, indices, out, lse, part, plse, sm_scale * LOG2E, h, kv.shape[0], indices.shape[1],
        q.stride(0), q.stride(1), kv.stride(0), indices.stride(0), **launch_constexprs(cfg, plan), num_warps=NUM_WARPS,
    )  # fmt: skip


def matrix_instructions(
    q: torch.Tensor,
    kv: torch.Tensor,
    indices: torch.Tensor,
    sm_scale: float,
    d_v: int,
    *,
    config: WarpgroupConfig | None = None,
    num_splits: int | None = None,
) -> dict[str, Any]:
    """Compile and run the kernel for these inputs; return its wgmma count, registers, spills and shared bytes.

    The keys are those of ``mla_kernels.mma.matrix_instructions``, so the tuning sweep prints both alike.
    """
    return launcher.matrix_instructions(
        plan, _launch, q, kv, indices, sm_scale, d_v, config or WarpgroupConfig(), num_splits
    )
