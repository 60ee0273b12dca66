"""What the reference server's HTTP side adds per token: its app in front of an engine whose step takes a known time.

The app (``campaign.refserver.app.build_app``, served by uvicorn in this process, as ``python -m campaign.refserver``
serves it) runs over a stand-in engine: a thread in the same process (as the engine ran before it got a process of
its own, ``campaign.refserver.engine_process``: this measures that one-process hand-off) that hands every running
request one token per step, and sleeps ``--step-ms`` per step in place of the GPU (a sleep releases the GIL, as
waiting for the GPU does). ``campaign bench`` (its own process) then streams ``-c`` requests of ``--tokens``
tokens. The served ITL minus the step time (``--step-ms`` asleep plus ``--hold-ms`` of Python holding the GIL, as
the real engine's host work does) is what the HTTP path and its hand-off from the scheduler thread cost per step.

Usage: ``python scripts/bench_stream_path.py [--step-ms 2] [-c 32] [--tokens 256] [--json OUT]``
"""

from __future__ import annotations

import argparse
import json
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import uvicorn

from campaign.refserver.app import ServerState, build_app
from campaign.refserver.profiler import Profiler
from campaign.refserver.request import Request, Stats


class SteppedEngine:
    """A stand-in for ``Engine`` at the app's seam: one token per running request every ``step_s``."""

    def __init__(self, step_s: float, hold_s: float = 0.0, waits: int = 1) -> None:
        self.step_s = step_s
        self.hold_s = hold_s
        self.waits = waits
        self.model_id = "stand-in"
        self.context_len = 1 << 20
        self.model_path = "stand-in"
        self.profiler = Profiler("cpu")
        self.stats = Stats()
        self.token_usage = 0.0
        self.fatal: BaseException | None = None
        self._running: list[Request] = []
        self._cond = threading.Condition()
        threading.Thread(target=self._loop, daemon=True).start()

    def submit(self, request: Request) -> None:
        """Queue ``request``."""
        with self._cond:
            self._running.append(request)
            self._cond.notify()

    def abort(self, request: Request) -> None:
        """Stop ``request`` at the next step."""
        request.aborted = True

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._running:
                    self._cond.wait()
                batch = list(self._running)
            for _ in range(self.waits):  # the GPU's share, as several GIL-releasing calls (copies, replay, sync)
                time.sleep(self.step_s / self.waits)
                until = time.perf_counter() + self.hold_s / self.waits
                while time.perf_counter() < until:  # the engine's host work in Python between them, GIL held
                    pass
            for request in batch:
                request.output.append(7)  # a digit token
                if len(request.output) >= request.max_new_tokens:
                    request.finish_reason = "length"
                if request.sink is not None and not request.aborted:
                    request.sink(7, request.finish_reason)
            with self._cond:
                self._running = [r for r in self._running if r.finish_reason is None and not r.aborted]
            self.stats.decode_steps += 1


def main(argv: list[str] | None = None) -> int:
    """Serve the app over the stand-in engine, bench it, print ITL against the step time."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--step-ms", type=float, default=2.0)
    parser.add_argument("--hold-ms", type=float, default=0.0, help="per step, Python work holding the GIL")
    parser.add_argument("--waits", type=int, default=1, help="GIL-releasing waits the step is split into")
    parser.add_argument("--switch-ms", type=float, help="sys.setswitchinterval for this process (default 5 ms)")
    parser.add_argument("-c", "--concurrency", type=int, default=32)
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    if args.switch_ms is not None:
        sys.setswitchinterval(args.switch_ms / 1e3)
    engine = SteppedEngine(args.step_ms / 1e3, args.hold_ms / 1e3, args.waits)
    state = ServerState(engine)  # type: ignore[arg-type]
    state.ready = True
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(build_app(state), host="127.0.0.1", port=port, log_level="warning"))
    threading.Thread(target=server.run, daemon=True).start()
    while not server.started:
        time.sleep(0.05)
    cmd = [
        sys.executable, "-m", "campaign.cli", "bench", f"http://127.0.0.1:{port}", "-c", str(args.concurrency),
        "-n", str(2 * args.concurrency), "--warmup", str(args.concurrency), "--prompts", "random",
        "--input-len", "16", "--output-len", str(args.tokens), "--json",
    ]  # fmt: skip
    out = subprocess.run(cmd, capture_output=True, text=True, check=False)
    server.should_exit = True
    level = json.loads(out.stdout)["levels"][0]
    row = {
        "step_ms": args.step_ms,
        "hold_ms": args.hold_ms,
        "waits": args.waits,
        "switch_ms": args.switch_ms,
        "concurrency": args.concurrency,
        "tokens": args.tokens,
        "itl_median_ms": round(level["itl"]["median"], 3),
        "itl_mean_ms": round(level["itl"]["mean"], 3),
        "tpot_median_ms": round(level["tpot"]["median"], 3),
        "steps": engine.stats.decode_steps,
        "output_tok_s": round(level["output_throughput"], 1),
    }
    row["added_per_step_ms"] = round(row["tpot_median_ms"] - args.step_ms - args.hold_ms, 3)
    print(json.dumps(row))
    if args.json:
        args.json.write_text(json.dumps(row, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
