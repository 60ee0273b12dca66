"""Time the profile summariser on synthetic traces shaped like a profiled decode (deep Python stacks, ops, kernels).

A GPU trace of 4 requests x 512 tokens at 8k contexts was 272 MB on the H200, and the summariser took minutes on
it: it matched every range's whole chain of enclosing ranges against the rules. This script builds traces of a
known shape and size, parses and summarises them, and prints a table (and writes JSON with --out).

    .venv/bin/python scripts/bench_profile.py [--steps 2000] [--depth 60] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from campaign.profile import read_trace, summarise

KERNELS_PER_STEP = 20


def synthetic_trace(steps: int, depth: int) -> bytes:
    """``steps`` decode steps, each under a Python stack ``depth`` frames deep (the decode scope in the middle),
    each launching ``KERNELS_PER_STEP`` kernels (one in four an attention kernel) through a CPU op."""
    events: list[dict[str, Any]] = []
    corr = 0
    for step in range(steps):
        t0 = step * 1000.0
        for d in range(depth):
            name = "decode_step" if d == depth // 2 else f"frame_{d}.py(12): f{d}"
            events.append(
                {"ph": "X", "cat": "python_function", "name": name, "ts": t0 + d * 0.01, "dur": 1000 - d * 0.02}
                | {"pid": 1, "tid": 1}
            )
        for k in range(KERNELS_PER_STEP):
            st = t0 + depth * 0.01 + k * 40
            kernel = "_mma_decode_kernel" if k % 4 == 0 else "nvjet_sm90_gemm"
            events += [
                {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": st, "dur": 30, "pid": 1, "tid": 1},
                {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": st + 1, "dur": 5, "pid": 1}
                | {"tid": 1, "args": {"correlation": corr}},
                {"ph": "X", "cat": "kernel", "name": kernel, "ts": st + 10, "dur": 20, "pid": 0, "tid": 7}
                | {"args": {"correlation": corr}},
            ]
            corr += 1
    return json.dumps({"traceEvents": events}).encode()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, nargs="+", default=[500, 2000])
    ap.add_argument("--depth", type=int, default=60)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    rows = []
    print(f"{'steps':>6} {'depth':>5} {'MB':>7} {'events':>9} {'parse s':>8} {'summarise s':>12} {'attention':>9}")
    for steps in args.steps:
        data = synthetic_trace(steps, args.depth)
        began = time.perf_counter()
        events = read_trace(data)
        parsed = time.perf_counter()
        result = summarise([events])
        done = time.perf_counter()
        row = {
            "steps": steps,
            "depth": args.depth,
            "mb": round(len(data) / 2**20, 1),
            "events": len(events),
            "parse_s": round(parsed - began, 3),
            "summarise_s": round(done - parsed, 3),
            "attention_share": result.attention_share,
        }
        rows.append(row)
        print(
            f"{steps:>6} {args.depth:>5} {row['mb']:>7} {len(events):>9} {row['parse_s']:>8} "
            f"{row['summarise_s']:>12} {result.attention_share:>9.3f}"
        )
    if args.out:
        doc = {
            "when": datetime.now(UTC).isoformat(timespec="seconds"),
            "machine": f"{platform.machine()} {platform.platform()}",
            "python": platform.python_version(),
            "command": "scripts/bench_profile.py " + " ".join(f"--steps {s}" for s in args.steps),
            "rows": rows,
        }
        args.out.write_text(json.dumps(doc, indent=2) + "\n")


if __name__ == "__main__":
    main()
