"""The Gluon mma.sync decode kernel for 16 heads: its input checks anywhere, FlashMLA's rule on an sm_80+ GPU."""

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
    mmasync = pytest.importorskip("mla_kernels.mmasync", reason="this Triton has no Gluon")

    from mla_kernels import reference
    from mla_kernels.accuracy import compare
    from mla_kernels.cases import decode_case


@pytest.fixture(scope="module", autouse=True)
def _interpreter() -> Iterator[None]:
    yield from interpreted(INTERPRET)


needs_gpu = pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] < 8, reason="needs an sm_80+ GPU"
)
CONFIGS = {
    "default": mmasync.SyncConfig(),
    "n16-b2": mmasync.SyncConfig(block_n=16, num_buf=2, programs_per_sm=4),
    "n16-b3": mmasync.SyncConfig(block_n=16, num_buf=3, programs_per_sm=3),
}


def test_inputs_it_cannot_run_are_refused_with_the_reason() -> None:
    gen = torch.Generator().manual_seed(1)
    case = decode_case(gen, b=1, h=16, d_qk=576, d_v=512, k=64, n=128)
    with pytest.raises(ValueError, match="sm_80\\+ GPU, bf16 q and kv, at most 16 heads"):
        mmasync.decode(case.q, case.kv, case.indices, case.sm_scale, case.d_v)


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("sm_scale", [None, 0.1352], ids=["d^-0.5", "model"])
@pytest.mark.parametrize("splits", [None, 1, 5], ids=["plan", "one", "five"])
@pytest.mark.parametrize("name", list(CONFIGS))
@pytest.mark.parametrize("h", [16, 12])
def test_gpu_matches_float64_reference(h: int, name: str, splits: int | None, sm_scale: float | None) -> None:
    # Row 1 is half empty (and -1 sprinkled), row 2 has no valid index: out 0, lse -inf. 12 heads: masked rows.
    gen = torch.Generator(device="cuda").manual_seed(zlib.crc32(repr((h, name, splits, sm_scale)).encode()))
    case = decode_case(
        gen, b=3, h=h, d_qk=576, d_v=512, k=2048, n=200_000, half_rows=(1,), invalid_rows=(2,), sm_scale=sm_scale
    )
    out = torch.full((3, h, 512), float("nan"), dtype=torch.bfloat16, device="cuda")
    lse = torch.full((3, h), float("nan"), dtype=torch.float32, device="cuda")
    mmasync.decode(case.q, case.kv, case.indices, case.sm_scale, 512, config=CONFIGS[name], num_splits=splits,
                   out=out, lse=lse)  # fmt: skip
    ref = reference.decode(
        case.q.double(), case.kv.double(), case.indices, case.sm_scale, 512, compute_dtype=torch.float64
    )
    verdict = compare(out, lse, *ref)
    assert verdict.ok, verdict
    assert torch.equal(out[2], torch.zeros_like(out[2])) and torch.isneginf(lse[2]).all()
