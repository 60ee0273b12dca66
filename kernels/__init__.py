"""Sparse MLA decode attention and the lightning indexer (the only package besides campaign/refserver that needs torch).

Public entry points:

- ``sparse_mla_decode(q, kv, indices, sm_scale, backend="torch", *, d_v=None) -> (out, lse)``
- the indexer: ``indexer_scores``, ``indexer_topk`` (length-aware) and ``naive_indexer_topk`` (the O(max_context)
  pitfall, kept for the benchmark).

Backends: ``torch`` (gather + fp32 math, the reference), ``simt`` (Triton, no ``tl.dot``: CUDA-core FMAs, one program
per head), ``mma`` (Triton ``tl.dot``, query heads grouped per program, split along the top-k axis plus a merge).
The Triton backends are imported only when asked for, so that a caller on CPU can set ``TRITON_INTERPRET=1`` first.
"""

from kernels.decode import BACKENDS, sparse_mla_decode

__all__ = ["BACKENDS", "sparse_mla_decode"]
