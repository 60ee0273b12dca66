# Over 500 lines: one tool (python -m mla_kernels.bench): timing harness, measured ceilings, cases, report tables.
"""Benchmark: sparse-MLA decode backends and the lightning indexer against ceilings measured in the same run.

    python -m mla_kernels.bench [--json FILE] [--sweep] [--smoke]

Measures a large device-to-device copy (bytes read + written) and a large bf16 matmul first; every decode shape is
then reported as median and p90 µs, effective GB/s, TFLOP/s and the fraction of its floor
max(bytes / copy rate, FLOPs / matmul rate), with bytes and FLOPs from ../shared/reference-kernels.md §4. The KV
pool is 1M tokens (1.15 GB, far larger than L2). The headline time is per call inside a CUDA graph that cycles
through enough distinct input sets to exceed 8x L2 (no launch overhead, no cache reuse); ``eager_us`` is one call
launched from Python with do_bench clearing L2 first (includes host launch overhead). ``--sweep`` adds
a small MMA configuration sweep; ``--smoke`` runs tiny shapes (on CPU under TRITON_INTERPRET=1) to check the script;
``--quick`` only the shapes the goals are judged at (H=16 B=32 and 128, H=128 B=32; L=4096), decode only.

The SIMT backends are also judged against their own floor, max(bytes / copy rate, FLOPs / CUDA-core FMA rate), with
the FMA rate measured in the same run (mla_kernels.simt_tiled.fma_probe: independent FMA chains, nothing else).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import torch

D_QK, D_V, TOPK, LAYERS = 576, 512, 2048, 61
KV_BYTES = 2 * D_QK  # bf16 row
IDX_TOKEN_BYTES = 132 + 8  # FP8 index key + scale, plus fp32 logit written and read
SIMT_SPEC_FLOPS = 67e12  # H100/H200 fp32 non-tensor datasheet rate
# The SIMT rows: the stock per-head kernel, the tiled one at its default, at half the heads per program, unpipelined.
SIMT_BACKENDS = ("simt", "simt-tiled", "simt-tiled-h8", "simt-tiled-s1")
COMMAND = "python -m mla_kernels.bench"


@dataclass
class Shapes:
    """Which problems the run measures."""

    heads: tuple[int, ...]
    batches: tuple[int, ...]
    contexts: tuple[int, ...]
    topk: int
    d_qk: int
    d_v: int
    pool_tokens: int
    index_batches: tuple[int, ...]
    index_contexts: tuple[int, ...]
    index_max: int
    index_heads: int
    index_dim: int


FULL = Shapes(
    heads=(16, 128),
    batches=(1, 8, 32, 128),
    contexts=(1024, 4096, 32768),
    topk=TOPK,
    d_qk=D_QK,
    d_v=D_V,
    pool_tokens=1 << 20,
    index_batches=(1, 8, 32, 128),
    index_contexts=(1024, 4096, 16384, 65536),
    index_max=131072,
    index_heads=64,
    index_dim=128,
)
QUICK = Shapes(
    heads=(16, 128),
    batches=(32, 128),
    contexts=(4096,),
    topk=TOPK,
    d_qk=D_QK,
    d_v=D_V,
    pool_tokens=1 << 20,
    index_batches=(),
    index_contexts=(),
    index_max=131072,
    index_heads=64,
    index_dim=128,
)
# (H, B) pairs that --quick measures (H=128 B=128 left out: the stock SIMT kernel alone takes ~50 ms a call there),
# and the backends it leaves out (the unpipelined tiled SIMT form costs more compiles than its row tells).
QUICK_PAIRS = {(16, 32), (16, 128), (128, 32)}
QUICK_SKIP = {"simt-tiled-s1"}
SMOKE = Shapes(
    heads=(4,),
    batches=(2,),
    contexts=(256,),
    topk=128,
    d_qk=80,
    d_v=64,
    pool_tokens=4096,
    index_batches=(2,),
    index_contexts=(256,),
    index_max=1024,
    index_heads=8,
    index_dim=32,
)


class Timer:
    """Median and p90 of a callable, in µs: CUDA events via triton.testing on a GPU, wall clock on CPU."""

    def __init__(self, cuda: bool) -> None:
        self.cuda = cuda

    def time(self, fn: Callable[[], object]) -> tuple[float, float]:
        if self.cuda:
            import triton.testing

            med, p90 = triton.testing.do_bench(fn, warmup=15, rep=60, quantiles=[0.5, 0.9])
            return med * 1e3, p90 * 1e3
        fn()
        runs = []
        for _ in range(3):
            t0 = time.perf_counter()
            fn()
            runs.append((time.perf_counter() - t0) * 1e6)
        return statistics.median(runs), max(runs)

    def time_graph(self, fn: Callable[[], object]) -> float:
        import triton.testing

        med, _ = triton.testing.do_bench_cudagraph(fn, rep=50, quantiles=[0.5, 0.9])
        return float(med) * 1e3

    def time_rotated(self, calls: list[Callable[[], object]], budget_s: float = 0.2) -> tuple[float, float]:
        """Median and p90 µs per call of ``calls`` captured back to back in one CUDA graph and replayed.

        The graph removes host launch overhead (what a CUDA-graph server sees); the calls use different inputs
        whose bytes together exceed L2 several times, so replays do not measure the cache.
        """
        if not self.cuda:
            med, p90 = self.time(lambda: [c() for c in calls])
            return med / len(calls), p90 / len(calls)
        for c in calls:
            c()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for c in calls:
                c()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for c in calls:
                c()
        graph.replay()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        graph.replay()
        torch.cuda.synchronize()
        n = int(min(100, max(5, budget_s / max(time.perf_counter() - t0, 1e-6))))
        events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(n)]
        for start, end in events:
            start.record()
            graph.replay()
            end.record()
        torch.cuda.synchronize()
        per = sorted(a.elapsed_time(b) * 1e3 / len(calls) for a, b in events)
        return statistics.median(per), per[int(0.9 * (len(per) - 1))]


def measure_ceilings(timer: Timer, device: str) -> dict[str, float]:
    """Copy bandwidth (bytes read + written per second), bf16 matmul and CUDA-core fp32 FMA FLOP/s, measured now."""
    n = (1 << 30) // 2 if timer.cuda else 1 << 20
    src = torch.randn(n, device=device).to(torch.bfloat16)
    dst = torch.empty_like(src)
    copy_us, _ = timer.time(lambda: dst.copy_(src))
    m = 8192 if timer.cuda else 256
    a = torch.randn((m, m), device=device).to(torch.bfloat16)
    b = torch.randn((m, m), device=device).to(torch.bfloat16)
    mm_us, _ = timer.time(lambda: a @ b)
    return {
        "copy_bytes_per_s": 2 * n * 2 / (copy_us * 1e-6),
        "bf16_flops_per_s": 2 * m**3 / (mm_us * 1e-6),
        "fma_flops_per_s": fma_rate(timer, device),
    }


def fma_rate(timer: Timer, device: str) -> float:
    """CUDA-core fp32 FLOP/s of the FMA probe kernel: 16 programs of 1024 elements per SM, 4 chains each."""
    from mla_kernels.device import program_slots
    from mla_kernels.simt_tiled import fma_probe

    out = torch.empty(16 * 1024 * program_slots(torch.empty(0, device=device)), device=device)
    iters = 4096 if timer.cuda else 2
    flops = fma_probe(out, iters)
    us, _ = timer.time(lambda: fma_probe(out, iters))
    return flops / (us * 1e-6)


def launch_floor(timer: Timer) -> dict[str, float]:
    """Two empty Triton launches back to back: eager and replayed from a CUDA graph (µs)."""
    from mla_kernels.merge import empty_kernel

    def two() -> None:
        empty_kernel[(1,)]()
        empty_kernel[(1,)]()

    return {"eager_us": timer.time(two)[0], "graph_us": timer.time_graph(two)}


def bench_decode_case(gen: torch.Generator, b: int, h: int, context: int, s: Shapes, order: str = "random") -> Any:
    """q, the shared pool and per-row indices: each row's context is ``context`` tokens on random pages of the pool,
    and its top-k are distinct tokens of that context (-1 past the context when it is shorter than top-k).

    ``order`` "random" lists a row's picks in random order (FlashMLA's benchmark); "position" in context order, as
    ``indexer_topk`` emits them (runs of ascending slots within each page)."""
    from mla_kernels.cases import DecodeCase

    dev = gen.device
    q = torch.randn((b, h, s.d_qk), generator=gen, device=dev).to(torch.bfloat16)
    pages = s.pool_tokens // 64
    rows = []
    for _ in range(b):
        own = torch.randperm(pages, generator=gen, device=dev)[: max(1, context // 64)]
        tokens = (own[:, None] * 64 + torch.arange(64, device=dev)).reshape(-1)[:context]
        chosen = torch.randperm(tokens.numel(), generator=gen, device=dev)[: s.topk]
        pick = tokens[chosen.sort().values if order == "position" else chosen]
        row = torch.full((s.topk,), -1, dtype=torch.int64, device=dev)
        row[: pick.numel()] = pick
        rows.append(row)
    return DecodeCase(q, torch.empty(0), torch.stack(rows).to(torch.int32), 0.1352, s.d_v)


def decode_bytes_flops(b: int, h: int, k_valid: int, s: Shapes) -> tuple[float, float]:
    """Ideal HBM bytes and tensor FLOPs of one decode call (reference-kernels.md §4)."""
    kv_row = 2 * s.d_qk
    bytes_ = b * (k_valid * kv_row + s.topk * 4 + h * (2 * s.d_qk + 2 * s.d_v))
    flops = 2 * b * h * k_valid * (s.d_qk + s.d_v)
    return float(bytes_), float(flops)


def rotation(nbytes: float, device: str) -> int:
    """How many distinct input sets to cycle through so that together they are 8x the L2 (at most 64)."""
    if device != "cuda":
        return 1  # the CPU smoke run checks the script, not the cache
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    return int(max(1, min(64, -(-8 * l2 // max(int(nbytes), 1)))))


def decode_backends() -> list[tuple[str, Any, Any]]:
    """(row name, module, config or None) of every decode backend the table times."""
    from mla_kernels import mma, reference, simt, simt_tiled

    return [
        ("torch", reference, None),
        ("simt", simt, None),
        ("simt-tiled", simt_tiled, None),
        ("simt-tiled-h8", simt_tiled, simt_tiled.HALF_HEADS_CONFIG),
        ("simt-tiled-s1", simt_tiled, simt_tiled.UNPIPELINED_CONFIG),
        ("mma", mma, None),
        # The Triton tl.dot kernel at its own default, where "mma" runs a Gluon kernel instead (on Hopper, issue 15);
        # "mma-tl" rows are left out where the two are the same kernel.
        ("mma-tl", mma, None),  # its config, mma.default_config(H, D_v), is set per shape
    ]


def run_decode(
    timer: Timer,
    s: Shapes,
    ceil: dict[str, float],
    device: str,
    pairs: set[tuple[int, int]] | None = None,
    skip: frozenset[str] = frozenset(),
    order: str = "random",
) -> list[dict[str, Any]]:
    """Time every backend but ``skip`` on every decode shape (only the (H, B) ``pairs`` when given); spot-check every
    backend's first rows against float64."""
    from mla_kernels import mma, reference, simt, simt_tiled
    from mla_kernels.accuracy import compare
    from mla_kernels.merge import plan_splits

    gen = torch.Generator(device=device).manual_seed(0)
    kv = torch.randn((s.pool_tokens, s.d_qk), generator=gen, device=device).to(torch.bfloat16)
    rows: list[dict[str, Any]] = []
    for h in s.heads:
        for b in s.batches:
            if pairs is not None and (h, b) not in pairs:
                continue
            for context in s.contexts:
                k_valid = min(s.topk, context)
                nbytes, flops = decode_bytes_flops(b, h, k_valid, s)
                cases = [bench_decode_case(gen, b, h, context, s, order) for _ in range(rotation(nbytes, device))]
                case = cases[0]
                t_mem = nbytes / ceil["copy_bytes_per_s"]
                t_tc = flops / ceil["bf16_flops_per_s"]
                floor = max(t_mem, t_tc)
                q2, i2 = case.q[:2].double(), case.indices[:2]
                ref = reference.decode(q2, kv.double(), i2, case.sm_scale, s.d_v, compute_dtype=torch.float64)
                gluon_kernel = mma.gluon_module(case.q, kv, s.d_v)
                for name, mod, cfg in decode_backends():
                    if name in skip:
                        continue
                    if name == "mma-tl":
                        if gluon_kernel is None:
                            continue
                        cfg = mma.default_config(h, s.d_v)
                    kw = {} if cfg is None else {"config": cfg}
                    calls = [
                        (lambda mod=mod, c=c, kw=kw: mod.decode(c.q, kv, c.indices, c.sm_scale, s.d_v, **kw))
                        for c in cases
                    ]
                    out, lse = calls[0]()
                    check = compare(out[:2], lse[:2], *ref)
                    med, p90 = timer.time_rotated(calls)
                    eager, _ = timer.time(calls[0])
                    t = med * 1e-6
                    if name == "mma" and gluon_kernel is not None:
                        plan = gluon_kernel.plan(case.q, s.topk)
                    elif name.startswith("mma"):
                        plan = mma.plan(case.q, s.topk, mma.default_config(h, s.d_v))
                    elif name == "simt":
                        plan = plan_splits(case.q, s.topk, simt.DEFAULT_CONFIG.block_n, b * h)
                    elif name.startswith("simt-tiled"):
                        plan = simt_tiled.plan(case.q, s.topk, cfg or simt_tiled.DEFAULT_CONFIG)
                    splits = 1 if name == "torch" else plan.num_splits
                    split_bytes = 0 if splits == 1 else 2 * b * h * splits * (s.d_v + 1) * 4
                    row = {
                        "backend": name,
                        # Which kernel the row timed: "mma" is a Gluon kernel where one applies.
                        "kernel": mma.kernel_name(case.q, kv, s.d_v) if name == "mma" and gluon_kernel else name,
                        "H": h,
                        "B": b,
                        "L": context,
                        "K_valid": k_valid,
                        "index_order": order,
                        "median_us": med,
                        "p90_us": p90,
                        "rotation": len(cases),
                        "eager_us": eager,
                        "GB_per_s": nbytes / t / 1e9,
                        "TFLOP_per_s": flops / t / 1e12,
                        "floor_us": floor * 1e6,
                        "floor_kind": "memory" if t_mem >= t_tc else "tensor",
                        "fraction_of_floor": floor / t,
                        "bytes": nbytes,
                        "split_bytes": split_bytes,
                        "splits": splits,
                        "flops": flops,
                        "tokens_per_s_61_layers": b / (LAYERS * t),
                        "check_ok": check.ok,
                        "check": str(check),
                    }
                    if name in SIMT_BACKENDS:
                        # The CUDA-core floor: FLOPs at the measured FMA rate, or the bytes, whichever is longer.
                        t_fma = flops / ceil["fma_flops_per_s"]
                        row["simt_floor_us"] = max(t_fma, t_mem) * 1e6
                        row["simt_floor_kind"] = "fma" if t_fma >= t_mem else "memory"
                        row["fraction_of_simt_floor"] = max(t_fma, t_mem) / t
                        row["fraction_of_fma_spec"] = flops / SIMT_SPEC_FLOPS / t
                    rows.append(row)
                    print(_decode_line(row), flush=True)
    return rows


def _decode_line(r: dict[str, Any]) -> str:
    graph = f" eager {r['eager_us']:8.1f} x{r['rotation']}"
    return (
        f"{r['backend']:>13} H={r['H']:<3} B={r['B']:<3} L={r['L']:<5} {r['median_us']:9.1f} us"
        f" (p90 {r['p90_us']:8.1f})"
        f" {r['GB_per_s']:7.0f} GB/s {r['TFLOP_per_s']:6.1f} TF/s  {100 * r['fraction_of_floor']:5.1f}% of "
        f"{r['floor_kind']} floor {r['floor_us']:7.1f} us  S={r['splits']:<2}{graph}  "
        + (f"{100 * r['fraction_of_simt_floor']:5.1f}% of simt floor  " if "simt_floor_us" in r else "")
        + ("ok" if r["check_ok"] else "FAIL")
    )


def run_gather(timer: Timer, s: Shapes, ceil: dict[str, float], device: str) -> dict[str, float]:
    """Random-row gather over the pool with torch.index_select: the realistic ceiling for the KV reads."""
    gen = torch.Generator(device=device).manual_seed(1)
    kv = torch.randn((s.pool_tokens, s.d_qk), generator=gen, device=device).to(torch.bfloat16)
    idx = torch.randint(0, s.pool_tokens, (128 * s.topk,), generator=gen, device=device)
    med, _ = timer.time(lambda: kv.index_select(0, idx))
    moved = 2 * idx.numel() * 2 * s.d_qk
    return {"rows": idx.numel(), "median_us": med, "GB_per_s": moved / (med * 1e-6) / 1e9}


def run_indexer(timer: Timer, s: Shapes, ceil: dict[str, float], device: str) -> list[dict[str, Any]]:
    """Length-aware vs naive indexer at M = L and at the maximum context, for each (B, L)."""
    from mla_kernels import indexer
    from mla_kernels.cases import indexer_case, with_pages

    dtype = torch.float8_e4m3fn
    gen = torch.Generator(device=device).manual_seed(2)
    rows: list[dict[str, Any]] = []
    for b in s.index_batches:
        for context in s.index_contexts:
            full = indexer_case(
                gen,
                lengths=[context] * b,
                pages=s.index_max // 64,
                heads=s.index_heads,
                dim=s.index_dim,
                pool_pages=max(b * context // 64, 64),
                dtype=dtype,
            )
            floor = b * context * IDX_TOKEN_BYTES / ceil["copy_bytes_per_s"]
            for m in sorted({context, s.index_max}):
                case = with_pages(full, m // 64)
                for name, fn in (("aware", indexer.lightning_indexer), ("naive", indexer.naive_indexer_topk)):

                    def call(fn: Any = fn, c: Any = case) -> Any:
                        return fn(c.q, c.weights, c.k_cache, c.k_scale, c.page_table, c.lengths, s.topk)

                    med, p90 = timer.time_rotated([call])
                    eager, _ = timer.time(call)
                    row = {
                        "eager_us": eager,
                        "form": name,
                        "B": b,
                        "L": context,
                        "M": m,
                        "median_us": med,
                        "p90_us": p90,
                        "floor_us": floor * 1e6,
                        "fraction_of_floor": floor / (med * 1e-6),
                    }
                    rows.append(row)
            for name in ("aware", "naive"):
                at = {r["M"]: r["median_us"] for r in rows if r["form"] == name and r["B"] == b and r["L"] == context}
                ratio = at[s.index_max] / at[context]
                print(
                    f"indexer {name:>5} B={b:<3} L={context:<5} M=L {at[context]:8.1f} us  M={s.index_max} "
                    f"{at[s.index_max]:8.1f} us  ratio {ratio:5.2f}  floor {floor * 1e6:6.1f} us",
                    flush=True,
                )
    return rows


def run_sweep(timer: Timer, s: Shapes, device: str) -> list[dict[str, Any]]:
    """A few MMA configurations and split counts at B=32, L=4096, timed like the table, with their instructions.

    The wider sweep behind the defaults is ``python -m mla_kernels.tune``.
    """
    from mla_kernels import mma

    gen = torch.Generator(device=device).manual_seed(3)
    kv = torch.randn((s.pool_tokens, s.d_qk), generator=gen, device=device).to(torch.bfloat16)
    C = mma.MmaConfig
    plans = {
        16: [(mma.default_config(16, s.d_v), None), (C(16, 32, 4, 3, mask_rows=False), None), (C(16, 32, 4, 5), None),
             (C(16, 32, 4, 5, halves=True, split_p=False, whole_wave=True), None),
             (C(16, 32, 4, 5, halves=True, whole_wave=True), 4), (C(16, 32, 4, 5, halves=True, whole_wave=True), 16),
             (C(16, 64, 8, 5, programs_per_sm=1), None), (C(16, 64, 8, 3, swap=True, programs_per_sm=1), None)],
        128: [(mma.default_config(128, s.d_v), None), (C(32, 32, 8, 3), None), (C(32, 32, 8, 5, halves=True), None),
              (C(64, 32, 8, 2, split_p=False), None), (C(32, 64, 8, 3, swap=True, programs_per_sm=2), None),
              (C(32, 64, 8, 3, swap=True, programs_per_sm=1), None)],  # the default before the V split
    }  # fmt: skip
    rows: list[dict[str, Any]] = []
    for h, configs in plans.items():
        b = 32
        nbytes, _ = decode_bytes_flops(b, h, s.topk, s)
        cases = [bench_decode_case(gen, b, h, 4096, s) for _ in range(rotation(nbytes, device))]
        for cfg, splits in configs:
            try:
                c0 = cases[0]
                asm = mma.matrix_instructions(c0.q, kv, c0.indices, c0.sm_scale, s.d_v, config=cfg, num_splits=splits)
                calls = [
                    (
                        lambda c=c, cfg=cfg, splits=splits: mma.decode(
                            c.q, kv, c.indices, c.sm_scale, s.d_v, config=cfg, num_splits=splits
                        )
                    )
                    for c in cases
                ]
                med, _ = timer.time_rotated(calls)
                err = ""
            except Exception as exc:  # a config that does not compile is a result, not a crash
                med, asm, err = float("nan"), {}, f"{type(exc).__name__}: {exc}"[:300]
            row = {"H": h, "B": b, "config": asdict(cfg), "splits": splits, "median_us": med, "asm": asm}
            if err:
                row["error"] = err
            rows.append(row)
            print(f"sweep H={h} B={b} {asdict(cfg)} splits={splits} {med:8.1f} us {asm} {err}", flush=True)
    return rows


def instructions(s: Shapes, device: str) -> dict[str, Any]:
    """The default MMA kernel's matrix instructions at H=16 and H=128 (B=32, K=2048)."""
    from mla_kernels import mma

    gen = torch.Generator(device=device).manual_seed(4)
    kv = torch.randn((s.pool_tokens, s.d_qk), generator=gen, device=device).to(torch.bfloat16)
    res = {}
    for h in s.heads:
        case = bench_decode_case(gen, 32 if device == "cuda" else 2, h, 4096, s)
        res[f"H={h}"] = {"config": asdict(mma.default_config(h, s.d_v))}
        if device == "cuda":
            res[f"H={h}"].update(mma.matrix_instructions(case.q, kv, case.indices, case.sm_scale, s.d_v))
    return res


def environment(cuda: bool) -> dict[str, Any]:
    import triton

    env = {
        "date_utc": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M"),
        "host": platform.node(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "cuda": torch.version.cuda,
        "command": COMMAND + " " + " ".join(sys.argv[1:]),
    }
    if cuda:
        props = torch.cuda.get_device_properties(0)
        env.update(gpu=props.name, sms=props.multi_processor_count, l2_bytes=getattr(props, "L2_cache_size", None))
    return env


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; print the table; write JSON when asked. Exit 2 when no GPU is there to measure."""
    parser = argparse.ArgumentParser(prog="python -m mla_kernels.bench", description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", metavar="FILE", help="write all figures here as JSON")
    parser.add_argument("--sweep", action="store_true", help="also sweep a few MMA configurations")
    parser.add_argument("--smoke", action="store_true", help="tiny shapes; runs on CPU under TRITON_INTERPRET=1")
    parser.add_argument("--quick", action="store_true", help="decode only, at the shapes the goals are judged at")
    parser.add_argument("--skip", action="append", default=[], choices=["decode", "indexer"], help="leave a part out")
    parser.add_argument(
        "--index-order",
        choices=["random", "position"],
        default="random",
        help="order of each row's top-k indices: random (FlashMLA's benchmark) or position (as indexer_topk emits)",
    )
    parser.add_argument(
        "--backends", help="comma-separated decode rows to time (default: all); e.g. mma,mma-tl: the MMA kernels"
    )
    args = parser.parse_args(argv)
    cuda = torch.cuda.is_available()
    if not cuda and not args.smoke:
        print("mla_kernels.bench measures a CUDA GPU and none is visible; use --smoke for a CPU check", file=sys.stderr)
        return 2
    if not cuda:
        os.environ.setdefault("TRITON_INTERPRET", "1")  # before any kernels module imports triton
    shapes = SMOKE if args.smoke else QUICK if args.quick else FULL
    pairs = QUICK_PAIRS if args.quick and not args.smoke else None
    skip = frozenset(QUICK_SKIP if args.quick else ())
    if args.backends:
        names = {n for n, _, _ in decode_backends()}
        wanted = set(args.backends.split(","))
        if not wanted <= names:
            print(f"--backends: unknown {', '.join(sorted(wanted - names))}; choose from {', '.join(sorted(names))}",
                  file=sys.stderr)  # fmt: skip
            return 2
        skip = frozenset(names - wanted)
    device = "cuda" if cuda else "cpu"
    timer = Timer(cuda)
    report: dict[str, Any] = {"environment": environment(cuda), "shapes": asdict(shapes)}
    report["index_order"] = args.index_order
    report["ceilings"] = ceil = measure_ceilings(timer, device)
    print(
        f"ceilings: copy {ceil['copy_bytes_per_s'] / 1e12:.2f} TB/s, bf16 matmul {ceil['bf16_flops_per_s'] / 1e12:.0f}"
        f" TFLOP/s, fp32 FMA {ceil['fma_flops_per_s'] / 1e12:.1f} TFLOP/s",
        flush=True,
    )
    if cuda:
        report["launch_floor"] = launch_floor(timer)
        report["gather"] = run_gather(timer, shapes, ceil, device)
        print(f"launch floor {report['launch_floor']}; gather {report['gather']}", flush=True)
    report["instructions"] = instructions(shapes, device)
    print(f"instructions: {report['instructions']}", flush=True)
    sections: list[tuple[str, Callable[[], Any]]] = []
    if "decode" not in args.skip:
        sections.append(("decode", lambda: run_decode(timer, shapes, ceil, device, pairs, skip, args.index_order)))
    if "indexer" not in args.skip and not args.quick:
        sections.append(("indexer", lambda: run_indexer(timer, shapes, ceil, device)))
    if args.sweep and cuda:
        sections.append(("sweep", lambda: run_sweep(timer, shapes, device)))
    failed = False
    for name, run in sections:
        try:
            report[name] = run()
        except Exception as exc:  # keep the other sections' figures; say what broke
            failed = True
            report[f"{name}_error"] = f"{type(exc).__name__}: {exc}"
            print(f"{name} failed: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
        if args.json:  # written after every section, so a run cut short keeps what it measured
            with open(args.json, "w") as f:
                json.dump(report, f, indent=1)
    report["summary"] = summary(report, shapes)
    print(json.dumps(report["summary"], indent=1))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
    print(table(report.get("decode", []), max(shapes.contexts)))
    return 1 if failed else 0


def table(rows: list[dict[str, Any]], context: int) -> str:
    """The decode rows at one context as a short table: µs, the MMA floor's share, the SIMT floor's share, MMA's
    speed-up over each backend."""
    lines = [f"decode at L={context} (graph µs; % of floor; simt rows also % of their own fma/memory floor)"]
    lines.append(f"{'H':>4} {'B':>4} {'backend':>13} {'us':>9} {'floor%':>7} {'simt%':>6} {'mma x':>7} {'check':>5}")
    for r in rows:
        if r["L"] != context:
            continue
        m = next((x for x in rows if (x["backend"], x["H"], x["B"], x["L"]) == ("mma", r["H"], r["B"], r["L"])), None)
        speedup = f"{r['median_us'] / m['median_us']:7.1f}" if m else f"{'-':>7}"
        own = f"{100 * r['fraction_of_simt_floor']:6.1f}" if "fraction_of_simt_floor" in r else f"{'-':>6}"
        lines.append(
            f"{r['H']:>4} {r['B']:>4} {r['backend']:>13} {r['median_us']:9.1f} {100 * r['fraction_of_floor']:7.1f} "
            f"{own} {speedup} {'ok' if r['check_ok'] else 'FAIL':>5}"
        )
    return "\n".join(lines)


def summary(report: dict[str, Any], s: Shapes) -> dict[str, Any]:
    """The figures the issue's goals are judged by."""
    out: dict[str, Any] = {}
    dec = report.get("decode", [])

    def pick(backend: str, h: int, b: int, context: int) -> dict[str, Any] | None:
        return next((r for r in dec if (r["backend"], r["H"], r["B"], r["L"]) == (backend, h, b, context)), None)

    for h in s.heads:
        for b in s.batches:
            for context in s.contexts:
                m, t = pick("mma", h, b, context), pick("simt", h, b, context)
                if m and t:
                    key = f"H={h} B={b} L={context}"
                    out[key] = {
                        "mma_fraction_of_floor": round(m["fraction_of_floor"], 3),
                        "mma_over_simt": round(t["median_us"] / m["median_us"], 2),
                    }
                    tiled = [r for r in (pick(n, h, b, context) for n in SIMT_BACKENDS[1:]) if r]
                    if tiled:
                        # The fair ratio: against the faster of the tiled SIMT kernel's two configurations.
                        best = min(tiled, key=lambda r: r["median_us"])
                        out[key]["mma_over_simt_tiled"] = round(best["median_us"] / m["median_us"], 2)
                        out[key]["simt_tiled_best"] = best["backend"]
                        out[key]["simt_tiled_fraction_of_simt_floor"] = round(best["fraction_of_simt_floor"], 3)
    for r in report.get("indexer", []):
        if r["M"] == s.index_max and r["L"] != s.index_max:
            base = next(
                x["median_us"]
                for x in report["indexer"]
                if (x["form"], x["B"], x["L"], x["M"]) == (r["form"], r["B"], r["L"], r["L"])
            )
            out[f"indexer {r['form']} B={r['B']} L={r['L']} M={s.index_max}/M=L"] = round(r["median_us"] / base, 2)
    out["all_checks_ok"] = all(r["check_ok"] for r in dec)
    return out


if __name__ == "__main__":
    sys.exit(main())
