"""The lightning indexer: scores against a float64 reference, top-k sets, and independence from max context M.

Every top-k test runs both methods of ``indexer_topk`` (the one-program-per-row radix select and the split one that
spreads each row over several programs); the split one must also give exactly the single one's result. On CPU the
Triton kernels run in Triton's interpreter at small shapes; tests marked gpu use DeepSeek's indexer shape (64 heads ×
128, FP8 e4m3 keys, page 64) with M = 131072.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterator

import pytest

from tests.helpers import interpreted, triton_interpreter

torch = pytest.importorskip("torch")
INTERPRET = not torch.cuda.is_available()
with triton_interpreter(INTERPRET):
    import mla_kernels
    from mla_kernels import indexer, reference
    from mla_kernels.cases import IndexerCase, indexer_case, with_pages


@pytest.fixture(scope="module", autouse=True)
def _interpreter() -> Iterator[None]:
    yield from interpreted(INTERPRET)


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
METHODS = ["single", "split"]


def test_scores_match_float64_reference_inside_each_row() -> None:
    gen = torch.Generator().manual_seed(seed("scores"))
    case = indexer_case(gen, lengths=[700, 50, 768, 1], pages=12, **SMALL)
    logits = indexer.indexer_scores(case.q, case.weights, case.k_cache, case.k_scale, case.page_table, case.lengths)
    ref = ref_scores(case)
    assert logits.shape == (4, 12 * 64)
    for b, length in enumerate(case.lengths.tolist()):
        err = (logits[b, :length].double() - ref[b, :length]).abs().max()
        assert err <= 1e-5 * ref[b, :length].abs().max() + 1e-6, (b, float(err))


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("topk", [1, 64, 100, 700])
def test_topk_keeps_the_largest_scores(topk: int, method: str) -> None:
    gen = torch.Generator().manual_seed(seed("topk", topk))
    case = indexer_case(gen, lengths=[700, 50, 768, 65], pages=12, **SMALL)
    got = mla_kernels.lightning_indexer(
        case.q, case.weights, case.k_cache, case.k_scale, case.page_table, case.lengths, topk, topk_method=method
    )
    assert got.shape == (4, topk) and got.dtype == torch.int32
    want = reference_topk_slots(case, topk)
    for b, length in enumerate(case.lengths.tolist()):
        row = got[b].tolist()
        assert row.count(-1) == topk - min(topk, length)  # short rows keep every token and pad with -1
        assert len(set(row) - {-1}) == min(topk, length)  # no slot twice
        recall = len(set(row) & want[b]) / len(want[b])
        assert recall >= 0.99, (b, recall)


@pytest.mark.parametrize("method", METHODS)
def test_result_does_not_depend_on_max_context(method: str) -> None:
    gen = torch.Generator().manual_seed(seed("pad"))
    tight = indexer_case(gen, lengths=[640, 320, 200], pages=10, **SMALL)
    padded = with_pages(tight, 64)  # M = 4096 instead of 640
    runs = []
    for case in (tight, padded):
        args = (case.q, case.weights, case.k_cache, case.k_scale, case.page_table, case.lengths, 128)
        runs.append(as_sets(mla_kernels.lightning_indexer(*args, topk_method=method)))
        runs.append(as_sets(mla_kernels.naive_indexer_topk(*args)))
    assert all(r == runs[0] for r in runs[1:])
    assert runs[0] == reference_topk_slots(tight, 128)


@pytest.mark.parametrize("method", [*METHODS, "auto"])  # auto: single under the interpreter, split on a GPU
def test_ties_and_negative_scores_select_exactly_topk(method: str) -> None:
    b, m = 3, 2048
    logits = torch.full((b, m), -2.5)
    logits[0, 100:400] = 7.0  # 300 equal maxima: any 256 of them
    logits[1] = -torch.arange(m, dtype=torch.float32)  # all non-positive, strictly decreasing
    logits[2] = torch.linspace(-1, 1, m)
    lengths = torch.tensor([2048, 1500, 1000], dtype=torch.int32)
    logits[2, 1000:] = float("nan")  # past the row's length: must never be read
    got = indexer.indexer_topk(logits, lengths, 256, method=method)
    rows = got.tolist()
    assert len(set(rows[0])) == 256 and set(rows[0]) <= set(range(100, 400))
    assert set(rows[1]) == set(range(256))
    assert set(rows[2]) == set(range(1000 - 256, 1000))


TOPK = 64


def edge_rows(name: str) -> tuple[torch.Tensor, list[int]]:
    """Logits [B, 640] and row lengths for one edge case of the top-k; columns past a row's length hold NaN."""
    gen = torch.Generator().manual_seed(seed("edge", name))
    m = 640
    x = torch.randn(3, m, generator=gen)
    lengths = [m, 500, 300]
    if name == "ties in the threshold bin":  # <= 40 keys above, then 100+ equal to the 64th largest: any of those
        x = torch.randn(3, m, generator=gen) - 10
        for b in range(3):
            x[b, torch.randperm(m, generator=gen)[:140]] = 1.25
            x[b, torch.randperm(m, generator=gen)[:40]] = 2.0 + torch.rand(40, generator=gen)
    elif name == "keys one ulp apart":  # one 24-bit prefix, so only the last radix pass tells them apart
        base = torch.full((3, m), 3.0).view(torch.int32)
        x = (base + torch.randint(0, 256, (3, m), generator=gen, dtype=torch.int32)).view(torch.float32)
    elif name == "all equal":
        x = torch.full((3, m), 0.5)
    elif name == "negative":
        x = -torch.rand(3, m, generator=gen) * 1e-3 - torch.randint(0, 2, (3, m), generator=gen) * 5.0
    elif name == "signed zeros and infinities":
        x = torch.zeros(3, m) * torch.where(torch.rand(3, m, generator=gen) < 0.5, 1.0, -1.0)
        x[:, ::7] = float("inf")
        x[:, 3::5] = float("-inf")
        x[:, 1::11] = torch.randn(3, len(range(1, m, 11)), generator=gen)
    elif name == "short lengths":  # 0, 1, topk - 1, topk, topk + 1 (the last needs a select of one dropped key)
        x = torch.randn(5, m, generator=gen)
        lengths = [0, 1, TOPK - 1, TOPK, TOPK + 1]
    elif name == "different lengths":
        x = torch.randn(4, m, generator=gen)
        lengths = [m, 17, 333, TOPK + 2]
    elif name == "one long row":  # much longer than the others: its programs do many blocks, the others' one
        x = torch.randn(3, 4096, generator=gen)
        lengths = [4096, 80, 130]
    for b, length in enumerate(lengths):
        x[b, length:] = float("nan")  # never read
    return x, lengths


EDGES = [
    "ties in the threshold bin",
    "keys one ulp apart",
    "all equal",
    "negative",
    "signed zeros and infinities",
    "short lengths",
    "different lengths",
    "one long row",
]


def check_exact_topk(x: torch.Tensor, lengths: list[int], got: torch.Tensor, topk: int) -> None:
    """Each row: min(L, topk) distinct positions below L whose logits are torch.topk's values, then -1 padding."""
    for b, length in enumerate(lengths):
        k = min(length, topk)
        row = got[b].tolist()
        assert row[k:] == [-1] * (topk - k), b
        assert len(set(row[:k])) == k and all(0 <= p < length for p in row[:k]), b
        if k:
            want = torch.topk(x[b, :length], k).values.sort().values
            assert torch.equal(x[b, row[:k]].sort().values, want), b


@pytest.mark.parametrize("name", EDGES)
def test_split_topk_is_exact_and_equals_single(name: str) -> None:
    x, lengths = edge_rows(name)
    lens = torch.tensor(lengths, dtype=torch.int32)
    single = indexer.indexer_topk(x, lens, TOPK, method="single")
    check_exact_topk(x, lengths, single, TOPK)
    # One program per row, a few (some with several blocks), more programs than a row has blocks (idle ones), and
    # 11-bit digits (three passes, the first of 10 bits).
    for block, per_row, bits in ((256, 1, 8), (64, 3, 8), (128, 16, 8), (64, 3, 11)):
        split = indexer.indexer_topk(
            x, lens, TOPK, method="split", block=block, programs_per_row=per_row, radix_bits=bits
        )
        check_exact_topk(x, lengths, split, TOPK)
        assert torch.equal(split, single), (block, per_row, bits)  # same picks, same order: deterministic


@pytest.mark.parametrize("method", METHODS)
def test_topk_maps_positions_through_the_page_table(method: str) -> None:
    gen = torch.Generator().manual_seed(seed("map"))
    x = torch.randn(2, 6 * 64, generator=gen)
    lengths = torch.tensor([6 * 64, 40], dtype=torch.int32)
    table = torch.randperm(64, generator=gen)[:16].view(2, 8).to(torch.int32)  # wider than the logits: M/64 < 8
    got = indexer.indexer_topk(x, lengths, TOPK, table, method=method, block=128)
    pos = indexer.indexer_topk(x, lengths, TOPK, method=method, block=128)
    want = torch.where(pos >= 0, torch.gather(table, 1, (pos.clamp(min=0) // 64).long()) * 64 + pos % 64, -1)
    assert torch.equal(got, want.to(torch.int32))
    assert got[1].tolist().count(-1) == TOPK - 40


def test_bad_topk_method_is_a_clear_value_error() -> None:
    lengths = torch.tensor([4], dtype=torch.int32)
    with pytest.raises(ValueError, match="method must be"):
        indexer.indexer_topk(torch.zeros(1, 8), lengths, 2, method="radix")
    with pytest.raises(ValueError, match="block must be"):
        indexer.indexer_topk(torch.zeros(1, 8), lengths, 2, block=100)
    with pytest.raises(ValueError, match="radix_bits must be"):
        indexer.indexer_topk(torch.zeros(1, 8), lengths, 2, radix_bits=16)


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


@pytest.mark.gpu
@needs_gpu
def test_gpu_split_topk_equals_single_at_the_server_shape_and_under_a_graph() -> None:
    gen = torch.Generator(device="cuda").manual_seed(seed("gpu-split"))
    b, m = 64, 131072
    logits = torch.randn(b, m, device="cuda", generator=gen)
    logits[: b // 2] = logits[: b // 2].round()  # heavy ties in the threshold bin for half the rows
    lengths = torch.full((b,), 8192, dtype=torch.int32, device="cuda")
    lengths[:4] = torch.tensor([0, 2047, 2049, 100000], dtype=torch.int32)
    single = indexer.indexer_topk(logits, lengths, 2048, method="single")
    for bits in (8, 11):
        split = indexer.indexer_topk(logits, lengths, 2048, method="split", radix_bits=bits)
        assert torch.equal(split, single), bits
    check_exact_topk(logits.cpu(), lengths.tolist(), single.cpu(), 2048)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = indexer.indexer_topk(logits, lengths, 2048, method="split")
    lengths.copy_(lengths.flip(0))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, indexer.indexer_topk(logits, lengths, 2048, method="single"))
