"""Where one decode step of the long-context reference server goes: the GPU, the engine's host work, or neither.

For each form asked (attention backend x indexer form), it builds the server's engine as ``python -m
campaign.refserver`` does (the wide long-context model, bf16, CUDA graphs, the given max context), admits ``--batch``
requests of ``--prompt-len`` tokens (a question after filler, as ``campaign bench --prompts long-context`` sends),
prefills them, then times ``--steps`` decode steps three ways:

- ``gpu_ms``: the decode graph alone (``DecodeRunner.launch`` on the step's input rows), CUDA events around it;
- ``runner_ms``: the same call timed on the host with a synchronize, i.e. the graph plus copying its inputs;
- ``engine_ms``: the engine's scheduler step in steady decode (launching the next step, then waiting for the
  previous one and handing out its tokens), without HTTP: with the overlap it is the larger of the GPU step and
  the host's work per step;
- ``sched_ms``: the engine process's loop as the server runs it (``engine_process._Scheduler``: each request's sink,
  the step, and the step's message sent over a socket to a child process that reads and unpickles it, as the HTTP
  process's reader does), i.e. the engine's step in the server less what the HTTP process does with the message.

The served ITL (from ``campaign run``) minus ``sched_ms`` is what the HTTP side and the client add. Medians over the
steps. Usage (on the GPU machine): ``python scripts/decode_step_probe.py --json OUT.json [--form mma:aware ...]``;
a form is ``BACKEND:INDEXER[:TOPK_METHOD]``, e.g. ``mma:aware:split``.
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import socket
import statistics
import subprocess
import sys
import time
from functools import partial
from multiprocessing.connection import Connection
from pathlib import Path

import numpy as np
import torch

from campaign.refserver.engine import Engine, EngineArgs
from campaign.refserver.engine_process import _Scheduler
from campaign.refserver.questions import filler_text, long_context_text
from campaign.refserver.request import Request
from campaign.refserver.tokenizer import encode_prompt

WIDE = Path("campaign/refserver/weights/longctx-wide.safetensors")
# The HTTP process's reader, reduced to reading and unpickling each message the engine sends.
DRAIN = """
import sys
from multiprocessing.connection import Connection
conn = Connection(int(sys.argv[1]))
try:
    while True:
        conn.recv()
except EOFError:
    pass
"""


def prompts(n: int, length: int) -> list[list[int]]:
    """``n`` long-context prompts of about ``length`` tokens (filler, then a question), seeded."""
    rng = random.Random(0)
    out = []
    for i in range(n):
        question = f"What is {i % 90 + 10}×{(7 * i) % 90 + 10}?"
        bare = len(encode_prompt(long_context_text(question, "")))
        out.append(encode_prompt(long_context_text(question, filler_text(rng, max(0, length - bare - 2)))))
    return out


def scheduled_steps(engine: Engine, steps: int) -> list[float]:
    """Milliseconds of each of ``steps`` iterations of the engine process's loop, its messages read by a child."""
    ours, theirs = socket.socketpair()
    with theirs:
        drain = subprocess.Popen([sys.executable, "-c", DRAIN, str(theirs.fileno())], pass_fds=(theirs.fileno(),))
    conn = Connection(ours.detach())
    scheduler = _Scheduler(engine, conn)
    for request in engine._running:
        request.sink = partial(scheduler.sink, request)
        scheduler.requests[request.rid] = request
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        conn.poll()
        engine.step()
        scheduler.report()
        times.append((time.perf_counter() - t0) * 1e3)
    conn.close()
    drain.wait(timeout=30)
    for request in engine._running:
        request.sink = None  # the sinks hold the scheduler, which holds the engine: let both go with the probe
    return times


def probe(backend: str, indexer: str, args: argparse.Namespace, topk_method: str = "auto") -> dict[str, object]:
    """Build one engine, fill it with the batch, and time its decode steps."""
    engine = Engine(
        EngineArgs(
            model_path=args.model_path,
            device=args.device,
            attention_backend=backend,
            disable_cuda_graph=args.device != "cuda",
            cuda_graph_max_bs=args.batch,
            context_length=args.context_length,
            indexer=indexer,
            index_topk_method=topk_method,
            dtype="bfloat16" if args.device == "cuda" else "auto",
            max_running_requests=args.batch,
            enable_torch_compile=args.compile,
        )
    )
    requests = [Request(p, 3 * args.steps + 8, ignore_eos=True) for p in prompts(args.batch, args.prompt_len)]
    for request in requests:
        engine.submit(request)
    began = time.perf_counter()
    engine.step()  # admits and prefills all, then one decode step
    prefill_s = time.perf_counter() - began
    engine_ms, gpu_ms, runner_ms = [], [], []
    cuda = args.device == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    for _ in range(args.steps):
        t0 = time.perf_counter()
        engine.step()
        engine_ms.append((time.perf_counter() - t0) * 1e3)
    sched_ms = scheduled_steps(engine, args.steps)
    # The graph alone on the last step's shapes: same batch, same table rows (one token longer each step).
    batch = engine._running
    step_rows = np.array([(r.length - 1, int(r.slots[r.length - 1]), r.row) for r in batch], dtype=np.int64)  # type: ignore[index]
    sync()
    for _ in range(args.steps):
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            engine.runner.launch(step_rows)
            end.record()
            sync()
            gpu_ms.append(start.elapsed_time(end))
        t0 = time.perf_counter()
        engine.runner.launch(step_rows)
        sync()
        runner_ms.append((time.perf_counter() - t0) * 1e3)
    kernels = profile_kernels(engine, step_rows, args.steps) if args.profile and cuda else None
    del engine
    gc.collect()
    if cuda:
        torch.cuda.empty_cache()
    return {
        "backend": backend,
        "indexer": indexer,
        "topk_method": topk_method,
        "batch": args.batch,
        "prompt_len": args.prompt_len,
        "context_length": args.context_length,
        "prefill_s": round(prefill_s, 3),
        "gpu_ms": round(statistics.median(gpu_ms), 4) if gpu_ms else None,
        "runner_ms": round(statistics.median(runner_ms), 4),
        "engine_ms": round(statistics.median(engine_ms), 4),
        "sched_ms": round(statistics.median(sched_ms), 4),
        "compile": args.compile,
        "kernels": kernels,
    }


def profile_kernels(engine: Engine, rows: np.ndarray, steps: int) -> dict[str, object]:
    """Per decode step: how many kernels run and the GPU time of each kind (torch.profiler over ``steps`` calls)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            engine.runner.launch(rows)
        torch.cuda.synchronize()
    rows = []
    for event in prof.key_averages():
        if event.device_type.name != "CUDA" or event.device_time_total <= 0:
            continue
        rows.append((event.key, event.count / steps, event.device_time_total / steps))
    rows.sort(key=lambda r: -r[2])
    return {
        "kernels_per_step": round(sum(r[1] for r in rows), 1),
        "gpu_us_per_step": round(sum(r[2] for r in rows), 1),
        "top": [{"name": n[:120], "per_step": round(c, 2), "us_per_step": round(t, 1)} for n, c, t in rows[:25]],
    }


def main(argv: list[str] | None = None) -> int:
    """Run the forms asked and print one table row each; ``--json`` writes them."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--form", action="append", help="BACKEND:INDEXER[:TOPK_METHOD], e.g. mma:aware or mma:aware:split (repeat)"
    )
    parser.add_argument("--model-path", type=Path, default=WIDE)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--prompt-len", type=int, default=8192)
    parser.add_argument("--context-length", type=int, default=131072)
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--device", default="cuda", help="cuda, or cpu to rehearse (no graphs, no GPU time)")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--compile", action="store_true", help="build the engine with --enable-torch-compile")
    parser.add_argument("--profile", action="store_true", help="also list the step's kernels (torch.profiler)")
    args = parser.parse_args(argv)
    forms = args.form or ["mma:aware", "mma:naive", "simt:aware"]
    rows = []
    print(
        f"{'form':<16} {'ctx':>7} {'B':>3} {'gpu ms':>8} {'runner ms':>10} {'engine ms':>10} {'sched ms':>9} "
        f"{'prefill s':>10}"
    )
    for form in forms:
        backend, indexer, *method = form.split(":")
        row = probe(backend, indexer, args, *method)
        rows.append(row)
        print(
            f"{form:<16} {args.context_length:>7} {args.batch:>3} {row['gpu_ms']!s:>8} {row['runner_ms']:>10} "
            f"{row['engine_ms']:>10} {row['sched_ms']:>9} {row['prefill_s']:>10}",
            flush=True,
        )
        kernels = row.get("kernels")
        if isinstance(kernels, dict):
            print(f"  {kernels['kernels_per_step']} kernels, {kernels['gpu_us_per_step']} us of kernel time a step")
            for k in kernels["top"][:15]:  # type: ignore[index]
                print(f"  {k['us_per_step']:>8} us {k['per_step']:>6}x  {k['name']}")
    if args.json:
        gpu = torch.cuda.get_device_name() if args.device == "cuda" else None
        meta = {"torch": torch.__version__, "gpu": gpu, "argv": sys.argv}
        args.json.write_text(json.dumps({"meta": meta, "rows": rows}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
