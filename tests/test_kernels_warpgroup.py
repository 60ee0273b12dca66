"""The Gluon warpgroup decode kernel: its input checks anywhere, FlashMLA's rule on a Hopper GPU.

Gluon has no CPU interpreter, so off a Hopper GPU only the refusal of unsupported inputs runs here; the offline
sm_90 compile (registers, spills, wgmma shapes) is in tests/test_kernels_sass.py.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterator

import pytest

from tests.helpers import interpreted, triton_interpreter

torch = pytest.importorskip("torch")
# As tests/test_kernels.py: the mla_kernels modules this imports define Triton kernels, and Triton fixes interpreted
# or compiled at that moment; without it, tests/test_kernels.py run after this file in one process found them compiled.
INTERPRET = not torch.cuda.is_available()
with triton_interpreter(INTERPRET):
    warpgroup = pytest.importorskip("mla_kernels.warpgroup", reason="this Triton has no Gluon")

    from mla_kernels import reference
    from mla_kernels.accuracy import compare
    from mla_kernels.cases import DecodeCase, decode_case


@pytest.fixture(scope="module", autouse=True)
def _interpreter() -> Iterator[None]:
    yield from interpreted(INTERPRET)


needs_hopper = pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] != 9, reason="needs a Hopper GPU (sm_90)"
)


def float64_reference(case: DecodeCase) -> tuple[torch.Tensor, torch.Tensor]:
    """The exact answer for the case's bf16 inputs, in float64."""
    return reference.decode(
        case.q.double(), case.kv.double(), case.indices, case.sm_scale, case.d_v, compute_dtype=torch.float64
    )


def run_poisoned(case: DecodeCase, **kw: object) -> tuple[torch.Tensor, torch.Tensor]:
    """Run the kernel into NaN-filled buffers, so an element it fails to write cannot pass."""
    b, h, _ = case.q.shape
    out = torch.full((b, h, case.d_v), float("nan"), dtype=case.q.dtype, device=case.q.device)
    lse = torch.full((b, h), float("nan"), dtype=torch.float32, device=case.q.device)
    res = warpgroup.decode(case.q, case.kv, case.indices, case.sm_scale, case.d_v, out=out, lse=lse, **kw)
    assert res[0] is out and res[1] is lse
    return out, lse


def test_inputs_it_cannot_run_are_refused_with_the_reason() -> None:
    gen = torch.Generator().manual_seed(1)
    case = decode_case(gen, b=1, h=16, d_qk=576, d_v=512, k=64, n=128)
    with pytest.raises(ValueError, match="Hopper GPU, bf16 q and kv, H a multiple of 64"):
        warpgroup.decode(case.q, case.kv, case.indices, case.sm_scale, case.d_v)
    assert not warpgroup.supports(case.q, case.kv, case.d_v)
    from mla_kernels import mma

    assert mma.kernel_name(case.q, case.kv, case.d_v) == "tl.dot"  # off the GPU the mma backend is tl.dot alone


@pytest.mark.gpu
@needs_hopper
@pytest.mark.parametrize("sm_scale", [None, 0.1352], ids=["d^-0.5", "model"])
@pytest.mark.parametrize("splits", [None, 1, 5], ids=["plan", "one", "five"])
@pytest.mark.parametrize("h", [64, 128])
def test_gpu_matches_float64_reference(h: int, splits: int | None, sm_scale: float | None) -> None:
    # Row 1 is half empty (and -1 sprinkled), row 2 has no valid index at all: out 0, lse -inf.
    gen = torch.Generator(device="cuda").manual_seed(zlib.crc32(repr((h, splits, sm_scale)).encode()))
    case = decode_case(
        gen, b=3, h=h, d_qk=576, d_v=512, k=2048, n=200_000, half_rows=(1,), invalid_rows=(2,), sm_scale=sm_scale
    )
    out, lse = run_poisoned(case, num_splits=splits)
    verdict = compare(out, lse, *float64_reference(case))
    assert verdict.ok, verdict
    assert torch.equal(out[2], torch.zeros_like(out[2]))
    assert torch.isneginf(lse[2]).all()


@pytest.mark.gpu
@needs_hopper
@pytest.mark.parametrize(
    "cfg",
    [warpgroup.WarpgroupConfig(block_n=32, num_buf=3), warpgroup.WarpgroupConfig(block_n=32, num_buf=4),
     warpgroup.WarpgroupConfig(block_n=16, num_buf=6)],
    ids=["n32-b3", "n32-b4", "n16-b6"],
)  # fmt: skip
@pytest.mark.parametrize("splits", [None, 1, 5], ids=["plan", "one", "five"])
def test_gpu_other_tiles_match_float64_reference(cfg: warpgroup.WarpgroupConfig, splits: int | None) -> None:
    gen = torch.Generator(device="cuda").manual_seed(zlib.crc32(repr((cfg, splits)).encode()))
    case = decode_case(
        gen, b=3, h=128, d_qk=576, d_v=512, k=2048, n=100_000, half_rows=(1,), invalid_rows=(2,), sm_scale=0.1352
    )
    verdict = compare(*run_poisoned(case, config=cfg, num_splits=splits), *float64_reference(case))
    assert verdict.ok, verdict


@pytest.mark.gpu
@needs_hopper
@pytest.mark.parametrize("block_n", [64, 32])
def test_gpu_dominant_logit_in_the_last_split(block_n: int) -> None:
    # One row far above the rest, in the last slot: the merge must carry it across eight splits.
    cfg = warpgroup.WarpgroupConfig(block_n=block_n, num_buf=128 // block_n)
    gen = torch.Generator(device="cuda").manual_seed(3)
    case = decode_case(gen, b=2, h=128, d_qk=576, d_v=512, k=2000, n=100_000, sm_scale=0.1352)
    for r in range(2):
        case.kv[case.indices[r, -1]] = (case.q[r, 0].float() * 0.5).to(case.kv.dtype)
    verdict = compare(*run_poisoned(case, num_splits=8, config=cfg), *float64_reference(case))
    assert verdict.ok, verdict


@pytest.mark.gpu
@needs_hopper
def test_gpu_cuda_graph_replay_follows_new_inputs() -> None:
    gen = torch.Generator(device="cuda").manual_seed(11)
    shape = dict(b=4, h=128, d_qk=576, d_v=512, k=2048, n=50_000)
    static = decode_case(gen, **shape)
    call = lambda: warpgroup.decode(static.q, static.kv, static.indices, static.sm_scale, 512)  # noqa: E731
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        call()  # compile and warm up outside the capture
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out, lse = call()
    fresh = decode_case(gen, half_rows=(0,), invalid_rows=(3,), **shape)
    static.q.copy_(fresh.q)
    static.kv.copy_(fresh.kv)
    static.indices.copy_(fresh.indices)
    graph.replay()
    torch.cuda.synchronize()
    verdict = compare(out, lse, *float64_reference(fresh))
    assert verdict.ok, verdict


@pytest.mark.gpu
@needs_hopper
def test_gpu_mma_backend_runs_the_gluon_kernels_here() -> None:
    import mla_kernels
    from mla_kernels import mma, mmasync

    gen = torch.Generator(device="cuda").manual_seed(23)
    case = decode_case(gen, b=4, h=128, d_qk=576, d_v=512, k=2048, n=50_000, sm_scale=0.1352)
    assert mma.gluon_module(case.q, case.kv, 512) is warpgroup
    assert mma.kernel_name(case.q[:1], case.kv[:1], 512) == "warpgroup"
    routed = mla_kernels.sparse_mla_decode(case.q, case.kv, case.indices, case.sm_scale, "mma")
    direct = warpgroup.decode(case.q, case.kv, case.indices, case.sm_scale, 512)
    assert torch.equal(routed[0], direct[0]) and torch.equal(routed[1], direct[1])
    # 16 heads go to the Gluon mma.sync kernel, fp32 inputs to the tl.dot kernels.
    small = decode_case(gen, b=2, h=16, d_qk=576, d_v=512, k=256, n=5_000)
    assert mma.gluon_module(small.q, small.kv, 512) is mmasync
    assert mma.kernel_name(small.q, small.kv, 512) == "mmasync"
    routed = mla_kernels.sparse_mla_decode(small.q, small.kv, small.indices, small.sm_scale, "mma")
    direct = mmasync.decode(small.q, small.kv, small.indices, small.sm_scale, 512)
    assert torch.equal(routed[0], direct[0]) and torch.equal(routed[1], direct[1])
    wide = decode_case(gen, b=2, h=16, d_qk=576, d_v=512, k=256, n=5_000, dtype=torch.float32)
    assert mma.gluon_module(wide.q, wide.kv, 512) is None
    # What the server check records: an fp32 server (the weights files' own dtype) runs the tl.dot kernel.
    assert mma.kernel_name(wide.q, wide.kv, 512) == "tl.dot"
