"""How fast can the H200 read the KV rows a sparse decode gathers? A read-only gather with no MMA, at decode's pattern.

    python scripts/bench_gather.py [--json FILE]

Each program of a Triton kernel reads its slice of one row's top-k indices and sums the gathered KV rows (the sum
costs next to nothing; it keeps the loads live). Same inputs as ``mla_kernels.bench --quick`` at H = 16: K = 2048 of
a 4096-token context on random pages of a 1M-row pool, bf16 rows of 576. Indices in random order and in position
order (as the indexer emits them). Graph-timed like the benchmark; the copy ceiling is measured in the same run.
The fastest configuration is the read ceiling the decode kernel's memory floor should be judged against.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

import torch
import triton
import triton.language as tl

from mla_kernels.bench import QUICK, Timer, bench_decode_case, environment, measure_ceilings, rotation

# (rows per tile, warps, pipeline stages, programs per SM the split aims at)
CONFIGS = [(16, 4, 3, 4), (32, 4, 3, 2), (32, 4, 4, 4), (32, 8, 3, 2), (64, 8, 3, 1), (64, 8, 3, 2), (16, 4, 4, 8),
           (32, 4, 2, 4)]  # fmt: skip


@triton.jit
def _gather_sum(kv_ptr, idx_ptr, out_ptr, K, stride_ib, TILES: tl.constexpr, BLOCK_N: tl.constexpr,
                D: tl.constexpr, BLOCK_D: tl.constexpr):  # fmt: skip
    """Sum the KV rows of one (row, slice): TILES tiles of BLOCK_N indices; -1 rows are masked (no bytes)."""
    b = tl.program_id(0)
    s = tl.program_id(1)
    cols = tl.arange(0, BLOCK_D)
    acc = tl.zeros([BLOCK_D], tl.float32)
    for t in range(TILES):
        pos = (s * TILES + t) * BLOCK_N + tl.arange(0, BLOCK_N)
        idx = tl.load(idx_ptr + b * stride_ib + pos, mask=pos < K, other=-1)
        rows = tl.where(idx >= 0, idx, 0).to(tl.int64)
        tile = tl.load(
            kv_ptr + rows[:, None] * D + cols[None, :], mask=(idx >= 0)[:, None] & (cols[None, :] < D), other=0.0
        )
        acc += tl.sum(tile.to(tl.float32), axis=0)
    tl.store(out_ptr + (b * tl.num_programs(1) + s) * BLOCK_D + cols, acc)


def gather(kv: torch.Tensor, idx: torch.Tensor, out: torch.Tensor, splits: int, block_n: int, warps: int,
           stages: int) -> None:  # fmt: skip
    """Launch the read-only gather over B rows x ``splits`` slices."""
    b, k = idx.shape
    tiles = triton.cdiv(k, splits * block_n)
    _gather_sum[(b, splits)](kv, idx, out, k, idx.stride(0), TILES=tiles, BLOCK_N=block_n, D=kv.shape[1],
                             BLOCK_D=1024, num_warps=warps, num_stages=stages)  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    """Time every configuration at B = 32 and 128, both index orders; print a table; write JSON."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", metavar="FILE", help="write the rows here")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench_gather measures a CUDA GPU and none is visible", file=sys.stderr)
        return 2
    s, timer = QUICK, Timer(True)
    ceil = measure_ceilings(timer, "cuda")
    gen = torch.Generator(device="cuda").manual_seed(3)
    kv = torch.randn((s.pool_tokens, s.d_qk), generator=gen, device="cuda").to(torch.bfloat16)
    rows: list[dict[str, Any]] = []
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    print(f"copy ceiling {ceil['copy_bytes_per_s'] / 1e12:.2f} TB/s")
    for b in (32, 128):
        nbytes = b * s.topk * 2 * s.d_qk
        for order in ("random", "position"):
            cases = [bench_decode_case(gen, b, 16, 4096, s, order) for _ in range(rotation(nbytes, "cuda"))]
            for block_n, warps, stages, per_sm in CONFIGS:
                splits = max(1, min(s.topk // block_n, per_sm * sms // b))
                outs = [torch.empty((b * splits, 1024), device="cuda") for _ in cases]
                cfg = (splits, block_n, warps, stages)
                pairs = zip(cases, outs, strict=True)
                calls = [(lambda c=c, o=o, g=cfg: gather(kv, c.indices, o, *g)) for c, o in pairs]
                try:
                    med, _ = timer.time_rotated(calls)
                except Exception as exc:  # a configuration that does not compile is a result
                    print(f"B={b} {order} n{block_n} w{warps} s{stages}: {type(exc).__name__}")
                    continue
                row = {"B": b, "order": order, "block_n": block_n, "warps": warps, "stages": stages,
                       "splits": splits, "median_us": med, "TB_per_s": nbytes / (med * 1e-6) / 1e12,
                       "of_copy": nbytes / (med * 1e-6) / ceil["copy_bytes_per_s"]}  # fmt: skip
                rows.append(row)
                print(f"B={b:<4}{order:>9} n{block_n:<3}w{warps} s{stages} S={splits:<3}{med:8.1f} us "
                      f"{row['TB_per_s']:5.2f} TB/s {100 * row['of_copy']:5.1f}% of copy", flush=True)  # fmt: skip
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"environment": environment(True), "ceilings": ceil, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
