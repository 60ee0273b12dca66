"""Where split-K time goes in the Gluon decode kernels: the split kernel alone, the merge, and one split instead.

    python scripts/bench_split.py [--json FILE]

For each shape the mma backend runs with a Gluon kernel (H = 128: warpgroup; H = 16: mmasync; K = 2048 of a
4096-token context, as ``mla_kernels.bench --quick``), graph-timed over inputs 8x the L2:

- ``full``: ``decode`` as the backend runs it (split kernel, then the merge when S > 1);
- ``kernel``: the split kernel alone, same plan; ``full - kernel`` is what the merge adds in sequence;
- ``merge``: the merge alone over cold partials (each replay reads another set);
- ``bf16 part``: the split kernel storing into a bf16 partial buffer (the store converts), and the merge reading it:
  an experiment, not a supported path;
- ``one split``: ``decode`` with ``num_splits=1`` (fewer programs, no partials).

The copy and matmul ceilings are measured in the same run, as the benchmark does.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

import torch

from mla_kernels.bench import QUICK, Timer, bench_decode_case, environment, measure_ceilings, rotation

SHAPES = [(128, 32), (128, 64), (16, 32), (16, 64), (16, 128)]


def measure(timer: Any, kv: torch.Tensor, gen: torch.Generator, h: int, b: int) -> dict[str, Any]:
    """Time one shape's parts (``full``, ``kernel``, and with S > 1 the merge, bf16 partials and one split)."""
    from mla_kernels import mmasync, warpgroup
    from mla_kernels.merge import merge, outputs

    s = QUICK
    mod: Any = warpgroup if h % warpgroup.HEADS_PER_PROGRAM == 0 else mmasync
    cfg = warpgroup.WarpgroupConfig() if mod is warpgroup else mmasync.SyncConfig()
    cases = [bench_decode_case(gen, b, h, 4096, s) for _ in range(rotation(b * s.topk * 2 * s.d_qk, "cuda"))]
    plan = mod.plan(cases[0].q, s.topk, cfg)
    bufs = [outputs(c.q, 512, plan, None, None) for c in cases]

    def launch(c: Any, o: tuple[torch.Tensor, ...]) -> Any:
        return mod._launch(c.q, kv, c.indices, c.sm_scale, 512, cfg, plan, *o)

    def decode(c: Any, splits: int | None = None) -> Any:
        return mod.decode(c.q, kv, c.indices, c.sm_scale, 512, num_splits=splits)

    def merged(o: tuple[torch.Tensor, ...]) -> None:
        merge(o[2], o[3], o[0], o[1])

    row: dict[str, Any] = {"H": h, "B": b, "kernel_module": mod.__name__, "splits": plan.num_splits}
    row["full_us"] = timer.time_rotated([lambda c=c: decode(c) for c in cases])[0]
    row["kernel_us"] = timer.time_rotated([lambda c=c, o=o: launch(c, o) for c, o in zip(cases, bufs, strict=True)])[0]
    if plan.num_splits > 1:
        row["merge_cold_us"] = timer.time_rotated([lambda o=o: merged(o) for o in bufs])[0]
        half = [(o[0], o[1], o[2].to(torch.bfloat16), o[3]) for o in bufs]
        pairs = zip(cases, half, strict=True)
        row["kernel_bf16_part_us"] = timer.time_rotated([lambda c=c, o=o: launch(c, o) for c, o in pairs])[0]
        row["merge_bf16_part_us"] = timer.time_rotated([lambda o=o: merged(o) for o in half])[0]
        row["one_split_us"] = timer.time_rotated([lambda c=c: decode(c, 1) for c in cases])[0]
    return row


def main(argv: list[str] | None = None) -> int:
    """Time the parts of every shape; print a line each; write JSON."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", metavar="FILE", help="write the rows here")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] != 9:
        print("bench_split measures the Gluon kernels, which need a Hopper GPU; none is visible", file=sys.stderr)
        return 2
    timer = Timer(True)
    ceil = measure_ceilings(timer, "cuda")
    tf = ceil["bf16_flops_per_s"] / 1e12
    print(f"ceilings: copy {ceil['copy_bytes_per_s'] / 1e12:.2f} TB/s, matmul {tf:.0f} TFLOP/s")
    gen = torch.Generator(device="cuda").manual_seed(0)
    kv = torch.randn((QUICK.pool_tokens, QUICK.d_qk), generator=gen, device="cuda").to(torch.bfloat16)
    rows: list[dict[str, Any]] = []
    for h, b in SHAPES:
        row = measure(timer, kv, gen, h, b)
        rows.append(row)
        line = f"H={h:<4}B={b:<4}S={row['splits']:<2} full {row['full_us']:7.1f}  kernel {row['kernel_us']:7.1f}  "
        if row["splits"] > 1:
            line += (
                f"merge in sequence {row['full_us'] - row['kernel_us']:5.1f}, cold {row['merge_cold_us']:5.1f}  "
                f"bf16 partials: kernel {row['kernel_bf16_part_us']:7.1f}, merge {row['merge_bf16_part_us']:5.1f}  "
                f"one split {row['one_split_us']:7.1f}"
            )
        print(line, flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"environment": environment(True), "ceilings": ceil, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
