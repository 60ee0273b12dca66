"""The portable FP8-cache step: one Triton kernel that gathers the selected cache rows and dequantises them to bf16.

``mla_kernels.fp8cache`` runs it where no FP8-reading decode kernel fits (64k heads, other widths, other GPUs, the
CPU interpreter), then the bf16 ``mma`` backend over its output. Row ``r`` of the output is index ``r`` of the
flattened ``[B, K]`` indices; an unused index writes zeros.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from mla_kernels.device import interpreting, require_triton_device


@triton.jit
def _gather_kernel(
    c8_ptr, c32_ptr, c16_ptr, idx_ptr, out_ptr, N, TOTAL, stride8,
    D_V: tl.constexpr, D_ROPE: tl.constexpr, TILE: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_V: tl.constexpr,
    BLOCK_ROPE: tl.constexpr, VIA_FP32: tl.constexpr,
):  # fmt: skip
    """Rows [BLOCK_R·pid, +BLOCK_R) of the flattened indices: latent = e4m3 · its tile's scale, rope copied."""
    r = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    live = r < TOTAL
    idx = tl.load(idx_ptr + r, mask=live, other=-1)
    ok = live & (idx >= 0) & (idx < N)
    row = tl.where(ok, idx, 0).to(tl.int64)
    d_qk: tl.constexpr = D_V + D_ROPE
    tiles: tl.constexpr = D_V // TILE
    cols = tl.arange(0, BLOCK_V)
    cm = cols < D_V
    raw = tl.load(c8_ptr + row[:, None] * stride8 + cols[None, :], mask=ok[:, None] & cm[None, :], other=0)
    if VIA_FP32:
        # The interpreter has no e4m3 type: decode the bits by hand (sign, 4-bit exponent with bias 7, 3-bit
        # mantissa; subnormals below exponent 1). 0x7F/0xFF (NaN) never occur in a quantised cache.
        bits = raw.to(tl.int32)
        sign = tl.where((bits & 0x80) != 0, -1.0, 1.0)
        e = (bits >> 3) & 0xF
        m = (bits & 0x7).to(tl.float32)
        mag = tl.where(e == 0, m * 0.001953125, (8.0 + m) * tl.exp2((e - 10).to(tl.float32)))
        lat = sign * mag
    else:
        lat = raw.to(tl.float8e4nv, bitcast=True).to(tl.float32)
    scale = tl.load(c32_ptr + row[:, None] * (stride8 // 4) + D_V // 4 + cols[None, :] // TILE,
                    mask=ok[:, None] & cm[None, :], other=0.0)  # fmt: skip
    out_row = out_ptr + r.to(tl.int64)[:, None] * d_qk
    tl.store(out_row + cols[None, :], (lat * scale).to(tl.bfloat16), mask=live[:, None] & cm[None, :])
    rc = tl.arange(0, BLOCK_ROPE)
    rm = rc < D_ROPE
    rope_at = (D_V + 4 * tiles) // 2
    rope = tl.load(c16_ptr + row[:, None] * (stride8 // 2) + rope_at + rc[None, :], mask=ok[:, None] & rm[None, :],
                   other=0.0)  # fmt: skip
    tl.store(out_row + D_V + rc[None, :], rope, mask=live[:, None] & rm[None, :])


def gather(cache: torch.Tensor, indices: torch.Tensor, d_v: int, d_rope: int) -> torch.Tensor:
    """``[B·K, d_v + d_rope]`` bf16: the dequantised cache rows that ``indices`` select (zeros where unused)."""
    from mla_kernels.fp8cache import tile_width

    require_triton_device(cache)
    if cache.shape[1] % 4:
        raise ValueError(f"FP8 cache rows must be a multiple of 4 bytes wide, got {cache.shape[1]}")
    cache = cache.contiguous()
    idx = indices.contiguous().view(-1)
    total = idx.numel()
    out = torch.empty((total, d_v + d_rope), dtype=torch.bfloat16, device=cache.device)
    block_r = 16
    grid = (triton.cdiv(total, block_r),)
    if total:
        _gather_kernel[grid](
            cache, cache.view(torch.float32), cache.view(torch.bfloat16), idx, out, cache.shape[0], total,
            cache.stride(0), D_V=d_v, D_ROPE=d_rope, TILE=tile_width(d_v), BLOCK_R=block_r,
            BLOCK_V=triton.next_power_of_2(d_v), BLOCK_ROPE=triton.next_power_of_2(d_rope), VIA_FP32=interpreting(),
        )  # fmt: skip
    return out
