"""Random inputs for the kernel tests and the benchmark: decode cases and indexer cases, fresh for every draw."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class DecodeCase:
    """One decode problem: q [B, H, D_qk], kv [N, D_qk], indices [B, K] int32 (-1 unused), scale, d_v."""

    q: torch.Tensor
    kv: torch.Tensor
    indices: torch.Tensor
    sm_scale: float
    d_v: int


def decode_case(
    gen: torch.Generator,
    *,
    b: int,
    h: int,
    d_qk: int,
    d_v: int,
    k: int,
    n: int,
    dtype: torch.dtype = torch.bfloat16,
    invalid_rows: tuple[int, ...] = (),
    half_rows: tuple[int, ...] = (),
    sm_scale: float | None = None,
) -> DecodeCase:
    """Draw a case on ``gen``'s device, indices unique within a row.

    Rows in ``invalid_rows`` are all -1; rows in ``half_rows`` are -1 past K/2, with some -1 sprinkled before.
    """
    q = torch.randn((b, h, d_qk), generator=gen, device=gen.device).to(dtype)
    kv = torch.randn((n, d_qk), generator=gen, device=gen.device).to(dtype)
    rows = [torch.randperm(n, generator=gen, device=gen.device)[:k] for _ in range(b)]
    indices = torch.stack(rows).to(torch.int32)
    for r in invalid_rows:
        indices[r] = -1
    for r in half_rows:
        indices[r, k // 2 :] = -1
        indices[r, torch.randperm(k // 2, generator=gen, device=gen.device)[: k // 8]] = -1
    scale = d_qk**-0.5 if sm_scale is None else sm_scale
    return DecodeCase(q, kv, indices, scale, d_v)


@dataclass
class IndexerCase:
    """One indexer problem over a paged FP8 index-K cache, padded to ``pages`` pages per row."""

    q: torch.Tensor
    weights: torch.Tensor
    k_cache: torch.Tensor
    k_scale: torch.Tensor
    page_table: torch.Tensor
    lengths: torch.Tensor


def indexer_case(
    gen: torch.Generator,
    *,
    lengths: list[int],
    pages: int,
    heads: int,
    dim: int,
    pool_pages: int,
    dtype: torch.dtype = torch.float8_e4m3fn,
) -> IndexerCase:
    """Draw a case: each row's pages are distinct pool pages; table entries past the row's length are -1."""
    b = len(lengths)
    q = torch.randn((b, heads, dim), generator=gen, device=gen.device).to(dtype)
    weights = torch.randn((b, heads), generator=gen, device=gen.device) * heads**-0.5
    k_cache = torch.randn((pool_pages * 64, dim), generator=gen, device=gen.device).to(dtype)
    k_scale = torch.rand((pool_pages * 64,), generator=gen, device=gen.device) + 0.5
    table = torch.full((b, pages), -1, dtype=torch.int32, device=gen.device)
    for r, length in enumerate(lengths):
        used = -(-length // 64)
        table[r, :used] = torch.randperm(pool_pages, generator=gen, device=gen.device)[:used].to(torch.int32)
    return IndexerCase(q, weights, k_cache, k_scale, table, torch.tensor(lengths, dtype=torch.int32, device=gen.device))


def with_pages(case: IndexerCase, pages: int) -> IndexerCase:
    """The same case with its page table padded (or cut) to ``pages`` pages per row: a different M, same tokens."""
    b, old = case.page_table.shape
    table = torch.full((b, pages), -1, dtype=torch.int32, device=case.page_table.device)
    keep = min(old, pages)
    table[:, :keep] = case.page_table[:, :keep]
    return IndexerCase(case.q, case.weights, case.k_cache, case.k_scale, table, case.lengths)
