"""Run the mma decode backend at H=16, B=32 (--heads, --batch), K=2048, 1M-row pool, a few times, for Nsight Compute.

    ncu --kernel-name regex:_mmasync_decode_kernel --launch-skip 3 --launch-count 1 --set full \
        python3 scripts/ncu_mma.py
    ncu --kernel-name regex:_warpgroup_decode_kernel ... python3 scripts/ncu_mma.py --heads 128
    ncu --kernel-name regex:_mmasync_fp8_kernel ... python3 scripts/ncu_mma.py --batch 128 --fp8

On Hopper the mma backend runs the Gluon kernels for these shapes (mla_kernels.mma.gluon_module); elsewhere, or with
MLA_KERNELS_GLUON=0, the tl.dot kernel ``_mma_decode_kernel``.

The first calls compile and warm up; ncu skips them and profiles one steady call of the split kernel.
"""

from __future__ import annotations

import argparse

import torch

from mla_kernels import sparse_mla_decode
from mla_kernels.cases import decode_case


def main() -> None:
    """Draw one DeepSeek-shaped case and run the mma backend five times."""
    parser = argparse.ArgumentParser(description="run the mma decode backend for Nsight Compute")
    parser.add_argument("--heads", type=int, default=16, help="query heads (128: the Gluon warpgroup kernel)")
    parser.add_argument("--batch", type=int, default=32, help="query rows")
    parser.add_argument("--fp8", action="store_true", help="over the FP8 cache (mla_kernels.fp8cache)")
    args = parser.parse_args()
    gen = torch.Generator(device="cuda").manual_seed(0)
    case = decode_case(gen, b=args.batch, h=args.heads, d_qk=576, d_v=512, k=2048, n=1 << 20)
    if args.fp8:
        from mla_kernels import fp8cache

        cache = fp8cache.quantize(case.kv)
        for _ in range(5):
            fp8cache.decode(case.q, cache, case.indices, case.sm_scale, "mma")
    for _ in range(0 if args.fp8 else 5):
        sparse_mla_decode(case.q, case.kv, case.indices, case.sm_scale, "mma")
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
