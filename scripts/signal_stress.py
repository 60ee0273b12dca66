"""Ctrl-C at random moments of the smoke phase, many times over: does every run end as docs/reliability.md says?

    python scripts/signal_stress.py [--runs 12] [--parallel 3] [--when smoke|anywhere] [--signals INT,TERM]
                                    [--json FILE]

Each run is ``campaign run`` of a two-variant experiment on the reference server on CPU (baseline, then ``asked``
with a 60-question smoke), and one real signal sent to the CLI alone (drawn per run from ``--signals``):

- ``--when smoke``: once "#1 ready in" shows, after a delay drawn from 0 s (often), 0-50 ms, 0-0.3 s or 0-1.5 s;
- ``--when anywhere``: at a uniform moment between the run's start line and ``--span`` seconds later (stop,
  launch, readiness, smoke of either variant; a run that ended first is counted ``finished first``).

Running several at once on a small machine stretches the timing, which is the point: a signal lands in more
places. A run ends ``clean`` (exit 128 + the signal: 130 for SIGINT, 143 for SIGTERM; the report ``interrupted`` with a
healthy final state, the lock released),
``lost`` (any other exit or record: the signal did not stop the run as documented) or ``hung`` (still running 120
s after the signal; its stderr tail, with every thread's stack, is kept). Prints a table, writes JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]


def free_port() -> int:
    """A port nothing listens on now (the OS picks it)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def experiment(tmp: Path) -> Path:
    """The experiment of tests/test_faults.py's mid-smoke case: the refserver on CPU, a 60-question smoke."""
    doc = {
        "name": "smokeint",
        "host": {"kind": "local", "workdir": str(tmp / "box")},
        "recipe": "refserver",
        "vars": {"python": sys.executable},
        "baseline": {"knobs": {"device": "cpu", "attention": "torch", "cuda_graph": False, "port": free_port()}},
        "variants": [{"name": "asked", "knobs": {"max_batch": 4}}],
        "smoke": {"questions": 60, "seed": 1, "burst": False},
        "timeouts": {"ready_s": 120, "stop_grace_s": 3},
    }
    path = tmp / "smokeint.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def one(i: int, seed: int, when: str, span: float, signals: list[int]) -> dict[str, Any]:
    """One run, one signal; its outcome. What the run left running (the restored known-good) is stopped after."""
    tmp = Path(tempfile.mkdtemp(prefix=f"signal-stress-{i}-"))
    try:
        return _one(tmp, i, seed, when, span, signals)
    finally:
        # Each run ends with its known-good serving, as it should: some 400 MB a server, so a few dozen runs
        # left up would exhaust a small machine's memory.
        subprocess.run(
            [sys.executable, "-m", "campaign.cli", "--runs-dir", str(tmp / "runs"), "stop", str(tmp / "smokeint.yaml")],
            cwd=REPO,
            env={**os.environ, "CAMPAIGN_HOST_STATE": str(tmp / "state")},
            capture_output=True,
        )


def _one(tmp: Path, i: int, seed: int, when: str, span: float, signals: list[int]) -> dict[str, Any]:
    rng = random.Random(seed * 1000 + i)
    sig = rng.choice(signals)
    if when == "smoke":
        mark, delay = (
            "#1 ready in",
            rng.choice([0.0, 0.0, rng.uniform(0, 0.05), rng.uniform(0, 0.3), rng.uniform(0, 1.5)]),
        )
    else:
        mark, delay = "run ", rng.uniform(0, span)
    (tmp / "state").mkdir()
    env = {**os.environ, "CAMPAIGN_HOST_STATE": str(tmp / "state"), "PYTHONFAULTHANDLER": "1"}
    err_path = tmp / "stderr"
    cmd = [sys.executable, "-m", "campaign.cli", "--runs-dir", str(tmp / "runs"), "run", str(experiment(tmp))]
    with err_path.open("wb") as err:
        proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=err, start_new_session=True)
        t0 = time.monotonic()
        while mark not in err_path.read_text(errors="replace"):
            if proc.poll() is not None or time.monotonic() - t0 > 600:
                proc.kill()
                return {"run": i, "delay_s": delay, "outcome": "no ready", "rc": proc.wait(), "folder": str(tmp)}
            time.sleep(0.02)
        time.sleep(delay)
        if proc.poll() is not None:
            return {"run": i, "delay_s": round(delay, 3), "outcome": "finished first", "rc": proc.returncode}
        os.kill(proc.pid, sig)
        sent = time.monotonic()
        try:
            rc = proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGABRT)  # the fault handler prints every thread's stack
            time.sleep(5)
            proc.kill()
            proc.wait()
            tail = err_path.read_text(errors="replace")[-6000:]
            return {"run": i, "delay_s": delay, "outcome": "hung", "rc": None, "folder": str(tmp), "stderr": tail}
    outcome = "clean" if rc == 128 + sig and _cleaned_up(tmp) else "lost"
    end_s = round(time.monotonic() - sent, 1)
    row: dict[str, Any] = {
        "run": i,
        "signal": signal.Signals(sig).name,
        "delay_s": round(delay, 3),
        "outcome": outcome,
        "rc": rc,
        "end_s": end_s,
    }
    if outcome != "clean":
        row["folder"], row["stderr"] = str(tmp), err_path.read_text(errors="replace")[-6000:]
    return row


def _cleaned_up(tmp: Path) -> bool:
    """The run's record says ``interrupted`` with a healthy box, and the host lock is gone."""
    show = subprocess.run(
        [sys.executable, "-m", "campaign.cli", "--runs-dir", str(tmp / "runs"), "show", "last", "--json"],
        cwd=REPO,
        env={**os.environ, "CAMPAIGN_HOST_STATE": str(tmp / "state")},
        capture_output=True,
        text=True,
    )
    if show.returncode != 0:
        return False
    doc = json.loads(show.stdout)
    return bool(doc["status"] == "interrupted" and doc["final"]["healthy"] and not (tmp / "state" / "lock").exists())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--runs", type=int, default=12)
    ap.add_argument("--parallel", type=int, default=3)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--when", choices=["smoke", "anywhere"], default="smoke")
    ap.add_argument("--span", type=float, default=60.0, help="--when anywhere: the window after the start line (s)")
    ap.add_argument("--signals", default="INT", help="comma-separated, drawn per run: INT, TERM, HUP")
    ap.add_argument("--json", type=Path, help="write every run here")
    args = ap.parse_args()
    signals = [int(signal.Signals[f"SIG{name.strip().upper()}"]) for name in args.signals.split(",")]
    with ThreadPoolExecutor(args.parallel) as pool:
        rows = list(pool.map(lambda i: one(i, args.seed, args.when, args.span, signals), range(args.runs)))
    print(f"{'run':>4} {'signal':>7} {'delay s':>8} {'outcome':>8} {'rc':>4} {'end s':>6}")
    for r in rows:
        print(
            f"{r['run']:>4} {r.get('signal', '-'):>7} {r['delay_s']:>8.3f} {r['outcome']:>8} {r['rc']!s:>4} "
            f"{r.get('end_s', '-')!s:>6}"
        )
    kinds = ("clean", "finished first", "lost", "hung", "no ready")
    counts = {k: sum(r["outcome"] == k for r in rows) for k in kinds}
    print(", ".join(f"{k}: {v}" for k, v in counts.items()))
    for r in rows:
        if r["outcome"] not in ("clean", "finished first"):
            print(f"--- run {r['run']} ({r['outcome']}), {r['folder']}\n{r.get('stderr', '')}")
    if args.json:
        doc = {
            "parallel": args.parallel,
            "seed": args.seed,
            "when": args.when,
            "span_s": args.span,
            "signals": args.signals,
            "runs": rows,
        }
        args.json.write_text(json.dumps(doc, indent=2))
    return 0 if counts["clean"] + counts["finished first"] == len(rows) else 1


if __name__ == "__main__":
    sys.exit(main())
