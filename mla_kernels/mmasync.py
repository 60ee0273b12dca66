"""The Gluon mma.sync sparse-MLA decode kernel for 16 heads: q in shared memory, operands loaded chunk by chunk.

Issue 15's occupancy lever at H = 16. The `tl.dot` kernel (mla_kernels/mma.py) holds q as the A operand of every
warp for the whole program and needs 236 registers, so two programs share an SM. scripts/bench_gather.py measured
that a read-only gather at that occupancy reaches about half the copy rate, and 1.4-1.6x more at 4-8 programs per
SM. Here q (16 x 576) sits in shared memory and each product loads its operands in 64-column chunks; the output is
four 16 x 128 accumulators (each warp owns 32 columns of each), and KV tiles arrive by cp.async into NUM_BUF
shared buffers. One program per (batch row, split), 4 warps. Measured, the lever did not pay: with 16-row tiles
three or four programs fit an SM (128 registers) but ran slower than 32-row tiles at two (185-190 registers), which
are the default (``mma.decode`` runs it for 16 heads on Hopper). What did pay is loading each tile's indices one
tile ahead, so the gather's issue never waits on them: 31.6 us at B = 32 and 96.9 at B = 128 against the tl.dot
kernel's 35.3 and 105.9 (H200, docs/kernels.md).

Needs a GPU with mma.sync (sm_80+), bf16 q and kv, 16 heads or fewer, 576/512 rows. No CPU interpreter.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy, mma_v2

from mla_kernels import launcher
from mla_kernels.launcher import launch_constexprs
from mla_kernels.merge import LOG2E, SplitPlan, plan_splits
from mla_kernels.warpgroup import D_LATENT, D_ROPE, cta_barrier, gather_tile, tile_indices

HEADS = 16
NUM_WARPS = 4


@dataclass(frozen=True)
class SyncConfig:
    """Tile sizes of the mma.sync kernel."""

    # H200, 2026-12-04 (docs/kernels.md): 32-row tiles in two buffers at two programs per SM (190 registers, 91 KB)
    # 33.8 us at B = 32 and 101.4 at B = 128, against 35.2 and 106.3 for the tl.dot kernel; the 16-row forms that fit
    # three or four programs per SM (128 registers) measured 25-39 % slower.
    block_n: int = 32
    num_buf: int = 2
    split_p: bool = True
    programs_per_sm: int = 2
    whole_wave: bool = True


def supports(q: torch.Tensor, kv: torch.Tensor, d_v: int) -> bool:
    """Return whether this kernel can run these inputs (sm_80+, bf16, at most 16 heads, 576/512 rows)."""
    return (
        q.device.type == "cuda"
        and torch.cuda.get_device_capability(q.device)[0] >= 8
        and q.dtype == kv.dtype == torch.bfloat16
        and q.shape[1] <= HEADS
        and q.shape[2] == D_LATENT.value + D_ROPE.value
        and d_v == D_LATENT.value
    )


@gluon.jit
def _pv_chunk(p_hi, p_lo, kn, o, C: gl.constexpr, dot_b: gl.constexpr, SPLIT_P: gl.constexpr):
    """o += p·V for latent columns [128·C, 128·C + 128) of the tile (V read from shared memory once for both parts)."""
    v = kn.slice(C * 128, 128, dim=1).load(dot_b)
    o = mma_v2(p_hi, v, o)
    if SPLIT_P:
        o = mma_v2(p_lo, v, o)
    return o


@gluon.jit
def _store_chunk(o, inv, C: gl.constexpr, heads, hmask, pid_b, pid_s, H, out_ptr, part_ptr, NUM_SPLITS: gl.constexpr,
                 DIRECT: gl.constexpr, layout: gl.constexpr):  # fmt: skip
    """Write columns [128·C, 128·C + 128) of the normalized output: to out (DIRECT) or to this split's partial."""
    cols = C * 128 + gl.arange(0, 128, layout=gl.SliceLayout(0, layout))
    o = o * inv[:, None]
    mask = hmask[:, None] & (cols[None, :] < D_LATENT)
    if DIRECT:
        gl.store(out_ptr + (pid_b * H + heads[:, None]) * D_LATENT + cols[None, :], o.to(gl.bfloat16), mask=mask)
    else:
        slot = (pid_b * H + heads) * NUM_SPLITS + pid_s
        gl.store(part_ptr + slot[:, None] * D_LATENT + cols[None, :], o, mask=mask)


@gluon.jit
def load_q(q_ptr, pid_b, stride_qb, stride_qh, H, BLOCK_H: gl.constexpr, lat_layout: gl.constexpr,
           rope_layout: gl.constexpr):  # fmt: skip
    """Row ``pid_b``'s query heads (rows past H read zeros): (latent part [BLOCK_H, 512], rope part [BLOCK_H, 64])."""
    heads = gl.arange(0, BLOCK_H, layout=gl.SliceLayout(1, lat_layout))
    hm = heads < H
    q_row = q_ptr + pid_b * stride_qb + heads[:, None] * stride_qh
    qn = gl.load(q_row + gl.arange(0, D_LATENT, layout=gl.SliceLayout(0, lat_layout))[None, :], mask=hm[:, None])
    r_heads = gl.arange(0, BLOCK_H, layout=gl.SliceLayout(1, rope_layout))
    qr_row = q_ptr + pid_b * stride_qb + r_heads[:, None] * stride_qh + D_LATENT
    qr = gl.load(qr_row + gl.arange(0, D_ROPE, layout=gl.SliceLayout(0, rope_layout))[None, :],
                 mask=(r_heads < H)[:, None])  # fmt: skip
    return qn, qr


@gluon.jit
def start_state(BLOCK_H: gl.constexpr, mma: gl.constexpr):
    """The online softmax's starting state: (max, sum, the four 128-column output accumulators)."""
    m_i = gl.full([BLOCK_H], -1.0e30, gl.float32, layout=gl.SliceLayout(1, mma))
    l_i = gl.zeros([BLOCK_H], gl.float32, layout=gl.SliceLayout(1, mma))
    o0 = gl.zeros([BLOCK_H, 128], gl.float32, layout=mma)
    o1 = gl.zeros([BLOCK_H, 128], gl.float32, layout=mma)
    o2 = gl.zeros([BLOCK_H, 128], gl.float32, layout=mma)
    o3 = gl.zeros([BLOCK_H, 128], gl.float32, layout=mma)
    return m_i, l_i, o0, o1, o2, o3


@gluon.jit
def tile_step(qn_smem, qr_smem, kn, kr, idx, N, scale, m_i, l_i, o0, o1, o2, o3, BLOCK_H: gl.constexpr,
              BLOCK_N: gl.constexpr, mma: gl.constexpr, dot_a: gl.constexpr, dot_b: gl.constexpr,
              SPLIT_P: gl.constexpr):  # fmt: skip
    """One landed bf16 tile (latent ``kn``, rope ``kr`` in shared memory): q·K, the online softmax, o += p·V.

    Returns the new (m_i, l_i, o0, o1, o2, o3). The bf16 and FP8 kernels share it (the FP8 one dequantises first).
    """
    s = gl.zeros([BLOCK_H, BLOCK_N], gl.float32, layout=mma)
    for c in gl.static_range(D_LATENT // 64):
        a = qn_smem.slice(c * 64, 64, dim=1).load(dot_a)
        b = kn.slice(c * 64, 64, dim=1).permute((1, 0)).load(dot_b)
        s = mma_v2(a, b, s)
    s = mma_v2(qr_smem.load(dot_a), kr.permute((1, 0)).load(dot_b), s)
    valid = (idx >= 0) & (idx < N)
    s = gl.where(valid[None, :], s * scale, float("-inf"))
    m_new = gl.maximum(m_i, gl.max(s, axis=1))
    alpha = gl.exp2(m_i - m_new)
    p = gl.exp2(s - m_new[:, None])
    l_i = l_i * alpha + gl.sum(p, axis=1)
    m_i = m_new
    p_hi = p.to(gl.bfloat16)
    p_lo = (p - p_hi.to(gl.float32)).to(gl.bfloat16)
    p_hi = gl.convert_layout(p_hi, dot_a)
    p_lo = gl.convert_layout(p_lo, dot_a)
    o0 = _pv_chunk(p_hi, p_lo, kn, o0 * alpha[:, None], 0, dot_b, SPLIT_P)
    o1 = _pv_chunk(p_hi, p_lo, kn, o1 * alpha[:, None], 1, dot_b, SPLIT_P)
    o2 = _pv_chunk(p_hi, p_lo, kn, o2 * alpha[:, None], 2, dot_b, SPLIT_P)
    o3 = _pv_chunk(p_hi, p_lo, kn, o3 * alpha[:, None], 3, dot_b, SPLIT_P)
    return m_i, l_i, o0, o1, o2, o3


@gluon.jit
def finish(m_i, l_i, o0, o1, o2, o3, pid_b, pid_s, H, out_ptr, lse_ptr, part_ptr, plse_ptr, NUM_SPLITS: gl.constexpr,
           DIRECT: gl.constexpr, BLOCK_H: gl.constexpr, mma: gl.constexpr):  # fmt: skip
    """Normalise and store the output and lse: to out (DIRECT) or to this split's partial."""
    ok = l_i > 0.0
    inv = 1.0 / gl.where(ok, l_i, 1.0)
    lse2 = gl.where(ok, m_i + gl.log2(gl.where(ok, l_i, 1.0)), float("-inf"))
    o_heads = gl.arange(0, BLOCK_H, layout=gl.SliceLayout(1, mma))
    o_hm = o_heads < H
    _store_chunk(o0, inv, 0, o_heads, o_hm, pid_b, pid_s, H, out_ptr, part_ptr, NUM_SPLITS, DIRECT, mma)
    _store_chunk(o1, inv, 1, o_heads, o_hm, pid_b, pid_s, H, out_ptr, part_ptr, NUM_SPLITS, DIRECT, mma)
    _store_chunk(o2, inv, 2, o_heads, o_hm, pid_b, pid_s, H, out_ptr, part_ptr, NUM_SPLITS, DIRECT, mma)
    _store_chunk(o3, inv, 3, o_heads, o_hm, pid_b, pid_s, H, out_ptr, part_ptr, NUM_SPLITS, DIRECT, mma)
    if DIRECT:
        gl.store(lse_ptr + pid_b * H + o_heads, lse2 * 0.6931471805599453, mask=o_hm)
    else:
        gl.store(plse_ptr + (pid_b * H + o_heads) * NUM_SPLITS + pid_s, lse2, mask=o_hm)


@gluon.jit
def _mmasync_decode_kernel(
    q_ptr, kv_ptr, idx_ptr, out_ptr, lse_ptr, part_ptr, plse_ptr, scale_log2, H, N, K,
    stride_qb, stride_qh, stride_kv, stride_ib,
    TILES_PER_SPLIT: gl.constexpr, NUM_SPLITS: gl.constexpr, BLOCK_N: gl.constexpr, NUM_BUF: gl.constexpr,
    DIRECT: gl.constexpr, SPLIT_P: gl.constexpr,
):  # fmt: skip
    """One (row, split): online softmax over the split's tiles, both products on mma.sync from shared memory."""
    BLOCK_H: gl.constexpr = 16
    pid_b = gl.program_id(0)
    pid_s = gl.program_id(1)

    # The four warps split the columns of every product: the tile's rows for q·K, 32 of each 128 latent for p·V.
    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[1, 4], instr_shape=[16, 8])
    dot_a: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma, k_width=2)
    dot_b: gl.constexpr = gl.DotOperandLayout(operand_index=1, parent=mma, k_width=2)
    lat_layout: gl.constexpr = gl.BlockedLayout([1, 8], [1, 32], [4, 1], [1, 0])
    rope_layout: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])
    row_layout: gl.constexpr = gl.SliceLayout(1, lat_layout)
    sl: gl.constexpr = gl.SwizzledSharedLayout(vec=8, per_phase=1, max_phase=8, order=[1, 0])
    kn_bufs = gl.allocate_shared_memory(gl.bfloat16, [NUM_BUF, BLOCK_N, D_LATENT], sl)
    kr_bufs = gl.allocate_shared_memory(gl.bfloat16, [NUM_BUF, BLOCK_N, D_ROPE], sl)

    first = pid_s * TILES_PER_SPLIT * BLOCK_N
    end = gl.minimum(K, first + TILES_PER_SPLIT * BLOCK_N)
    for i in gl.static_range(NUM_BUF - 1):
        idx_i = tile_indices(idx_ptr, pid_b, stride_ib, end, first + i * BLOCK_N, BLOCK_N, row_layout)
        gather_tile(kn_bufs, kr_bufs, i, kv_ptr, idx_i, stride_kv, N, lat_layout, rope_layout)
    # The next gather's indices, loaded a tile ahead so the gather's issue does not wait on them.
    idx_next = tile_indices(idx_ptr, pid_b, stride_ib, end, first + (NUM_BUF - 1) * BLOCK_N, BLOCK_N, row_layout)

    qn, qr = load_q(q_ptr, pid_b, stride_qb, stride_qh, H, BLOCK_H, lat_layout, rope_layout)
    qn_smem = gl.allocate_shared_memory(gl.bfloat16, [BLOCK_H, D_LATENT], sl, qn.to(gl.bfloat16))
    qr_smem = gl.allocate_shared_memory(gl.bfloat16, [BLOCK_H, D_ROPE], sl, qr.to(gl.bfloat16))

    scale = scale_log2.to(gl.float32)
    m_i, l_i, o0, o1, o2, o3 = start_state(BLOCK_H, mma)
    s_cols = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, mma))
    for t in range(TILES_PER_SPLIT):
        buf = t % NUM_BUF
        cta_barrier()
        gather_tile(kn_bufs, kr_bufs, (t + NUM_BUF - 1) % NUM_BUF, kv_ptr, idx_next, stride_kv, N, lat_layout,
                    rope_layout)  # fmt: skip
        idx_next = tile_indices(idx_ptr, pid_b, stride_ib, end, first + (t + NUM_BUF) * BLOCK_N, BLOCK_N, row_layout)
        pos = first + t * BLOCK_N + s_cols
        idx = gl.load(idx_ptr + pid_b * stride_ib + pos, mask=pos < end, other=-1)
        async_copy.wait_group(NUM_BUF - 1)
        cta_barrier()
        kn = kn_bufs.index(buf)
        kr = kr_bufs.index(buf)
        m_i, l_i, o0, o1, o2, o3 = tile_step(qn_smem, qr_smem, kn, kr, idx, N, scale, m_i, l_i, o0, o1, o2, o3,
                                             BLOCK_H, BLOCK_N, mma, dot_a, dot_b, SPLIT_P)  # fmt: skip
    async_copy.wait_group(0)
    finish(m_i, l_i, o0, o1, o2, o3, pid_b, pid_s, H, out_ptr, lse_ptr, part_ptr, plse_ptr, NUM_SPLITS, DIRECT,
           BLOCK_H, mma)  # fmt: skip


def plan(
    q: torch.Tensor, k: int, cfg: SyncConfig | None = None, num_splits: int | None = None, slots: int | None = None
) -> SplitPlan:
    """The split plan for q's shape and K indices: B programs, split until ``cfg.programs_per_sm`` per SM.

    ``slots`` is the SM count to plan for (default: q's device's; the offline compile report passes 132).
    """
    cfg = cfg or SyncConfig()
    return plan_splits(q, k, cfg.block_n, q.shape[0], num_splits, cfg.programs_per_sm, cfg.whole_wave, slots)


def decode(
    q: torch.Tensor,
    kv: torch.Tensor,
    indices: torch.Tensor,
    sm_scale: float,
    d_v: int,
    *,
    config: SyncConfig | None = None,
    num_splits: int | None = None,
    out: torch.Tensor | None = None,
    lse: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Run the kernel (and the merge when the top-k axis is split); return (out, lse) as the contract says.

    Raises ValueError for inputs the kernel does not take (see ``supports``).
    """
    if not supports(q, kv, d_v):
        raise ValueError(
            "the mma.sync kernel needs an sm_80+ GPU, bf16 q and kv, at most 16 heads and 576-wide rows with d_v 512; "
            f"got {q.device}, {q.dtype}/{kv.dtype}, q {tuple(q.shape)}, d_v {d_v}"
        )
    return launcher.decode(plan, _launch, q, kv, indices, sm_scale, d_v, config or SyncConfig(), num_splits, out, lse)


def _launch(
    q: torch.Tensor,
    kv: torch.Tensor,
    indices: torch.Tensor,
    sm_scale: float,
    d_v: int,
    cfg: SyncConfig,
    plan: SplitPlan,
    out: torch.Tensor,
    lse: torch.Tensor,
    part: torch.Tensor,
    plse: torch.Tensor,
) -> Any:
    """Launch the split kernel; return Triton's compiled-kernel handle (``d_v`` is 512, as ``supports`` checked)."""
    b, h, _ = q.shape
    return _mmasync_decode_kernel[(b, plan.num_splits)](
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
    config: SyncConfig | None = None,
    num_splits: int | None = None,
) -> dict[str, Any]:
    """Compile and run the kernel for these inputs; the keys of ``mla_kernels.mma.matrix_instructions``."""
    return launcher.matrix_instructions(
        plan, _launch, q, kv, indices, sm_scale, d_v, config or SyncConfig(), num_splits
    )
