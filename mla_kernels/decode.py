"""The public sparse-MLA decode entry point: input checks, then one backend.

Checks look only at shapes, dtypes and devices (host metadata), never at tensor values, so the call stays free of
host syncs and data-dependent shapes under CUDA graphs and torch.compile. Index values are handled inside each
backend: -1, or anything outside [0, N), marks an unused slot that contributes nothing.
"""

from __future__ import annotations

import torch

BACKENDS = ("torch", "simt", "simt-tiled", "mma")
ROPE_DIM = 64  # DeepSeek's rope part; d_v=None means D_qk - ROPE_DIM.
_FLOAT_DTYPES = (torch.bfloat16, torch.float32)


def resolve_d_v(d_qk: int, d_v: int | None) -> int:
    """Return the latent width D_v for a row of width ``d_qk`` (None: D_qk - 64)."""
    if d_v is None:
        d_v = d_qk - ROPE_DIM
    if not 0 < d_v <= d_qk:
        raise ValueError(f"d_v must be in (0, D_qk={d_qk}], got {d_v}")
    return d_v


def check_inputs(q: torch.Tensor, kv: torch.Tensor, indices: torch.Tensor) -> None:
    """Raise ValueError with a plain message when shapes, dtypes or devices do not fit the contract."""
    if q.dim() != 3:
        raise ValueError(f"q must be [B, H, D_qk], got shape {tuple(q.shape)}")
    if kv.dim() != 2:
        raise ValueError(f"kv must be [N, D_qk], got shape {tuple(kv.shape)}")
    if indices.dim() != 2:
        raise ValueError(f"indices must be [B, K], got shape {tuple(indices.shape)}")
    b, _, d_qk = q.shape
    if kv.shape[1] != d_qk:
        raise ValueError(f"q has D_qk={d_qk} but kv rows have {kv.shape[1]} values")
    if indices.shape[0] != b:
        raise ValueError(f"q has B={b} rows but indices has {indices.shape[0]}")
    if q.dtype not in _FLOAT_DTYPES or kv.dtype not in _FLOAT_DTYPES:
        raise ValueError(f"q and kv must be bfloat16 or float32, got {q.dtype} and {kv.dtype}")
    if indices.dtype != torch.int32:
        raise ValueError(f"indices must be int32, got {indices.dtype}")
    if not (q.device == kv.device == indices.device):
        raise ValueError(f"q, kv and indices must be on one device, got {q.device}, {kv.device}, {indices.device}")


def sparse_mla_decode(
    q: torch.Tensor,
    kv: torch.Tensor,
    indices: torch.Tensor,
    sm_scale: float,
    backend: str = "torch",
    *,
    d_v: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Attend each query row over the KV rows its indices select; return (out [B, H, D_v], lse [B, H] fp32).

    q is [B, H, D_qk]; kv is the pool [N, D_qk] whose first D_v values are the latent (also used as V) and the rest
    the rope part; indices is [B, K] int32 with -1 for unused slots. lse is the natural-log sum of exp(sm_scale·q·k)
    over the valid slots; a row with no valid slot gives out 0 and lse -inf.
    """
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; choose one of {', '.join(BACKENDS)}")
    check_inputs(q, kv, indices)
    d_v = resolve_d_v(q.shape[2], d_v)
    # Plain imports (not importlib) so torch.compile can trace the call with fullgraph=True; the Triton modules load
    # on first use, after a CPU caller has had the chance to set TRITON_INTERPRET.
    if backend == "torch":
        from mla_kernels import reference as impl
    elif backend == "simt":
        from mla_kernels import simt as impl
    elif backend == "simt-tiled":
        from mla_kernels import simt_tiled as impl
    else:
        from mla_kernels import mma as impl
    out, lse = impl.decode(q, kv, indices, float(sm_scale), d_v)
    return out, lse
