"""The torch reference for sparse MLA decode: gather the selected rows, then plain math in fp32 (or float64)."""

from __future__ import annotations

import torch


def decode(
    q: torch.Tensor,
    kv: torch.Tensor,
    indices: torch.Tensor,
    sm_scale: float,
    d_v: int,
    *,
    compute_dtype: torch.dtype = torch.float32,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Return (out [B, H, d_v] in q's dtype, lse [B, H] fp32), computing in ``compute_dtype``.

    Everything is shape-static: unused slots are clamped to row 0 for the gather and masked out of the softmax, so
    there is no host sync and no data-dependent shape (safe under CUDA graphs and torch.compile).
    """
    b, _, d_qk = q.shape
    n, k = kv.shape[0], indices.shape[1]
    valid = (indices >= 0) & (indices < n)  # [B, K]
    safe = torch.where(valid, indices, torch.zeros_like(indices)).long()
    rows = kv.index_select(0, safe.reshape(-1)).reshape(b, k, d_qk).to(compute_dtype)
    scores = torch.einsum("bhd,bkd->bhk", q.to(compute_dtype), rows) * sm_scale
    scores = scores.masked_fill(~valid[:, None, :], float("-inf"))
    peak = scores.amax(dim=-1, keepdim=True)
    # A row with no valid slot has peak -inf; shifting by 0 instead keeps exp() at exactly 0 rather than NaN.
    peak = torch.where(torch.isfinite(peak), peak, torch.zeros_like(peak))
    weights = torch.exp(scores - peak)
    total = weights.sum(dim=-1, keepdim=True)
    out = torch.einsum("bhk,bkd->bhd", weights, rows[..., :d_v])
    out = out / torch.where(total > 0, total, torch.ones_like(total))
    lse = (torch.log(total) + peak).squeeze(-1)
    return out.to(q.dtype), lse.to(torch.float32)
