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
    out: torch.Tensor | None = None,
    lse: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Return (out [B, H, d_v] in q's dtype, lse [B, H] fp32), computing in ``compute_dtype``.

    ``out`` and ``lse``, when given, receive the results (the Triton backends' caller-owned buffers, same meaning).

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
    res = torch.einsum("bhk,bkd->bhd", weights, rows[..., :d_v])
    res = (res / torch.where(total > 0, total, torch.ones_like(total))).to(q.dtype)
    res_lse = (torch.log(total) + peak).squeeze(-1).to(torch.float32)
    if out is not None:
        out.copy_(res)
        res = out
    if lse is not None:
        lse.copy_(res_lse)
        res_lse = lse
    return res, res_lse


def indexer_scores(
    q: torch.Tensor,
    weights: torch.Tensor,
    k_cache: torch.Tensor,
    k_scale: torch.Tensor,
    page_table: torch.Tensor,
    lengths: torch.Tensor,
    *,
    page: int = 64,
    compute_dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """Return the lightning indexer's logits [B, M] in ``compute_dtype``, -inf at and past each row's length.

    The plain form of mla_kernels.indexer.indexer_scores: every page of the table is gathered and scored, then masked.
    """
    m = page * page_table.shape[1]
    pos = torch.arange(m, device=q.device)
    slots = page_table.long().clamp(min=0)[:, pos // page] * page + pos % page  # [B, M]
    keys = k_cache.to(compute_dtype)[slots]  # [B, M, D]
    dots = torch.einsum("bhd,bmd->bhm", q.to(compute_dtype), keys).clamp(min=0)
    scores = torch.einsum("bh,bhm->bm", weights.to(compute_dtype), dots) * k_scale.to(compute_dtype)[slots]
    return scores.masked_fill(pos[None, :] >= lengths.long()[:, None], float("-inf"))
