"""The Gluon mma.sync decode kernel for 16 heads over the FP8 cache (656-byte rows, ``mla_kernels.fp8cache``).

``mla_kernels.mmasync`` with the gather and one step changed: each tile's rows arrive by cp.async as their three
parts (512 e4m3 bytes, four fp32 scales, 64 bf16 rope values) into NUM_BUF raw buffers; once a tile has landed,
the four warps dequantise its latent into one bf16 buffer (e4m3 · scale, exact in bf16), and both products read that
buffer and the rope part as the bf16 kernel reads its tile. The bytes moved per row drop from 1,152 to 656; the
dequantisation is a shared-memory round trip per tile, on warps that wait on memory anyway at 16 heads.

Needs a GPU with mma.sync (sm_80+), bf16 q, at most 16 heads, 512 + 64 rows. No CPU interpreter.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy

from mla_kernels import launcher
from mla_kernels.fp8cache import row_bytes
from mla_kernels.launcher import launch_constexprs
from mla_kernels.merge import LOG2E, SplitPlan
from mla_kernels.mmasync import HEADS, NUM_WARPS, SyncConfig, finish, load_q, plan, start_state, tile_step
from mla_kernels.warpgroup import D_LATENT, D_ROPE, cta_barrier, tile_indices

ROW_BYTES = row_bytes(512)  # 656
SCALE_AT = gl.constexpr(512)  # byte offset of the four fp32 scales
ROPE_AT = gl.constexpr(528)  # byte offset of the bf16 rope part


@dataclass(frozen=True)
class Fp8Config(SyncConfig):
    """The mma.sync kernel's tile sizes, and how each landed tile is dequantised."""

    # e4m3 to bf16 and a bf16 multiply by the scale, instead of through fp32 (fewer instructions, same values).
    deq_bf16: bool = False


def supports(q: torch.Tensor, cache: torch.Tensor, d_v: int) -> bool:
    """Return whether this kernel can run these inputs (sm_80+, bf16 q, at most 16 heads, 656-byte rows)."""
    return (
        q.device.type == "cuda"
        and torch.cuda.get_device_capability(q.device)[0] >= 8
        and q.dtype == torch.bfloat16
        and cache.dtype == torch.uint8
        and q.shape[1] <= HEADS
        and q.shape[2] == D_LATENT.value + D_ROPE.value
        and d_v == D_LATENT.value
        and cache.shape[1] == ROW_BYTES
        and cache.stride(0) % 16 == 0
    )


@gluon.jit
def _gather_fp8(k8_bufs, sc_bufs, kr_bufs, buf, c8_ptr, c32_ptr, c16_ptr, idx, stride8, N,
                lat_layout: gl.constexpr, sc_layout: gl.constexpr, rope_layout: gl.constexpr):  # fmt: skip
    """cp.async one tile's rows (e4m3 latent, scales, bf16 rope) into buffer ``buf``; commit them as one group."""
    valid = (idx >= 0) & (idx < N)
    rows = gl.where(valid, idx, 0).to(gl.int64)
    r = gl.convert_layout(rows, gl.SliceLayout(1, lat_layout))
    v = gl.convert_layout(valid, gl.SliceLayout(1, lat_layout))
    cols = gl.arange(0, D_LATENT, layout=gl.SliceLayout(0, lat_layout))
    off = gl.multiple_of(r * stride8, 16)
    async_copy.async_copy_global_to_shared(k8_bufs.index(buf), c8_ptr + off[:, None] + cols[None, :], mask=v[:, None])
    r = gl.convert_layout(rows, gl.SliceLayout(1, sc_layout))
    v = gl.convert_layout(valid, gl.SliceLayout(1, sc_layout))
    cols = gl.arange(0, 4, layout=gl.SliceLayout(0, sc_layout))
    off = gl.multiple_of(r * (stride8 // 4) + SCALE_AT // 4, 4)
    async_copy.async_copy_global_to_shared(sc_bufs.index(buf), c32_ptr + off[:, None] + cols[None, :], mask=v[:, None])
    r = gl.convert_layout(rows, gl.SliceLayout(1, rope_layout))
    v = gl.convert_layout(valid, gl.SliceLayout(1, rope_layout))
    cols = gl.arange(0, D_ROPE, layout=gl.SliceLayout(0, rope_layout))
    off = gl.multiple_of(r * (stride8 // 2) + ROPE_AT // 2, 8)
    async_copy.async_copy_global_to_shared(kr_bufs.index(buf), c16_ptr + off[:, None] + cols[None, :], mask=v[:, None])
    async_copy.commit_group()


@gluon.jit
def _dequant_tile(k8, sc, kn, BLOCK_N: gl.constexpr, deq_layout: gl.constexpr, sc_layout: gl.constexpr,
                  DEQ_BF16: gl.constexpr):  # fmt: skip
    """kn[:, 128·c + j] = e4m3(k8[:, 128·c + j]) · sc[:, c] for the four 128-wide tiles of one landed KV tile.

    DEQ_BF16: convert e4m3 to bf16 and multiply in bf16 (exact: the scale is a power of two); else through fp32.
    """
    # Scales read with the rows where deq_layout has them (lane // 8, warp), so no exchange between threads.
    sc_rows: gl.constexpr = gl.BlockedLayout([1, 4], [4, 8], [4, 1], [1, 0])
    scales = sc.load(sc_rows)
    cols = gl.arange(0, 4, layout=gl.SliceLayout(0, sc_rows))
    for c in gl.static_range(4):
        s_c = gl.convert_layout(
            gl.sum(gl.where(cols[None, :] == c, scales, 0.0), axis=1), gl.SliceLayout(1, deq_layout)
        )
        raw = k8.slice(c * 128, 128, dim=1).load(deq_layout)
        if DEQ_BF16:
            lat = raw.to(gl.float8e4nv, bitcast=True).to(gl.bfloat16) * s_c.to(gl.bfloat16)[:, None]
        else:
            lat = raw.to(gl.float8e4nv, bitcast=True).to(gl.float32) * s_c[:, None]
        kn.slice(c * 128, 128, dim=1).store(lat.to(gl.bfloat16))


@gluon.jit
def _mmasync_fp8_kernel(
    q_ptr, c8_ptr, c32_ptr, c16_ptr, idx_ptr, out_ptr, lse_ptr, part_ptr, plse_ptr, scale_log2, H, N, K,
    stride_qb, stride_qh, stride8, stride_ib,
    TILES_PER_SPLIT: gl.constexpr, NUM_SPLITS: gl.constexpr, BLOCK_N: gl.constexpr, NUM_BUF: gl.constexpr,
    DIRECT: gl.constexpr, SPLIT_P: gl.constexpr, DEQ_BF16: gl.constexpr,
):  # fmt: skip
    """One (row, split) over FP8 rows: gather raw, dequantise each landed tile once, then mmasync's products."""
    BLOCK_H: gl.constexpr = 16
    pid_b = gl.program_id(0)
    pid_s = gl.program_id(1)

    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[1, 4], instr_shape=[16, 8])
    dot_a: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma, k_width=2)
    dot_b: gl.constexpr = gl.DotOperandLayout(operand_index=1, parent=mma, k_width=2)
    lat8_layout: gl.constexpr = gl.BlockedLayout([1, 16], [1, 32], [4, 1], [1, 0])
    sc_layout: gl.constexpr = gl.BlockedLayout([1, 4], [32, 1], [4, 1], [1, 0])
    rope_layout: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])
    deq_layout: gl.constexpr = gl.BlockedLayout([1, 16], [4, 8], [4, 1], [1, 0])
    lat_layout: gl.constexpr = gl.BlockedLayout([1, 8], [1, 32], [4, 1], [1, 0])
    row_layout: gl.constexpr = gl.SliceLayout(1, lat8_layout)
    sl: gl.constexpr = gl.SwizzledSharedLayout(vec=8, per_phase=1, max_phase=8, order=[1, 0])
    raw_sl: gl.constexpr = gl.SwizzledSharedLayout(vec=16, per_phase=1, max_phase=8, order=[1, 0])
    flat: gl.constexpr = gl.SwizzledSharedLayout(vec=1, per_phase=1, max_phase=1, order=[1, 0])
    k8_bufs = gl.allocate_shared_memory(gl.uint8, [NUM_BUF, BLOCK_N, D_LATENT], raw_sl)
    sc_bufs = gl.allocate_shared_memory(gl.float32, [NUM_BUF, BLOCK_N, 4], flat)
    kr_bufs = gl.allocate_shared_memory(gl.bfloat16, [NUM_BUF, BLOCK_N, D_ROPE], sl)
    kn = gl.allocate_shared_memory(gl.bfloat16, [BLOCK_N, D_LATENT], sl)

    first = pid_s * TILES_PER_SPLIT * BLOCK_N
    end = gl.minimum(K, first + TILES_PER_SPLIT * BLOCK_N)
    for i in gl.static_range(NUM_BUF - 1):
        idx_i = tile_indices(idx_ptr, pid_b, stride_ib, end, first + i * BLOCK_N, BLOCK_N, row_layout)
        _gather_fp8(k8_bufs, sc_bufs, kr_bufs, i, c8_ptr, c32_ptr, c16_ptr, idx_i, stride8, N, lat8_layout,
                    sc_layout, rope_layout)  # fmt: skip
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
        _gather_fp8(k8_bufs, sc_bufs, kr_bufs, (t + NUM_BUF - 1) % NUM_BUF, c8_ptr, c32_ptr, c16_ptr, idx_next,
                    stride8, N, lat8_layout, sc_layout, rope_layout)  # fmt: skip
        idx_next = tile_indices(idx_ptr, pid_b, stride_ib, end, first + (t + NUM_BUF) * BLOCK_N, BLOCK_N, row_layout)
        pos = first + t * BLOCK_N + s_cols
        idx = gl.load(idx_ptr + pid_b * stride_ib + pos, mask=pos < end, other=-1)
        async_copy.wait_group(NUM_BUF - 1)
        cta_barrier()
        _dequant_tile(k8_bufs.index(buf), sc_bufs.index(buf), kn, BLOCK_N, deq_layout, sc_layout, DEQ_BF16)
        cta_barrier()
        kr = kr_bufs.index(buf)
        m_i, l_i, o0, o1, o2, o3 = tile_step(qn_smem, qr_smem, kn, kr, idx, N, scale, m_i, l_i, o0, o1, o2, o3,
                                             BLOCK_H, BLOCK_N, mma, dot_a, dot_b, SPLIT_P)  # fmt: skip
    async_copy.wait_group(0)
    finish(m_i, l_i, o0, o1, o2, o3, pid_b, pid_s, H, out_ptr, lse_ptr, part_ptr, plse_ptr, NUM_SPLITS, DIRECT,
           BLOCK_H, mma)  # fmt: skip


def decode(
    q: torch.Tensor,
    cache: torch.Tensor,
    indices: torch.Tensor,
    sm_scale: float,
    d_v: int,
    *,
    config: Fp8Config | None = None,
    num_splits: int | None = None,
    out: torch.Tensor | None = None,
    lse: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Run the kernel (and the merge when split); return (out, lse). ValueError for inputs it cannot run."""
    if not supports(q, cache, d_v):
        raise ValueError(
            "the FP8 mma.sync kernel needs an sm_80+ GPU, bf16 q, at most 16 heads and 656-byte cache rows with d_v "
            f"512; got {q.device}, {q.dtype}/{cache.dtype}, q {tuple(q.shape)}, cache {tuple(cache.shape)}, d_v {d_v}"
        )
    return launcher.decode(plan, _launch, q, cache, indices, sm_scale, d_v, config or Fp8Config(), num_splits, out, lse)


def _launch(
    q: torch.Tensor,
    cache: torch.Tensor,
    indices: torch.Tensor,
    sm_scale: float,
    d_v: int,
    cfg: Fp8Config,
    plan: SplitPlan,
    out: torch.Tensor,
    lse: torch.Tensor,
    part: torch.Tensor,
    plse: torch.Tensor,
) -> Any:
    """Launch the split kernel over the cache's three typed views; return Triton's compiled-kernel handle."""
    b, h, _ = q.shape
    return _mmasync_fp8_kernel[(b, plan.num_splits)](
        q, cache, cache.view(torch.float32), cache.view(torch.bfloat16), indices, out, lse, part, plse,
        sm_scale * LOG2E, h, cache.shape[0], indices.shape[1], q.stride(0), q.stride(1), cache.stride(0),
        indices.stride(0), **launch_constexprs(cfg, plan), DEQ_BF16=cfg.deq_bf16, num_warps=NUM_WARPS,
    )  # fmt: skip
