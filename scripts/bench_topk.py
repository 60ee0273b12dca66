"""The lightning indexer's two steps timed apart on the GPU: scoring, and the radix top-k at several tunings.

For B rows of length L in a table of M = 128k (the long-context server's shapes), it times ``indexer_scores``,
``indexer_topk`` at each (method, block, warps) asked (``single``: one program per row; ``split``: each row spread
over several programs), the whole ``lightning_indexer``, and the O(max_context) ``naive_indexer_topk``, with CUDA
events over repeated calls (medians), checking each top-k against torch.topk. ``--graph`` times replays of a CUDA
graph of each form instead of eager calls (as the server runs them: the split top-k's six launches then cost no
Python launch overhead each). Usage (on the GPU machine):
``python scripts/bench_topk.py [--batch 32] [--length 8192] [--graph] [--json OUT.json]``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Callable
from pathlib import Path

import torch

from mla_kernels import indexer


def timed(fn: Callable[[], object], reps: int) -> float:
    """Median microseconds of ``fn`` over ``reps`` calls after three warm-ups."""
    for _ in range(3):
        fn()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) * 1e3)
    return statistics.median(times)


def graphed(fn: Callable[[], object]) -> Callable[[], object]:
    """``fn`` captured once in a CUDA graph (after a call outside it, which compiles the kernels): its replay."""
    fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    replay: Callable[[], object] = graph.replay
    return replay


Tuning = tuple[str, int, int, int]  # (method, block, warps, radix bits of the split method)


def parse_tuning(text: str) -> Tuning:
    """``[METHOD:]BLOCK:WARPS[:BITS]`` as (method, block, warps, bits); method single, bits TOPK_RADIX_BITS if left out.

    BITS (the split method's bits a radix pass, e.g. 8 or 11) means nothing to ``single``, which always takes 8.
    """
    parts = text.split(":")
    if parts[0] not in indexer.TOPK_METHODS:
        parts = ["single", *parts]
    if len(parts) == 3:
        parts.append(str(indexer.TOPK_RADIX_BITS))
    if len(parts) != 4 or not all(p.isdigit() for p in parts[1:]):
        raise argparse.ArgumentTypeError(
            f"tuning must be [METHOD:]BLOCK:WARPS[:BITS] with METHOD in {indexer.TOPK_METHODS}, got {text!r}"
        )
    return parts[0], int(parts[1]), int(parts[2]), int(parts[3])


def bench_length(length: int, args: argparse.Namespace, tunings: list[Tuning]) -> list[dict[str, object]]:
    """Time every form at one row length; a top-k tuning whose result differs from torch.topk is marked WRONG."""
    dev = torch.device("cuda")
    gen = torch.Generator(device=dev).manual_seed(length)
    b, m, heads, dim = args.batch, args.max_context, 64, 128
    pages = m // indexer.PAGE
    q = torch.randn(b, heads, dim, device=dev, generator=gen, dtype=torch.bfloat16)
    w = torch.randn(b, heads, device=dev, generator=gen) * heads**-0.5
    used = -(-length // indexer.PAGE)  # pages a row fills; the rest of its table is zero, as an engine pads it
    keys = torch.randn(b * used * indexer.PAGE, dim, device=dev, generator=gen, dtype=torch.bfloat16)
    scale = torch.ones(keys.shape[0], device=dev)
    table = torch.zeros(b, pages, dtype=torch.int32, device=dev)
    table[:, :used] = torch.randperm(b * used, device=dev, generator=gen).view(b, used).to(torch.int32)
    lengths = torch.full((b,), length, dtype=torch.int32, device=dev)
    logits = indexer.indexer_scores(q, w, keys, scale, table, lengths)
    ref = torch.topk(logits[:, :length], min(args.topk, length), dim=1).indices.sort(dim=1).values
    forms: dict[str, Callable[[], object]] = {
        "scores": lambda: indexer.indexer_scores(q, w, keys, scale, table, lengths),
        "aware (scores + top-k)": lambda: indexer.lightning_indexer(q, w, keys, scale, table, lengths, args.topk),
        "naive (O(max_context))": lambda: indexer.naive_indexer_topk(q, w, keys, scale, table, lengths, args.topk),
    }
    for method, blk, warps, bits in tunings:

        def run(method: str = method, blk: int = blk, warps: int = warps, bits: int = bits) -> torch.Tensor:
            return indexer.indexer_topk(
                logits, lengths, args.topk, method=method, block=blk, num_warps=warps, radix_bits=bits
            )

        ok = bool(torch.equal(run()[:, : ref.shape[1]].sort(dim=1).values, ref.to(torch.int32)))
        what = f"{method} block {blk} warps {warps}" + (f" {bits}-bit" if method == "split" else "")
        forms[f"top-k {what}{'' if ok else ' WRONG'}"] = run
    rows: list[dict[str, object]] = []
    mode = "graph" if args.graph else "eager"
    for name, fn in forms.items():
        us = timed(graphed(fn) if args.graph else fn, args.reps)
        rows.append({"form": name, "B": b, "L": length, "M": m, "mode": mode, "median_us": round(us, 1)})
        print(f"B={b:<3} L={length:<6} M={m:<6} {us:9.1f} us  {name} ({mode})", flush=True)
    return rows


def main(argv: list[str] | None = None) -> int:
    """Print one line per timed form; ``--json`` writes them."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--length", type=int, action="append", help="row length L (repeat); default 8192")
    parser.add_argument("--max-context", type=int, default=131072)
    parser.add_argument("--topk", type=int, default=2048)
    parser.add_argument(
        "--tuning",
        action="append",
        type=parse_tuning,
        help="[METHOD:]BLOCK:WARPS[:BITS] of the top-k: METHOD single (the default) or split, BITS the split's radix "
        "bits a pass (repeat)",
    )
    parser.add_argument("--graph", action="store_true", help="time CUDA-graph replays instead of eager calls")
    parser.add_argument("--reps", type=int, default=50)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    default = ["single:1024:8", "single:4096:16", "split:512:4", "split:1024:4", "split:1024:8", "split:2048:8"]
    default += ["split:512:4:11", "split:1024:4:11", "split:1024:8:11"]
    tunings: list[Tuning] = args.tuning or [parse_tuning(t) for t in default]
    rows = [row for length in args.length or [8192] for row in bench_length(length, args, tunings)]
    if args.json:
        meta = {"torch": torch.__version__, "gpu": torch.cuda.get_device_name(), "argv": sys.argv}
        args.json.write_text(json.dumps({"meta": meta, "rows": rows}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
