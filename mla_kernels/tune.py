"""MMA decode tuning sweep on the GPU: many kernel variants, each timed like the benchmark and checked for accuracy.

    python -m mla_kernels.tune [--json FILE] [--budget-s S] [--only NAME ...] [--round 1|2|3]

For every variant (a configuration plus a split target) and shape it reports the CUDA-graph median µs over rotating
inputs (mla_kernels.bench's method: pool ≫ L2, enough input sets to exceed 8x L2), the same without the merge kernel
(the split kernel alone), the fraction of the memory floor, the compiler's registers/spills/shared bytes, whether
the TTGIR has the pipeliner's async copies and how many KV tiles it keeps in flight, the matrix instruction, and
FlashMLA's closeness rule on the first two rows at sm_scale 0.1352 and 1/sqrt(576). A variant that fails to
compile, launch or finish within its time cap is recorded with its error, and the sweep goes on.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import time
from dataclasses import asdict, dataclass, replace
from typing import Any

import torch

from mla_kernels.bench import (
    FULL,
    Timer,
    bench_decode_case,
    decode_bytes_flops,
    environment,
    measure_ceilings,
    rotation,
)

VARIANT_CAP_S = 60  # one variant's compile + checks + timing


def v_split_h128() -> Any:
    """The H = 128 V-split configuration (mla_kernels.mma.MmaConfig), also compiled offline by mla_kernels.sass.

    Issue 15's H = 128 design, the H >= 64 default since 2026-12-03: ``default_config`` says what it is.
    """
    from mla_kernels.mma import default_config

    return default_config(128, 512)


@dataclass(frozen=True)
class Variant:
    """One point of the sweep: a kernel configuration at one shape."""

    name: str
    h: int
    b: int
    context: int
    cfg: Any  # MmaConfig, or a Gluon kernel's: warpgroup.WarpgroupConfig, mmasync.SyncConfig
    num_splits: int | None = None  # None: the config's own plan


def variants(round: int = 1) -> list[Variant]:
    """The sweep of ``round`` 1 or 2, most informative first (the budget may cut the tail)."""
    from mla_kernels.mma import MmaConfig as C
    from mla_kernels.mma import default_config

    h16 = {
        # the shipped default before this sweep (unused slots still gathered), then with masked gathers
        "old-default": C(16, 32, 4, 3, mask_rows=False),
        "n32-w4-s3": C(16, 32, 4, 3),
        # num_stages 5 is the first depth at which the pipeliner double-buffers the dependent KV gather
        "n32-w4-s5": C(16, 32, 4, 5),
        "n32-w4-s5-halves": C(16, 32, 4, 5, halves=True),
        "n32-w4-s5-halves-pdl": C(16, 32, 4, 5, halves=True, pdl=True),
        "n32-w4-s5-pdl": C(16, 32, 4, 5, pdl=True),
        "n32-w4-s5-pps1": C(16, 32, 4, 5, programs_per_sm=1),
        "n32-w4-s5-pps3": C(16, 32, 4, 5, programs_per_sm=3),
        "n32-w4-s5-pps4": C(16, 32, 4, 5, programs_per_sm=4),
        "n32-w8-s5-halves": C(16, 32, 8, 5, halves=True),
        "n16-w4-s7": C(16, 16, 4, 7),
        "n16-w4-s7-halves-pps3": C(16, 16, 4, 7, halves=True, programs_per_sm=3),
        "n16-w4-s6": C(16, 16, 4, 6),
        "n64-w8-s5-pps1": C(16, 64, 8, 5, programs_per_sm=1),
        "n64-w8-s3-pps1": C(16, 64, 8, 3, programs_per_sm=1),
        "swap-n64-w4-s3-pps1": C(16, 64, 4, 3, swap=True, programs_per_sm=1),
        "swap-n64-w8-s3-pps1": C(16, 64, 8, 3, swap=True, programs_per_sm=1),
        "swap-n64-w8-s3-pps1-pdl": C(16, 64, 8, 3, swap=True, programs_per_sm=1, pdl=True),
        "swap-n64-w8-s3-pps2": C(16, 64, 8, 3, swap=True, programs_per_sm=2),
        "swap-n64-w8-s4-pps1": C(16, 64, 8, 4, swap=True, programs_per_sm=1),
        "swap-n64-w4-s3-pps1-bf16p": C(16, 64, 4, 3, split_p=False, swap=True, programs_per_sm=1),
        "n32-w4-s5-bf16p": C(16, 32, 4, 5, split_p=False),
    }
    h128 = {
        "h128-default": C(32, 32, 8, 3),
        "h128-old-default": C(32, 32, 8, 3, mask_rows=False),
        "h128-n32-w8-s5": C(32, 32, 8, 5),
        "h128-n32-w8-s5-halves": C(32, 32, 8, 5, halves=True),
        "h128-swap-h32-n64-w8-s3": C(32, 64, 8, 3, swap=True),
        "h128-swap-h32-n64-w8-s3-pps1": C(32, 64, 8, 3, swap=True, programs_per_sm=1),
        "h128-vsplit-h64-n16-w4-s3": v_split_h128(),
    }
    # Round 2 (after the first sweep): the chosen defaults at more batch sizes, and the leads the first round left.
    d16 = default_config(16, 512)
    vs = v_split_h128()
    wide = C(16, 64, 8, 5, halves=True, programs_per_sm=1, whole_wave=True)
    round2 = [
        Variant("default", 16, 32, 4096, d16),
        Variant("default", 16, 64, 4096, d16),
        Variant("default", 16, 128, 4096, d16),
        Variant("default", 16, 32, 1024, d16),
        Variant("default-bf16p", 16, 32, 4096, replace(d16, split_p=False)),
        Variant("n64-w8-s5-halves-ww1", 16, 32, 4096, wide),
        Variant("n64-w8-s5-halves-ww1", 16, 128, 4096, wide),
        Variant("n32-w4-s5-halves-ww2-s4", 16, 32, 4096, replace(d16, num_stages=4)),
        # The H = 128 default (the V split) is timed below under its own name; the previous default beside it.
        Variant("h128-swap-h32-n64-w8-s3-pps1", 128, 32, 4096, C(32, 64, 8, 3, swap=True, programs_per_sm=1)),
        Variant("h128-swap-h32-n64-w8-s3-pps1", 128, 128, 4096, C(32, 64, 8, 3, swap=True, programs_per_sm=1)),
        Variant("h128-swap-h32-n64-w8-s3-ww1", 128, 32, 4096, C(32, 64, 8, 3, swap=True, whole_wave=True)),
        Variant("h128-swap-h64-n64-w8-s3-pps1", 128, 32, 4096, C(64, 64, 8, 3, swap=True, programs_per_sm=1)),
        Variant("h128-vsplit-h64-n16-w4-s3", 128, 32, 4096, vs),
        Variant("h128-vsplit-h64-n16-w4-s3", 128, 128, 4096, vs),
    ]
    # Round 3 (issue 15, H = 16 occupancy): the V split at 16 heads, one latent half of p·V a program, so that a
    # program holds one 16 x 256 accumulator: 123-168 registers offline (the default: 232), three or four programs
    # per SM instead of two; the pair's second gather of each tile should come from L2. The default beside them.
    round3 = []
    for b in (32, 128):
        round3.append(Variant("default", 16, b, 4096, d16))
        for n, st, pps in ((16, 6, 3), (16, 5, 4), (16, 4, 4), (32, 4, 3), (32, 5, 2)):
            cfg = C(16, n, 4, st, halves=True, v_split=True, programs_per_sm=pps, whole_wave=True)
            round3.append(Variant(f"vsplit-n{n}-w4-s{st}-pps{pps}", 16, b, 4096, cfg))
    # Round 4 (issue 15, H >= 64): the Gluon warpgroup kernel (mla_kernels.warpgroup) against the V split: tile rows
    # and buffers, bf16 p, and one head group (H = 64). Two forms timed on 2026-12-04 and then removed, both slower
    # at every B (docs/kernels.md): q·K of the next tile issued before the softmax, and scores computed by both
    # warpgroups.
    from mla_kernels.warpgroup import WarpgroupConfig as W

    round4 = []
    for b in (32, 64, 128):
        round4.append(Variant("mma-default", 128, b, 4096, vs))
        for name, wcfg in (
            ("wg-n64-b2", W()),
            ("wg-n64-b2-bf16p", W(split_p=False)),
            ("wg-n32-b3", W(block_n=32, num_buf=3)),
            ("wg-n32-b4", W(block_n=32, num_buf=4)),
            ("wg-n16-b6", W(block_n=16, num_buf=6)),
        ):
            round4.append(Variant(name, 128, b, 4096, wcfg))
    round4 += [Variant("mma-default", 64, 32, 4096, default_config(64, 512)), Variant("wg-n64-b2", 64, 32, 4096, W())]
    # Round 5 (issue 15, H = 16): the Gluon mma.sync kernel (mla_kernels.mmasync), q in shared memory, against the
    # tl.dot default; its 16-row forms fit three or four programs per SM (128 registers). A form reading q from L1/L2
    # every tile instead (three programs per SM at 32 rows) measured about 2x slower and is gone (docs/kernels.md).
    from mla_kernels.mmasync import SyncConfig as Y

    round5 = []
    for b in (32, 64, 128):
        round5.append(Variant("mma-default", 16, b, 4096, d16))
        for name, ycfg in (
            ("sync-n32-b2-pps2", Y()),
            ("sync-n16-b3-pps3", Y(block_n=16, num_buf=3, programs_per_sm=3)),
            ("sync-n16-b2-pps4", Y(block_n=16, num_buf=2, programs_per_sm=4)),
        ):
            round5.append(Variant(name, 16, b, 4096, ycfg))
    if round == 5:
        return round5
    if round == 2:
        return round2
    if round == 4:
        return round4
    if round == 3:
        return round3
    out = [Variant(n, 16, 32, 4096, c) for n, c in h16.items()]
    out += [Variant(n, 128, 32, 4096, c) for n, c in h128.items()]
    out += [Variant(n, 16, 128, 4096, c) for n, c in h16.items() if "bf16p" not in n]
    out += [Variant(n, 16, 32, 1024, h16[n]) for n in ("old-default", "n32-w4-s5", "swap-n64-w8-s3-pps1")]
    return out


class Cap:
    """Raise TimeoutError in the main thread after ``seconds`` (SIGALRM), so one stuck variant cannot eat the run."""

    def __init__(self, seconds: int) -> None:
        self.seconds = seconds

    def __enter__(self) -> None:
        def fire(signum: int, frame: object) -> None:
            raise TimeoutError(f"variant exceeded {self.seconds} s")

        signal.signal(signal.SIGALRM, fire)
        signal.alarm(self.seconds)

    def __exit__(self, *exc: object) -> None:
        signal.alarm(0)


def run_variant(
    v: Variant, kv: torch.Tensor, cases: list[Any], refs: dict[float, Any], timer: Timer, ceil: dict
) -> dict:
    """Compile, check and time one variant; return its row."""
    from mla_kernels import mma, mmasync, warpgroup
    from mla_kernels.accuracy import compare
    from mla_kernels.merge import outputs

    # The Gluon kernels' modules have the same functions as mma's.
    mod: Any = mma
    if isinstance(v.cfg, warpgroup.WarpgroupConfig):
        mod = warpgroup
    elif isinstance(v.cfg, mmasync.SyncConfig):
        mod = mmasync
    s = FULL
    c0 = cases[0]
    ns = v.num_splits
    asm = mod.matrix_instructions(c0.q, kv, c0.indices, c0.sm_scale, s.d_v, config=v.cfg, num_splits=ns)
    checks = {}
    for scale, (case, ref) in refs.items():
        out, lse = mod.decode(case.q, kv, case.indices, scale, s.d_v, config=v.cfg, num_splits=ns)
        checks[f"{scale:.4f}"] = compare(out[:2], lse[:2], *ref)
    calls = [
        (lambda c=c: mod.decode(c.q, kv, c.indices, c.sm_scale, s.d_v, config=v.cfg, num_splits=ns)) for c in cases
    ]
    med, p90 = timer.time_rotated(calls)
    # Graph replays twice more on the last inputs: a kernel that keeps state between calls would differ.
    again = [mod.decode(c0.q, kv, c0.indices, c0.sm_scale, s.d_v, config=v.cfg, num_splits=ns) for _ in range(2)]
    repeat_ok = bool(torch.equal(again[0][0], again[1][0]) and torch.equal(again[0][1], again[1][1]))
    plan = mod.plan(c0.q, s.topk, v.cfg, ns)
    split_only = float("nan")
    if plan.num_splits > 1:
        # The split kernel alone, into buffers made outside the graph: the merge's share is the difference.
        bufs = [outputs(c.q, s.d_v, plan, None, None) for c in cases]
        only = [
            (lambda c=c, o=o: mod._launch(c.q, kv, c.indices, c.sm_scale, s.d_v, v.cfg, plan, *o))
            for c, o in zip(cases, bufs, strict=True)
        ]
        split_only, _ = timer.time_rotated(only)
    k_valid = min(s.topk, v.context)
    nbytes, flops = decode_bytes_flops(v.b, v.h, k_valid, s)
    floor = max(nbytes / ceil["copy_bytes_per_s"], flops / ceil["bf16_flops_per_s"]) * 1e6
    return {
        "median_us": med,
        "p90_us": p90,
        "split_kernel_us": split_only,
        "floor_us": floor,
        "fraction_of_floor": floor / med,
        "GB_per_s": nbytes / (med * 1e-6) / 1e9,
        "splits": plan.num_splits,
        "tiles_per_split": plan.tiles_per_split,
        "rotation": len(cases),
        "asm": asm,
        "repeat_identical": repeat_ok,
        "checks_ok": all(c.ok for c in checks.values()) and repeat_ok,
        "checks": {k: str(c) for k, c in checks.items()},
    }


def line(r: dict[str, Any]) -> str:
    """One row of the printed table."""
    if "error" in r:
        return f"{r['name']:<30} H={r['H']:<3} B={r['B']:<3} L={r['L']:<4}  ERROR {r['error'][:150]}"
    a = r["asm"]
    mmai = "wgmma" if a.get("wgmma") else "mma.sync"
    return (
        f"{r['name']:<30} H={r['H']:<3} B={r['B']:<3} L={r['L']:<4} {r['median_us']:7.1f} us  "
        f"{100 * r['fraction_of_floor']:5.1f}%  split-only {r['split_kernel_us']:6.1f}  S={r['splits']:<2} "
        f"regs {a.get('registers')}/{a.get('spills')} smem {a.get('shared_bytes')} async {a.get('async_copies')} "
        f"bufs {a.get('kv_buffers')} {mmai}  {'ok' if r['checks_ok'] else 'FAIL ' + str(r['checks'])}"
    )


def main(argv: list[str] | None = None) -> int:
    """Run the sweep; print one line per variant and a table sorted by time; write JSON after every variant."""
    parser = argparse.ArgumentParser(prog="python -m mla_kernels.tune", description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", metavar="FILE", help="write all rows here as JSON")
    parser.add_argument("--budget-s", type=float, default=400.0, help="start no new variant after this many seconds")
    parser.add_argument("--only", nargs="*", default=None, help="run only the variants with these names")
    parser.add_argument(
        "--round",
        type=int,
        default=1,
        choices=[1, 2, 3, 4, 5],
        help="which sweep (2: later round; 3: H = 16 V split; 4: Gluon warpgroup kernel; 5: Gluon mma.sync kernel)",
    )
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("mla_kernels.tune measures a CUDA GPU and none is visible", file=sys.stderr)
        return 2
    from mla_kernels import reference

    t_start = time.monotonic()
    s, timer, dev = FULL, Timer(True), "cuda"
    ceil = measure_ceilings(timer, dev)
    print(
        f"ceilings: copy {ceil['copy_bytes_per_s'] / 1e12:.2f} TB/s, matmul {ceil['bf16_flops_per_s'] / 1e12:.0f} TF/s"
    )
    gen = torch.Generator(device=dev).manual_seed(5)
    kv = torch.randn((s.pool_tokens, s.d_qk), generator=gen, device=dev).to(torch.bfloat16)
    env = environment(True)
    env["command"] = "python -m mla_kernels.tune " + " ".join(sys.argv[1:] if argv is None else argv)
    report: dict[str, Any] = {"environment": env, "ceilings": ceil, "rows": []}
    shape_cache: dict[tuple[int, int, int], Any] = {}
    todo = [v for v in variants(args.round) if args.only is None or v.name in args.only]
    for v in todo:
        if time.monotonic() - t_start > args.budget_s:
            print(f"budget spent: skipping {v.name} H={v.h} B={v.b} L={v.context}", flush=True)
            continue
        key = (v.h, v.b, v.context)
        if key not in shape_cache:
            nbytes, _ = decode_bytes_flops(v.b, v.h, min(s.topk, v.context), s)
            cases = [bench_decode_case(gen, v.b, v.h, v.context, s) for _ in range(rotation(nbytes, dev))]
            refs = {}
            for scale in (0.1352, s.d_qk**-0.5):
                case = cases[0] if scale == 0.1352 else bench_decode_case(gen, v.b, v.h, v.context, s)
                q2, i2 = case.q[:2].double(), case.indices[:2]
                rows = kv[i2.clamp(min=0).reshape(-1).long()].double()  # only the rows the check needs
                local = torch.arange(i2.numel(), device=dev, dtype=torch.int32).reshape(i2.shape)
                local = torch.where(i2 >= 0, local, torch.full_like(local, -1))
                ref = reference.decode(q2, rows, local, scale, s.d_v, compute_dtype=torch.float64)
                refs[scale] = (case, ref)
            shape_cache = {key: (cases, refs)}  # one shape's inputs at a time (B=128 sets are large)
        cases, refs = shape_cache[key]
        row: dict[str, Any] = {"name": v.name, "H": v.h, "B": v.b, "L": v.context, "config": asdict(v.cfg),
                               "num_splits": v.num_splits}  # fmt: skip
        t0 = time.monotonic()
        try:
            with Cap(VARIANT_CAP_S):
                row.update(run_variant(v, kv, cases, refs, timer, ceil))
        except Exception as exc:  # a variant that fails is a result, not the end of the sweep
            row["error"] = f"{type(exc).__name__}: {exc}"[:400]
        row["wall_s"] = round(time.monotonic() - t0, 1)
        report["rows"].append(row)
        print(line(row), flush=True)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(report, f, indent=1)
    print("\n== sorted by median µs (per shape) ==")
    ok = [r for r in report["rows"] if "error" not in r]
    for r in sorted(ok, key=lambda r: (r["H"], r["B"], r["L"], r["median_us"])):
        print(line(r))
    print(f"total {time.monotonic() - t_start:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
