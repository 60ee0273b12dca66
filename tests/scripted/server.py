"""A scripted server for the fast tier: each launch plays the next step of its script, then serves or not.

    python tests/scripted/server.py --port P --script ok,die:gpu_oom --state DIR

``--script`` is the server's life over its launches: a comma-separated list of steps, the Nth launch playing the
Nth step (the last step repeats). The launch counter lives in ``--state`` (one file per script), so a variant and
its relaunches (retries, restores) step through it. Steps:

- ``ok``: logs a start, then serves the scheduled endpoint (``campaign.bench.testing``: real HTTP on loopback,
  /health, streaming chat), printing ``LISTENING <port>`` (the recipe's ready marker) once it accepts connections;
- ``die:LOG``: plays the real failure log ``tests/data/variants/LOG*.log`` line by line and exits 1;
- ``hang``: logs a start and never becomes ready (the readiness deadline ends it).
"""

from __future__ import annotations

import argparse
import hashlib
import sys
import time
from pathlib import Path

from campaign.bench import testing

LOGS = Path(__file__).resolve().parents[1] / "data" / "variants"


def _step(script: str, state: Path) -> str:
    """This launch's step, the launch counted in ``state``."""
    state.mkdir(parents=True, exist_ok=True)
    counter = state / hashlib.sha256(script.encode()).hexdigest()[:16]
    n = int(counter.read_text()) if counter.exists() else 0
    counter.write_text(str(n + 1))
    steps = script.split(",")
    return steps[min(n, len(steps) - 1)]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--script", default="ok")
    parser.add_argument("--state", type=Path, required=True)
    parser.add_argument("--flavor", default="plain", help="taken and ignored (a knob for isolation to toggle)")
    parser.add_argument("--ttft-ms", default="5")
    parser.add_argument("--itl-ms", default="1")
    args = parser.parse_args()
    step = _step(args.script, args.state)
    print(f"scripted server: step {step!r} of {args.script!r}", flush=True)
    if step.startswith("die:"):
        (log,) = LOGS.glob(step[4:] + "*.log")
        for line in log.read_text().splitlines():
            print(line, flush=True)
        sys.exit(1)
    print("Loading the model", flush=True)
    if step == "hang":
        while True:
            time.sleep(3600)
    if step != "ok":
        sys.exit(f"unknown step {step!r}")
    testing.main(["--port", str(args.port), "--ttft-ms", args.ttft_ms, "--itl-ms", args.itl_ms, "--tokens", "4"])


if __name__ == "__main__":
    main()
