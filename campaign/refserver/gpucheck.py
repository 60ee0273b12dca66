"""The GPU check: every attention backend × torch.compile × CUDA graphs, against the torch/eager baseline.

``python -m campaign.refserver.gpucheck [--json PATH] [--budget-s S] [--table-stride N] [--model-path P] [--dtype D]
[--kv-cache-dtype auto|fp8_e4m3]``

For each combination it builds the server's engine exactly as ``python -m campaign.refserver`` does (weights, KV
pool, compile, graph capture), runs the whole question table through the engine's own greedy decode path, counts
the answers that differ from the baseline's (torch backend, no compile, no graphs) and the exact answers, then
measures decode tokens/s at batch 1 and 64 (32 new tokens per request, eos ignored, median of 3). A combination that
fails to start is recorded with its error. Combinations that would start after ``--budget-s`` are listed as not run.
Each record names the dtype the engine ran in and, for the mma backend, the kernel its decode launched (the Gluon
kernels run only for bf16 at DeepSeek's widths; ``--dtype auto`` keeps the weights file's fp32, which runs tl.dot).
Prints a table; ``--json`` writes every figure.
"""

from __future__ import annotations

import argparse
import gc
import json
import platform
import statistics
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import torch

from campaign.refserver.engine import WEIGHTS, Engine, EngineArgs
from campaign.refserver.log import configure_logging
from campaign.refserver.questions import question_table
from campaign.refserver.tokenizer import EOS, decode_ids, encode_prompt

BACKENDS = ("torch", "mma", "simt")
BENCH_NEW_TOKENS = 32
#: Graph buckets up to 512 so the table runs in big batches that still replay graphs; 64 is one of the buckets.
TABLE_BATCH = 512


def combos(backends: tuple[str, ...], with_compile: bool) -> list[tuple[str, bool, bool]]:
    """(backend, torch_compile, cuda_graph), cheapest first so a short budget covers the most: baseline first."""
    eager = [(b, False, g) for b in backends for g in (False, True)]
    compiled = [(b, True, g) for g in (True, False) for b in backends] if with_compile else []
    return eager + compiled


def answer(ids: list[int]) -> str:
    """The text of an output up to eos."""
    return decode_ids(ids[: ids.index(EOS)] if EOS in ids else ids)


def decode_rate(engine: Engine, batch: int) -> float:
    """Median decode tokens/s of ``batch`` requests generating ``BENCH_NEW_TOKENS`` each (after one warm run)."""
    prompts = [encode_prompt(f"What is {i % 100}×{(7 * i) % 100}?") for i in range(batch)]
    rates = []
    for run in range(4):
        before_t, before_s = engine.stats.decode_tokens, engine.stats.decode_seconds
        engine.generate(prompts, BENCH_NEW_TOKENS, ignore_eos=True)
        if run:
            rates.append((engine.stats.decode_tokens - before_t) / (engine.stats.decode_seconds - before_s))
    return statistics.median(rates)


def attention_kernel(engine: Engine, backend: str) -> str | None:
    """The kernel the engine's decode runs for ``backend`` "mma" (None for the others), from the model's widths."""
    if backend != "mma":
        return None
    from mla_kernels.mma import kernel_name

    cfg, rows = engine.cfg, engine.pool.rows
    if rows.dtype == torch.uint8:  # an FP8 pool: q keeps the model's dtype
        from mla_kernels import fp8cache

        dtype = next(engine.model.parameters()).dtype
        q = torch.empty((1, cfg.n_heads, cfg.d_qk), dtype=dtype, device=rows.device)
        return fp8cache.kernel_name(q, rows[0, :1], cfg.d_latent)
    q = torch.empty((1, cfg.n_heads, cfg.d_qk), dtype=rows.dtype, device=rows.device)
    return kernel_name(q, rows[0, :1], cfg.d_latent)


def check_one(
    model_path: Path,
    device: str,
    backend: str,
    compile_: bool,
    graph: bool,
    prompts: list[list[int]],
    dtype: str = "auto",
    kv_cache_dtype: str = "auto",
) -> tuple[dict[str, Any], list[list[int]] | None]:
    """Start one combination, run the table and the rates; returns its record and its outputs."""
    record: dict[str, Any] = {"backend": backend, "torch_compile": compile_, "cuda_graph": graph}
    began = time.monotonic()
    engine = None
    try:
        engine = Engine(
            EngineArgs(
                model_path=model_path,
                device=device,
                attention_backend=backend,
                enable_torch_compile=compile_,
                disable_cuda_graph=not graph,
                cuda_graph_max_bs=TABLE_BATCH,
                max_total_tokens=TABLE_BATCH * 64,
                max_running_requests=TABLE_BATCH,
                decode_log_interval=10**9,
                dtype=dtype,
                kv_cache_dtype=kv_cache_dtype,
            )
        )
        record["startup_s"] = round(time.monotonic() - began, 2)
        record["dtype"] = str(next(engine.model.parameters()).dtype).removeprefix("torch.")
        record["kv_cache_dtype"] = kv_cache_dtype
        kernel = attention_kernel(engine, backend)
        if kernel is not None:
            record["attention_kernel"] = kernel
        t0 = time.monotonic()
        outputs = engine.generate(prompts, 8)
        record["table_s"] = round(time.monotonic() - t0, 2)
        record["tok_s_bs1"] = round(decode_rate(engine, 1), 1)
        record["tok_s_bs64"] = round(decode_rate(engine, 64), 1)
        record["status"] = "started"
        return record, outputs
    except Exception as exc:
        record["status"] = "failed"
        record["error"] = f"{type(exc).__name__}: {exc}"
        record["traceback"] = traceback.format_exc()
        return record, None
    finally:
        del engine
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


def main(argv: list[str] | None = None) -> int:
    """Run the check; exit 0 when every combination that ran matches the baseline."""
    p = argparse.ArgumentParser(prog="python -m campaign.refserver.gpucheck", description=__doc__.splitlines()[0])
    p.add_argument("--json", type=Path, default=None)
    p.add_argument("--model-path", type=Path, default=WEIGHTS)
    p.add_argument("--budget-s", type=float, default=600.0, help="start no combination after this many seconds")
    p.add_argument("--table-stride", type=int, default=1, help="every Nth question only (1: the whole table)")
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda", help="cpu: a dry run of this script")
    p.add_argument("--backends", default=",".join(BACKENDS), help="comma-separated, torch first")
    p.add_argument("--skip-compile", action="store_true", help="leave out the torch.compile combinations")
    dtypes = ["auto", "bfloat16", "float32"]
    p.add_argument("--dtype", choices=dtypes, default="auto", help="weights and KV pool (auto: the file's)")
    kv_dtypes = ["auto", "fp8_e4m3"]
    p.add_argument("--kv-cache-dtype", choices=kv_dtypes, default="auto", help="KV pool rows (fp8_e4m3: fp8cache)")
    args = p.parse_args(argv)
    backends = tuple(b for b in args.backends.split(",") if b)
    if not backends or backends[0] != "torch" or not set(backends) <= set(BACKENDS):
        print(f"error: --backends must start with torch and name only {', '.join(BACKENDS)}", file=sys.stderr)
        return 2
    if args.device == "cuda" and not torch.cuda.is_available():
        print("error: the GPU check needs a CUDA device; torch sees none", file=sys.stderr)
        return 2
    configure_logging()
    table = question_table()[:: args.table_stride]
    prompts = [encode_prompt(q.text) for q in table]
    env = {
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "gpu": torch.cuda.get_device_name() if args.device == "cuda" else platform.processor() or "cpu",
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "python": platform.python_version(),
        "questions": len(table),
        "command": " ".join(sys.argv),
    }
    try:
        import triton

        env["triton"] = triton.__version__
    except ImportError:
        env["triton"] = None
    started = time.monotonic()
    records: list[dict[str, Any]] = []
    baseline: list[list[int]] | None = None
    for backend, compile_, graph in combos(backends, not args.skip_compile):
        if time.monotonic() - started > args.budget_s:
            records.append(
                {"backend": backend, "torch_compile": compile_, "cuda_graph": graph, "status": "not run (budget)"}
            )
            continue
        record, outputs = check_one(
            args.model_path, args.device, backend, compile_, graph, prompts, args.dtype, args.kv_cache_dtype
        )
        if outputs is not None:
            if baseline is None:
                baseline = outputs  # combos() puts torch/eager first
            got = [answer(o) for o in outputs]
            record["exact"] = sum(g == str(q.answer) for g, q in zip(got, table, strict=True))
            record["differs_from_baseline"] = sum(
                answer(o) != answer(b) for o, b in zip(outputs, baseline, strict=True)
            )
        records.append(record)
        print(json.dumps({k: v for k, v in record.items() if k != "traceback"}), flush=True)
        if args.json is not None:  # after every combination, so a cut-off run still leaves its figures
            args.json.write_text(json.dumps({"environment": env, "results": records}, indent=2))
    header = f"{'backend':7} {'compile':7} {'graph':5} {'status':17} {'start s':>7} {'exact':>12} {'diff':>5} "
    header += f"{'tok/s bs1':>10} {'tok/s bs64':>11} {'dtype':8} kernel"
    print(f"\n{env['gpu']}, torch {env['torch']}, triton {env['triton']}, {len(table)} questions\n{header}")
    for r in records:
        exact = f"{r['exact']}/{len(table)}" if "exact" in r else "-"
        print(
            f"{r['backend']:7} {r['torch_compile']!s:7} {r['cuda_graph']!s:5} {r['status']:17} "
            f"{r.get('startup_s', '-')!s:>7} {exact:>12} {r.get('differs_from_baseline', '-')!s:>5} "
            f"{r.get('tok_s_bs1', '-')!s:>10} {r.get('tok_s_bs64', '-')!s:>11} {r.get('dtype', '-'):8} "
            f"{r.get('attention_kernel', '-')}"
        )
        if r["status"] == "failed":
            print(f"    {r['error'][:300]}")
    if args.json is not None:
        args.json.write_text(json.dumps({"environment": env, "results": records}, indent=2))
    ok = all(r.get("differs_from_baseline", 0) == 0 for r in records)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
