"""The FP8 KV cache (DeepSeek-V3.2's 656-byte rows): its layout, and decode over it against the dequantised reference.

On CPU the torch backend and the portable path (Triton's interpreter: the dequantising gather, then the tl.dot
kernel) run; the Gluon FP8 kernel and the shapes at DeepSeek's full size are marked ``gpu``.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterator

import pytest

from tests.helpers import interpreted, triton_interpreter

torch = pytest.importorskip("torch")
# As tests/test_kernels.py: Triton fixes interpreted or compiled when the kernels are defined, at first import.
INTERPRET = not torch.cuda.is_available()
with triton_interpreter(INTERPRET):
    # fp8cache imports fp8gather and mma on first use: their kernels are defined here, interpreted without a GPU.
    from mla_kernels import fp8cache, fp8gather, mma, reference  # noqa: F401
    from mla_kernels.accuracy import compare
    from mla_kernels.cases import decode_case


@pytest.fixture(scope="module", autouse=True)
def _interpreter() -> Iterator[None]:
    yield from interpreted(INTERPRET)


needs_gpu = pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] < 8, reason="needs an sm_80+ GPU"
)


def _seeded(*key: object, device: str = "cpu") -> torch.Generator:
    return torch.Generator(device=device).manual_seed(zlib.crc32(repr(key).encode()))


def test_rows_are_656_bytes_in_deepseeks_layout() -> None:
    kv = torch.randn((40, 576), generator=_seeded("layout")).to(torch.bfloat16)
    kv[3, :128] *= 1000  # one large tile: its own scale, the other tiles of the row keep theirs
    cache = fp8cache.quantize(kv)
    assert cache.shape == (40, 656) and cache.dtype == torch.uint8
    scales = cache[:, 512:528].contiguous().view(torch.float32)
    # UE8M0: every scale a power of two, each the smallest with max|tile| / scale <= 448.
    assert torch.equal(scales, torch.pow(2.0, scales.log2().round()))
    tiles = kv[:, :512].float().view(40, 4, 128).abs().amax(-1)
    assert (tiles / scales <= 448).all() and (tiles / (scales / 2) > 448).all()
    assert scales[3, 0] > 100 * scales[3, 1]
    assert torch.equal(cache[:, 528:].contiguous().view(torch.bfloat16), kv[:, 512:])  # rope kept in bf16
    e4m3 = cache[:, :512].contiguous().view(torch.float8_e4m3fn).float()
    assert torch.equal(
        e4m3.view(40, 4, 128) * scales[..., None], fp8cache.dequantize(cache, 512)[:, :512].float().view(40, 4, 128)
    )


def test_dequantised_rows_are_close_to_the_originals() -> None:
    kv = torch.randn((256, 576), generator=_seeded("close")).to(torch.bfloat16)
    back = fp8cache.dequantize(fp8cache.quantize(kv), 512).float()
    # e4m3 keeps 3 mantissa bits: each value within 1/16 of its magnitude, or of the tile's smallest step.
    err = (back - kv.float()).abs()[:, :512]
    assert (err <= kv.float().abs()[:, :512] / 16 + 2**-6).all()
    assert torch.equal(back[:, 512:], kv.float()[:, 512:])


def test_narrow_latents_are_one_tile() -> None:
    kv = torch.randn((10, 128), generator=_seeded("narrow"))
    cache = fp8cache.quantize(kv, d_v=64)
    assert cache.shape[1] == fp8cache.row_bytes(64) == 64 + 4 + 128
    assert fp8cache.split_row(128, cache.shape[1]) == (64, 1)
    assert fp8cache.dequantize(cache, 64).shape == (10, 128)
    with pytest.raises(ValueError, match="multiple of 128"):
        fp8cache.row_bytes(192)


@pytest.mark.parametrize("backend", ["torch", "mma"])
@pytest.mark.parametrize("sm_scale", [None, 0.1352], ids=["d^-0.5", "model"])
def test_decode_over_the_cache_matches_the_dequantised_reference(backend: str, sm_scale: float | None) -> None:
    # Row 1 half empty, row 2 with no valid index, an index past the pool: as the bf16 contract.
    gen = _seeded("decode", backend, sm_scale)
    case = decode_case(gen, b=3, h=4, d_qk=576, d_v=512, k=96, n=500, half_rows=(1,), invalid_rows=(2,),
                       sm_scale=sm_scale)  # fmt: skip
    case.indices[0, 5] = 10_000
    cache = fp8cache.quantize(case.kv)
    out, lse = fp8cache.decode(case.q, cache, case.indices, case.sm_scale, backend)
    deq = fp8cache.dequantize(cache, 512)
    ref = reference.decode(case.q.double(), deq.double(), case.indices, case.sm_scale, 512, compute_dtype=torch.float64)
    verdict = compare(out, lse, *ref)
    assert verdict.ok, verdict
    assert torch.equal(out[2], torch.zeros_like(out[2])) and torch.isneginf(lse[2]).all()


def test_a_cache_that_does_not_fit_q_is_refused_with_the_reason() -> None:
    case = decode_case(_seeded("bad"), b=1, h=2, d_qk=576, d_v=512, k=8, n=32)
    cache = fp8cache.quantize(case.kv)
    with pytest.raises(ValueError, match="needs 656-byte rows, the cache has 655"):
        fp8cache.decode(case.q, cache[:, :655], case.indices, case.sm_scale)
    with pytest.raises(ValueError, match="uint8"):
        fp8cache.decode(case.q, cache.view(torch.float8_e4m3fn), case.indices, case.sm_scale)
    with pytest.raises(ValueError, match="backends torch and mma"):
        fp8cache.decode(case.q, cache, case.indices, case.sm_scale, "simt")


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("sm_scale", [None, 0.1352], ids=["d^-0.5", "model"])
@pytest.mark.parametrize("splits", [None, 1, 5], ids=["plan", "one", "five"])
@pytest.mark.parametrize("h", [16, 12])
def test_gpu_fp8_kernel_matches_the_dequantised_reference(h: int, splits: int | None, sm_scale: float | None) -> None:
    from mla_kernels import mmasync_fp8

    gen = _seeded("gpu", h, splits, sm_scale, device="cuda")
    case = decode_case(gen, b=3, h=h, d_qk=576, d_v=512, k=2048, n=200_000, half_rows=(1,), invalid_rows=(2,),
                       sm_scale=sm_scale)  # fmt: skip
    cache = fp8cache.quantize(case.kv)
    assert mmasync_fp8.supports(case.q, cache, 512)
    out = torch.full((3, h, 512), float("nan"), dtype=torch.bfloat16, device="cuda")
    lse = torch.full((3, h), float("nan"), dtype=torch.float32, device="cuda")
    mmasync_fp8.decode(case.q, cache, case.indices, case.sm_scale, 512, num_splits=splits, out=out, lse=lse)
    deq = fp8cache.dequantize(cache, 512)
    ref = reference.decode(case.q.double(), deq.double(), case.indices, case.sm_scale, 512, compute_dtype=torch.float64)
    verdict = compare(out, lse, *ref)
    assert verdict.ok, verdict
    assert torch.equal(out[2], torch.zeros_like(out[2])) and torch.isneginf(lse[2]).all()


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("h", [128, 16])
def test_gpu_mma_backend_over_the_cache_at_deepseeks_shapes(h: int) -> None:
    # H = 128 runs the portable path (dequantising gather, then the bf16 kernel); H = 16 the Gluon FP8 kernel.
    gen = _seeded("gpu-backend", h, device="cuda")
    case = decode_case(gen, b=4, h=h, d_qk=576, d_v=512, k=2048, n=100_000, half_rows=(1,), sm_scale=0.1352)
    cache = fp8cache.quantize(case.kv)
    out, lse = fp8cache.decode(case.q, cache, case.indices, case.sm_scale, "mma")
    deq = fp8cache.dequantize(cache, 512)
    ref = reference.decode(case.q.double(), deq.double(), case.indices, case.sm_scale, 512, compute_dtype=torch.float64)
    verdict = compare(out, lse, *ref)
    assert verdict.ok, verdict


@pytest.mark.gpu
@needs_gpu
def test_gpu_fp8_kernel_replays_in_a_cuda_graph_on_new_inputs() -> None:
    gen = _seeded("graph", device="cuda")
    first = decode_case(gen, b=8, h=16, d_qk=576, d_v=512, k=2048, n=100_000)
    second = decode_case(gen, b=8, h=16, d_qk=576, d_v=512, k=2048, n=100_000)
    q, idx = first.q.clone(), first.indices.clone()
    cache = fp8cache.quantize(first.kv)
    fp8cache.decode(q, cache, idx, first.sm_scale, "mma")
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out, lse = fp8cache.decode(q, cache, idx, first.sm_scale, "mma")
    q.copy_(second.q)
    idx.copy_(second.indices)
    cache.copy_(fp8cache.quantize(second.kv))
    graph.replay()
    deq = fp8cache.dequantize(cache, 512)
    ref = reference.decode(second.q.double(), deq.double(), second.indices, second.sm_scale, 512,
                           compute_dtype=torch.float64)  # fmt: skip
    verdict = compare(out, lse, *ref)
    assert verdict.ok, verdict
