"""The lightning indexer: scores against a float64 reference, top-k sets, and independence from max context M.

On CPU the Triton kernels run in Triton's interpreter at small shapes; tests marked gpu use DeepSeek's indexer
shape (64 heads × 128, FP8 e4m3 keys, page 64) with M = 131072.
"""

from __future__ import annotations

import os
import zlib

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import mla_kernels  # noqa: E402
from mla_kernels import indexer, reference  # noqa: E402
from mla_kernels.cases import IndexerCase, indexer_case, with_pages  # noqa: E402

needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def seed(*parts: object) -> int:
    return zlib.crc32(repr(parts).encode())


def ref_scores(case: IndexerCase) -> torch.Tensor:
    return reference.indexer_scores(
        case.q, case.weights, case.k_cache, case.k_scale, case.page_table, case.lengths, compute_dtype=torch.float64
    )


def slot_sets(case: IndexerCase, positions_per_row: list[list[int]]) -> list[set[int]]:
    table = case.page_table.cpu()
    return [{int(table[b, p // 64]) * 64 + p % 64 for p in rows} for b, rows in enumerate(positions_per_row)]


def reference_topk_slots(case: IndexerCase, topk: int) -> list[set[int]]:
    scores = ref_scores(case).cpu()
    rows = []
    for b, length in enumerate(case.lengths.tolist()):
        rows.append(torch.topk(scores[b], min(topk, length)).indices.tolist())
    return slot_sets(case, rows)


def as_sets(result: torch.Tensor) -> list[set[int]]:
    return [set(r) - {-1} for r in result.cpu().tolist()]


SMALL = dict(heads=8, dim=32, pool_pages=40)


def test_scores_match_float64_reference_inside_each_row() -> None:
    gen = torch.Generator().manual_seed(seed("scores"))
    case = indexer_case(gen, lengths=[700, 50, 768, 1], pages=12, **SMALL)
    logits = indexer.indexer_scores(case.q, case.weights, case.k_cache, case.k_scale, case.page_table, case.lengths)
    ref = ref_scores(case)
    assert logits.shape == (4, 12 * 64)
    for b, length in enumerate(case.lengths.tolist()):
        err = (logits[b, :length].double() - ref[b, :length]).abs().max()
        assert err <= 1e-5 * ref[b, :length].abs().max() + 1e-6, (b, float(err))


@pytest.mark.parametrize("topk", [1, 64, 100, 700])
def test_topk_keeps_the_largest_scores(topk: int) -> None:
    gen = torch.Generator().manual_seed(seed("topk", topk))
    case = indexer_case(gen, lengths=[700, 50, 768, 65], pages=12, **SMALL)
    got = mla_kernels.lightning_indexer(
        case.q, case.weights, case.k_cache, case.k_scale, case.page_table, case.lengths, topk
    )
    assert got.shape == (4, topk) and got.dtype == torch.int32
    want = reference_topk_slots(case, topk)
    for b, length in enumerate(case.lengths.tolist()):
        row = got[b].tolist()
        assert row.count(-1) == topk - min(topk, length)  # short rows keep every token and pad with -1
        assert len(set(row) - {-1}) == min(topk, length)  # no slot twice
        recall = len(set(row) & want[b]) / len(want[b])
        assert recall >= 0.99, (b, recall)


def test_result_does_not_depend_on_max_context() -> None:
    gen = torch.Generator().manual_seed(seed("pad"))
    tight = indexer_case(gen, lengths=[640, 320, 200], pages=10, **SMALL)
    padded = with_pages(tight, 64)  # M = 4096 instead of 640
    runs = []
    for case in (tight, padded):
        for fn in (mla_kernels.lightning_indexer, mla_kernels.naive_indexer_topk):
            res = fn(case.q, case.weights, case.k_cache, case.k_scale, case.page_table, case.lengths, 128)
            runs.append(as_sets(res))
    assert all(r == runs[0] for r in runs[1:])
    assert runs[0] == reference_topk_slots(tight, 128)


def test_ties_and_negative_scores_select_exactly_topk() -> None:
    b, m = 3, 2048
    logits = torch.full((b, m), -2.5)
    logits[0, 100:400] = 7.0  # 300 equal maxima: any 256 of them
    logits[1] = -torch.arange(m, dtype=torch.float32)  # all non-positive, strictly decreasing
    logits[2] = torch.linspace(-1, 1, m)
    lengths = torch.tensor([2048, 1500, 1000], dtype=torch.int32)
    logits[2, 1000:] = float("nan")  # past the row's length: must never be read
    got = indexer.indexer_topk(logits, lengths, 256)
    rows = got.tolist()
    assert len(set(rows[0])) == 256 and set(rows[0]) <= set(range(100, 400))
    assert set(rows[1]) == set(range(256))
    assert set(rows[2]) == set(range(1000 - 256, 1000))


BAD = {
    "weights shape": (lambda c: dict(weights=c.weights[:, :3]), "weights must be"),
    "lengths dtype": (lambda c: dict(lengths=c.lengths.long()), "int32"),
    "partial page": (lambda c: dict(k_cache=c.k_cache[:100], k_scale=c.k_scale[:100]), "whole pages"),
    "table rows": (lambda c: dict(page_table=c.page_table[:1]), "page_table must be"),
}


@pytest.mark.parametrize("what", list(BAD))
def test_bad_indexer_input_is_a_clear_value_error(what: str) -> None:
    gen = torch.Generator().manual_seed(2)
    case = indexer_case(gen, lengths=[64, 10], pages=2, heads=4, dim=16, pool_pages=4)
    args = dict(
        q=case.q,
        weights=case.weights,
        k_cache=case.k_cache,
        k_scale=case.k_scale,
        page_table=case.page_table,
        lengths=case.lengths,
    )
    change, message = BAD[what]
    args.update(change(case))
    with pytest.raises(ValueError, match=message):
        mla_kernels.lightning_indexer(**args, topk=8)


# ---- on the GPU, at DeepSeek's indexer shape ----

FULL = dict(heads=64, dim=128, pool_pages=8192)


@pytest.mark.gpu
@needs_gpu
def test_gpu_indexer_full_shape_is_independent_of_max_context() -> None:
    gen = torch.Generator(device="cuda").manual_seed(seed("gpu-indexer"))
    lengths = [4096, 100, 30000, 2048]
    tight = indexer_case(gen, lengths=lengths, pages=-(-max(lengths) // 64), **FULL)
    padded = with_pages(tight, 131072 // 64)
    want = reference_topk_slots(tight, 2048)
    for case in (tight, padded):
        got = mla_kernels.lightning_indexer(
            case.q, case.weights, case.k_cache, case.k_scale, case.page_table, case.lengths, 2048
        )
        for b, length in enumerate(lengths):
            row = got[b].tolist()
            assert row.count(-1) == 2048 - min(2048, length)
            assert len(set(row) & want[b]) / len(want[b]) >= 0.99
    naive = mla_kernels.naive_indexer_topk(
        padded.q, padded.weights, padded.k_cache, padded.k_scale, padded.page_table, padded.lengths, 2048
    )
    assert [len(s & w) / len(w) >= 0.99 for s, w in zip(as_sets(naive), want, strict=True)] == [True] * 4


@pytest.mark.gpu
@needs_gpu
def test_gpu_indexer_under_cuda_graph_follows_new_lengths() -> None:
    gen = torch.Generator(device="cuda").manual_seed(seed("gpu-graph"))
    case = indexer_case(gen, lengths=[8192, 8192], pages=131072 // 64, **FULL)
    call = lambda: mla_kernels.lightning_indexer(  # noqa: E731
        case.q, case.weights, case.k_cache, case.k_scale, case.page_table, case.lengths, 2048
    )
    call()  # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = call()
    case.lengths.copy_(torch.tensor([5000, 1000], dtype=torch.int32))
    graph.replay()
    torch.cuda.synchronize()
    want = reference_topk_slots(case, 2048)
    rows = out.tolist()
    assert rows[1].count(-1) == 1048 and set(rows[1]) - {-1} == want[1]
    assert len(set(rows[0]) & want[0]) / 2048 >= 0.99
