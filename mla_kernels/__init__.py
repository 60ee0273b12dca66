"""Sparse MLA decode attention and the lightning indexer (with campaign/refserver, the only code that needs torch).

Public entry points:

- ``sparse_mla_decode(q, kv, indices, sm_scale, backend="torch", *, d_v=None) -> (out, lse)``
- the indexer (mla_kernels.indexer): ``lightning_indexer``, ``indexer_scores``, ``indexer_topk`` (all O(L) per row,
  lengths read on the device) and ``naive_indexer_topk`` (the O(max_context) pitfall, kept for the benchmark).

Backends: ``torch`` (gather + fp32 math, the reference), ``simt`` (Triton, no ``tl.dot``: CUDA-core FMAs, one program
per head, the stock layout), ``simt-tiled`` (the same FMAs with heads grouped per program and split-K: the fair
CUDA-core baseline), ``mma`` (Triton ``tl.dot``, query heads grouped per program, split along the top-k axis plus a
merge).
Triton is imported only when a Triton backend or the indexer is first used, so that a caller on CPU can set
``TRITON_INTERPRET=1`` before that (Triton reads it when each kernel is defined).
"""

from __future__ import annotations

import importlib
from typing import Any

from mla_kernels.decode import BACKENDS, sparse_mla_decode

_INDEXER = ("lightning_indexer", "indexer_scores", "indexer_topk", "naive_indexer_topk")

__all__ = [
    "BACKENDS",
    "indexer_scores",
    "indexer_topk",
    "lightning_indexer",
    "naive_indexer_topk",
    "sparse_mla_decode",
]


def __getattr__(name: str) -> Any:
    # The indexer imports triton; load it on first use rather than at `import mla_kernels`.
    if name in _INDEXER:
        return getattr(importlib.import_module("mla_kernels.indexer"), name)
    raise AttributeError(f"module 'mla_kernels' has no attribute {name!r}")
