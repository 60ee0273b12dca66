"""Benchmark ``campaign diagnose`` on big logs: wall time and peak memory of the real command, one process per log.

Writes each log (default 200 MB) to a temporary directory, runs ``campaign diagnose FILE --json`` on it as a child
process, and reads its peak resident memory from ``wait4``. Prints a table, writes JSON, and exits 1 when a log misses
the targets (5 s, 200 MB) or is diagnosed as something other than what it holds.

    .venv/bin/python scripts/bench_diagnose.py [--mb 200] [--out runs/bench-diagnose.json]

The logs: an SGLang server that served for hours and then died of an illegal memory access (batch and request lines
that differ only in their numbers); a vLLM server whose every request line carries a distinct request id (no two keys
alike: the worst case for the scanner's cache); a vLLM server whose every line carries its process tag
(``(EngineCore_DP0 pid=230)``, ``(APIServer pid=101)``); one progress bar redrawn with carriage returns on a single
200 MB line, then an OOM; and a healthy SGLang start followed by hours of serving.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, BinaryIO

ROOT = Path(__file__).resolve().parent.parent
SGLANG_START = (ROOT / "tests" / "data" / "variants" / "healthy--sglang-full-startup.log").read_bytes()
VLLM_START = (ROOT / "tests" / "data" / "variants" / "healthy--vllm-v1-full-startup.log").read_bytes()
TARGET_S = 5.0
TARGET_MB = 200.0


def _fill(f: BinaryIO, size: int, make: Callable[[int], bytes]) -> None:
    i = 0
    block: list[bytes] = []
    written = f.tell()
    while written < size:
        line = make(i)
        block.append(line)
        written += len(line)
        i += 1
        if len(block) == 4096:
            f.write(b"".join(block))
            block.clear()
    f.write(b"".join(block))


def _sglang_line(i: int) -> bytes:
    s = i % 60
    if i % 3 == 0:
        return (
            f'[2026-12-01 10:{s // 10}{s % 10}:{s:02d}] INFO:     127.0.0.1:{40000 + i % 20000} - "POST /generate '
            f'HTTP/1.1" 200 OK\n'
        ).encode()
    return (
        f"[2026-12-01 10:00:{s:02d} TP{i % 8}] Decode batch. #running-req: {i % 257}, #token: {i % 99991}, token "
        f"usage: 0.{i % 97:02d}, cuda graph: True, gen throughput (token/s): {1000 + i % 5000}.{i % 10}, "
        f"#queue-req: {i % 13}\n"
    ).encode()


def _vllm_line(i: int) -> bytes:
    return (
        f"(APIServer pid=101) INFO 12-01 10:00:{i % 60:02d} [logger.py:43] Received request "
        f"chatcmpl-{uuid.uuid4().hex}: prompt: 'req {i}', params: SamplingParams(n=1, temperature=0.0, "
        f"max_tokens={i % 512}), prompt_token_ids: None, lora_request: None.\n"
    ).encode()


def _vllm_engine_line(i: int) -> bytes:
    # vLLM V1 as a multiprocess server: every line tagged with its process, the engine's and the API server's.
    if i % 2:
        return (
            f"(EngineCore_DP0 pid=230) INFO 12-01 10:00:{i % 60:02d} [core.py:{i % 900}] step {i}: scheduled "
            f"{i % 64} reqs, {i % 4096} tokens, kv usage {i % 100}.{i % 10}%\n"
        ).encode()
    return (
        f'(APIServer pid=101) INFO:     127.0.0.1:{40000 + i % 20000} - "POST /v1/chat/completions HTTP/1.1" 200 OK\n'
    ).encode()


def make_logs(folder: Path, size: int) -> dict[str, tuple[Path, str]]:
    """The benchmark logs, written under ``folder``: name -> (path, the kind each must be diagnosed as)."""
    logs = {}
    path = folder / "sglang-served-then-illegal-address.log"
    with path.open("wb") as f:
        f.write(SGLANG_START)
        _fill(f, size, _sglang_line)
        f.write(
            b"[2026-12-01 12:00:00 TP0] Scheduler hit an exception: Traceback (most recent call last):\n"
            b"RuntimeError: CUDA error: an illegal memory access was encountered\n"
            b"[2026-12-01 12:00:00] Received sigquit from a child process. It usually means the child failed.\n"
        )
    logs["sglang served, then illegal address"] = (path, "illegal_memory_access")

    path = folder / "vllm-distinct-request-ids-then-oom.log"
    with path.open("wb") as f:
        f.write(VLLM_START)
        _fill(f, size, _vllm_line)
        f.write(
            b"(EngineCore_DP0 pid=230) ERROR 12-01 12:00:00 [core.py:850] torch.OutOfMemoryError: CUDA out of "
            b"memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 139.81 GiB\n"
            b"(APIServer pid=101) ERROR 12-01 12:00:01 [async_llm.py:480] EngineDeadError: EngineCore encountered "
            b"an issue. See stack trace (above) for the root cause.\n"
        )
    logs["vllm, distinct request ids, then OOM"] = (path, "gpu_oom")

    path = folder / "vllm-process-tagged-then-oom.log"
    with path.open("wb") as f:
        f.write(VLLM_START)
        _fill(f, size, _vllm_engine_line)
        f.write(
            b"(EngineCore_DP0 pid=230) ERROR 12-01 12:00:00 [core.py:850] torch.OutOfMemoryError: CUDA out of "
            b"memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 139.81 GiB\n"
        )
    logs["vllm, every line process-tagged, then OOM"] = (path, "gpu_oom")

    path = folder / "one-progress-bar-line-then-oom.log"
    with path.open("wb") as f:
        f.write(b"[2026-12-01 10:00:00 TP0] Capture cuda graph begin. This can take up to several minutes.\n")
        bar = b"\rCapturing batches (bs=512 avail_mem=3.10 GB):  10%|#         | 5/52 [00:04<00:40,  1.1it/s]"
        f.write(bar * (size // len(bar)))
        f.write(b"\ntorch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.00 GiB.\n")
    logs["one 200 MB progress-bar line, then OOM"] = (path, "gpu_oom")

    path = folder / "sglang-healthy-serving.log"
    with path.open("wb") as f:
        f.write(SGLANG_START)
        _fill(f, size, _sglang_line)
    logs["sglang healthy, serving"] = (path, "healthy")
    return logs


def _run(command: list[str]) -> tuple[float, float, float, str]:
    """Wall seconds, CPU seconds (user + system), peak RSS (MB) and stdout of ``command``."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None
    out = proc.stdout.read().decode()
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    return wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024, out


def main(argv: list[str] | None = None) -> int:
    """Write the logs, diagnose each with the real command, print and store the figures."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=200, help="size of each log in MB (default 200)")
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "bench-diagnose.json")
    parser.add_argument("--write-only", type=Path, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.write_only is not None:
        logs = make_logs(args.write_only, args.mb * 1_000_000)
        print(json.dumps({name: [str(path), want] for name, (path, want) in logs.items()}))
        return 0
    exe = Path(sys.executable).with_name("campaign")
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="bench-diagnose-") as tmp:
        # Written by a child process: a forked child's peak memory counts its parent's pages until exec, so the
        # parent stays small.
        made = subprocess.run(
            [sys.executable, __file__, "--mb", str(args.mb), "--write-only", tmp],
            capture_output=True,
            text=True,
            check=True,
        )
        logs = {name: (Path(p), want) for name, (p, want) in json.loads(made.stdout).items()}
        for name, (path, want) in logs.items():
            wall, cpu, rss, out = _run([str(exe), "diagnose", str(path), "--json"])
            try:
                kind = json.loads(out)["kind"]
            except (json.JSONDecodeError, KeyError):
                kind = f"<no JSON: {out[-200:]!r}>"
            size_mb = path.stat().st_size / 1e6
            ok = wall < TARGET_S and rss < TARGET_MB and kind == want
            rows.append(
                {
                    "log": name,
                    "size_mb": round(size_mb, 1),
                    "wall_s": round(wall, 2),
                    "cpu_s": round(cpu, 2),
                    "peak_rss_mb": round(rss, 1),
                    "kind": kind,
                    "expected": want,
                    "ok": ok,
                }
            )
            path.unlink()
    width = max(len(r["log"]) for r in rows)
    print(f"{'log':<{width}}  {'MB':>6}  {'wall s':>6}  {'CPU s':>6}  {'peak MB':>7}  kind")
    for r in rows:
        mark = "" if r["ok"] else "  <-- MISSES TARGET"
        print(
            f"{r['log']:<{width}}  {r['size_mb']:>6.1f}  {r['wall_s']:>6.2f}  {r['cpu_s']:>6.2f}  "
            f"{r['peak_rss_mb']:>7.1f}  {r['kind']}{mark}"
        )
    report = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": f"{platform.node()} ({platform.machine()}, {os.cpu_count()} CPUs)",
        "python": platform.python_version(),
        "load_average_before": os.getloadavg(),
        "command": f"campaign diagnose FILE --json (one process per log, {args.mb} MB each)",
        "targets": {"wall_s": TARGET_S, "peak_rss_mb": TARGET_MB},
        "rows": rows,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    print(f"wrote {args.out}")
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
