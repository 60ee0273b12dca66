"""The FP8 KV cache in DeepSeek-V3.2's layout: quantise, dequantise, and sparse-MLA decode reading it (issue 32).

One row per token, ``d_v + 4·tiles + 2·d_rope`` bytes: the latent as FP8 e4m3 values, one fp32 scale per tile of
128 latent values (a power of two, as FlashMLA's ``quantize_k_cache`` rounds it: UE8M0), then the rope part kept in
bf16. At DeepSeek's 512 + 64 that is 512 + 16 + 128 = 656 bytes against 1,152 for a bf16 row, the layout FlashMLA's
sparse decode calls ``V32``. A latent narrower than 128 is one tile. Because every scale is a power of two, a
dequantised value (e4m3 · 2^k) is exact in bf16: the reference for the kernels is the bf16 decode over
``dequantize(cache)``.

``decode(q, cache, indices, sm_scale, backend, d_v=...)``:

- ``torch``: gather the selected rows, dequantise them, then ``mla_kernels.reference``;
- ``mma``: on an sm_80+ GPU with bf16 q, at most 16 heads and 512 + 64 rows, the Gluon mma.sync kernel that reads the
  FP8 rows itself (``mla_kernels.mmasync_fp8``); otherwise (64k heads, other widths, the CPU interpreter) a Triton
  kernel dequantises the selected rows into a per-call bf16 buffer and the bf16 ``mma`` backend runs on it. That
  path moves the FP8 bytes once plus the bf16 buffer written and read again, so it saves no traffic: it is the
  portable, correct path, not the fast one.

The indexer is not part of this: DeepSeek-V3.2's indexer keeps its own FP8 key cache (128 e4m3 values and one fp32
scale per token, 132 bytes), which ``mla_kernels.indexer`` already reads; it never reads the MLA cache.
"""

from __future__ import annotations

from typing import Any

import torch

FP8_MAX = 448.0  # largest finite float8_e4m3fn
TILE = 128  # latent values per scale, DeepSeek-V3.2's tile
ROPE_DIM = 64


def tile_width(d_v: int) -> int:
    """The latent values per scale for latent width ``d_v`` (128, or the whole latent when narrower)."""
    tile = min(TILE, d_v)
    if d_v % tile:
        raise ValueError(f"the FP8 cache needs a latent width that is a multiple of {TILE} or below it, got {d_v}")
    return tile


def row_bytes(d_v: int, d_rope: int = ROPE_DIM) -> int:
    """Bytes of one cache row: latent e4m3, one fp32 scale per tile, rope bf16 (656 at 512 + 64)."""
    return d_v + 4 * (d_v // tile_width(d_v)) + 2 * d_rope


def quantize(kv: torch.Tensor, d_v: int | None = None) -> torch.Tensor:
    """``[N, d_v + d_rope]`` bf16/fp32 rows -> ``[N, row_bytes]`` uint8 cache rows (FlashMLA's V32 rounding)."""
    n, d_qk = kv.shape
    d_v = d_qk - ROPE_DIM if d_v is None else d_v
    d_rope = d_qk - d_v
    tile = tile_width(d_v)
    tiles = d_v // tile
    out = torch.empty((n, row_bytes(d_v, d_rope)), dtype=torch.uint8, device=kv.device)
    lat = kv[:, :d_v].float().view(n, tiles, tile)
    amax = lat.abs().amax(dim=-1) / FP8_MAX
    scale = torch.pow(2.0, torch.clamp_min(amax, 1e-4).log2().ceil())  # UE8M0: a power of two
    values = (lat / scale[..., None]).to(torch.float8_e4m3fn)
    out[:, :d_v] = values.view(n, d_v).view(torch.uint8)
    out[:, d_v : d_v + 4 * tiles] = scale.float().contiguous().view(torch.uint8).view(n, 4 * tiles)
    out[:, d_v + 4 * tiles :] = kv[:, d_v:].to(torch.bfloat16).contiguous().view(torch.uint8).view(n, 2 * d_rope)
    return out


def split_row(d_qk: int, nbytes: int) -> tuple[int, int]:
    """(d_v, tiles) of a cache whose rows are ``nbytes`` wide and decode to ``d_qk`` values; ValueError if none fits."""
    for d_v in range(d_qk - 1, 0, -1):
        if (d_v <= TILE or d_v % TILE == 0) and row_bytes(d_v, d_qk - d_v) == nbytes:
            return d_v, d_v // tile_width(d_v)
    raise ValueError(f"no latent width gives {nbytes}-byte FP8 rows for {d_qk}-wide queries")


def dequantize(cache: torch.Tensor, d_v: int, d_rope: int = ROPE_DIM) -> torch.Tensor:
    """``[N, row_bytes]`` uint8 -> ``[N, d_v + d_rope]`` bf16 rows (exact: every scale is a power of two)."""
    n = cache.shape[0]
    tile = tile_width(d_v)
    tiles = d_v // tile
    lat = cache[:, :d_v].contiguous().view(torch.float8_e4m3fn).float().view(n, tiles, tile)
    scale = cache[:, d_v : d_v + 4 * tiles].contiguous().view(torch.float32)
    out = torch.empty((n, d_v + d_rope), dtype=torch.bfloat16, device=cache.device)
    out[:, :d_v] = (lat * scale[..., None]).view(n, d_v).to(torch.bfloat16)
    out[:, d_v:] = cache[:, d_v + 4 * tiles :].contiguous().view(torch.bfloat16)
    return out


def check_inputs(q: torch.Tensor, cache: torch.Tensor, indices: torch.Tensor, d_v: int) -> None:
    """Raise ValueError with a plain message when the cache does not fit q, d_v or the layout."""
    if cache.dim() != 2 or cache.dtype != torch.uint8:
        raise ValueError(f"the FP8 cache must be [N, row bytes] uint8, got {tuple(cache.shape)} {cache.dtype}")
    if q.dim() != 3 or indices.dim() != 2 or indices.shape[0] != q.shape[0] or indices.dtype != torch.int32:
        raise ValueError(
            f"q must be [B, H, D_qk] and indices [B, K] int32, got {tuple(q.shape)} and {tuple(indices.shape)} "
            f"{indices.dtype}"
        )
    want = row_bytes(d_v, q.shape[2] - d_v)
    if cache.shape[1] != want:
        raise ValueError(f"q's D_qk {q.shape[2]} with d_v {d_v} needs {want}-byte rows, the cache has {cache.shape[1]}")
    if not (q.device == cache.device == indices.device):
        raise ValueError(
            f"q, cache and indices must be on one device, got {q.device}, {cache.device}, {indices.device}"
        )


def decode(
    q: torch.Tensor,
    cache: torch.Tensor,
    indices: torch.Tensor,
    sm_scale: float,
    backend: str = "torch",
    *,
    d_v: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sparse-MLA decode over FP8 cache rows: (out ``[B, H, d_v]`` in q's dtype, lse ``[B, H]`` fp32).

    The contract of ``mla_kernels.sparse_mla_decode`` with ``cache`` in place of ``kv``; backends ``torch`` and
    ``mma`` (see the module's docstring for what each runs).
    """
    d_v = q.shape[2] - ROPE_DIM if d_v is None else d_v
    check_inputs(q, cache, indices, d_v)
    if backend == "torch":
        rows, idx = gather_dequantized(cache, indices, d_v, triton_kernel=False)
        from mla_kernels import reference

        return reference.decode(q, rows, idx, sm_scale, d_v)
    if backend != "mma":
        raise ValueError(f"the FP8 cache runs on backends torch and mma, not {backend!r}")
    kernel = fp8_kernel(q, cache, d_v)
    if kernel is not None:
        return kernel.decode(q, cache, indices, sm_scale, d_v)
    rows, idx = gather_dequantized(cache, indices, d_v, triton_kernel=True)
    from mla_kernels import mma

    return mma.decode(q, rows.to(q.dtype), idx, sm_scale, d_v)


def fp8_kernel(q: torch.Tensor, cache: torch.Tensor, d_v: int) -> Any:
    """The Gluon module that reads these FP8 rows itself, or None: routed as ``mma.gluon_module`` routes bf16.

    Hopper only (the kernel was measured there; mma.sync would also run on sm_80 and Blackwell, untested), never
    while torch.compile traces, never with MLA_KERNELS_GLUON=0.
    """
    from mla_kernels import mma

    if q.device.type != "cuda" or torch.compiler.is_compiling() or not mma.gluon_enabled():
        return None
    if torch.cuda.get_device_capability(q.device)[0] != 9:
        return None
    try:
        from mla_kernels import mmasync_fp8
    except ImportError:
        return None
    return mmasync_fp8 if mmasync_fp8.supports(q, cache, d_v) else None


def kernel_name(q: torch.Tensor, cache: torch.Tensor, d_v: int) -> str:
    """Name what ``decode(..., "mma")`` runs for inputs like these: "mmasync_fp8", or "dequant+" the bf16 kernel's name.

    Only shapes, dtypes and the device matter (one-row tensors of the real widths answer for a whole server).
    """
    from mla_kernels import mma

    if fp8_kernel(q, cache, d_v) is not None:
        return "mmasync_fp8"
    rows = torch.empty((1, q.shape[2]), dtype=q.dtype, device=q.device)
    return "dequant+" + mma.kernel_name(q, rows, d_v)


def gather_dequantized(
    cache: torch.Tensor, indices: torch.Tensor, d_v: int, *, triton_kernel: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """The selected rows dequantised into ``[B·K, d_qk]`` bf16, and indices ``[B, K]`` into them (-1 kept).

    ``triton_kernel``: one Triton launch (GPU or interpreter); otherwise torch ops.
    """
    b, k = indices.shape
    n = cache.shape[0]
    valid = (indices >= 0) & (indices < n)
    flat = torch.arange(b * k, dtype=torch.int32, device=indices.device).view(b, k)
    idx = torch.where(valid, flat, torch.full_like(flat, -1))
    d_rope = _d_rope(cache, d_v)
    if not triton_kernel:
        safe = torch.where(valid, indices, torch.zeros_like(indices)).long().view(-1)
        return dequantize(cache[safe], d_v, d_rope), idx
    from mla_kernels import fp8gather

    return fp8gather.gather(cache, indices, d_v, d_rope), idx


def _d_rope(cache: torch.Tensor, d_v: int) -> int:
    tiles = d_v // tile_width(d_v)
    return (cache.shape[1] - d_v - 4 * tiles) // 2


def floor_bytes(b: int, h: int, k_valid: int, topk: int, d_v: int = 512, d_rope: int = ROPE_DIM) -> float:
    """Ideal HBM bytes of one FP8-cache decode: the rows, the int32 indices, bf16 q read and bf16 out written."""
    return float(b * (k_valid * row_bytes(d_v, d_rope) + topk * 4 + h * (2 * (d_v + d_rope) + 2 * d_v)))


def describe() -> dict[str, Any]:
    """The layout at DeepSeek's widths, for reports."""
    return {"row_bytes": row_bytes(512), "latent": "e4m3", "tile": TILE, "scale": "fp32 power of two", "rope": "bf16"}
