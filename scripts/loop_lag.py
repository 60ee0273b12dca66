"""Measure the campaign loop's own latencies on the local host and over real loopback SSH.

Runs one experiment per host with the reference server on the CPU: a baseline, ``--repeats`` relaunches of it, and
one variant that dies at start (CUDA graphs without a GPU). The figures are the ones the tool records itself in
each attempt: launch_to_ready_s, ready_detect_lag_s (ready line written -> readiness acted on), death_detect_lag_s
(server exit -> noticed), stop_s and smoke_s. Prints a table of medians, p90 and max; writes JSON.

    .venv/bin/python scripts/loop_lag.py --repeats 6 --json docs/results/2026-12-02-dev-vm/loop-lag.json
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from campaign.hosts.ssh.testing import start_test_sshd

REPO = Path(__file__).resolve().parents[1]

METRICS = ("launch_to_ready_s", "ready_detect_lag_s", "death_detect_lag_s", "stop_s", "smoke_s")


def run_experiment(tmp: Path, name: str, host: dict[str, Any], repeats: int, port: int) -> dict[str, Any]:
    """Run the measuring experiment on one host through the CLI; returns its --json document."""
    doc = {
        "name": name,
        "host": {**host, "workdir": str(tmp / f"box-{name}")},
        "recipe": "refserver",
        "vars": {"python": sys.executable},
        "baseline": {"knobs": {"device": "cpu", "attention": "torch", "cuda_graph": False, "port": port}},
        "variants": [{"name": f"again-{i}", "knobs": {"max_batch": 64 + i}} for i in range(repeats)]
        + [{"name": "dies", "knobs": {"cuda_graph": True}}],
        "smoke": {"questions": 4},
        "timeouts": {"ready_s": 60, "stop_grace_s": 5},
        "at_end": "stop",
    }
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    res = subprocess.run(
        [sys.executable, "-m", "campaign.cli", "--runs-dir", str(tmp / "runs"), "run", str(path), "--json"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    if res.returncode not in (0, 1):
        raise SystemExit(f"{name}: campaign exited {res.returncode}:\n{res.stderr[-3000:]}")
    out: dict[str, Any] = json.loads(res.stdout)
    return out


def summarise(doc: dict[str, Any]) -> dict[str, dict[str, float | int]]:
    """Median, p90, max and count of each latency over the run's attempts."""
    table: dict[str, dict[str, float | int]] = {}
    for metric in METRICS:
        values = sorted(a["timings"][metric] for a in doc["attempts"] if a["timings"].get(metric) is not None)
        if not values:
            continue
        p90 = values[min(len(values) - 1, round(0.9 * (len(values) - 1)))]
        table[metric] = {
            "n": len(values),
            "median": round(statistics.median(values), 4),
            "p90": round(p90, 4),
            "max": round(values[-1], 4),
        }
    return table


def main() -> None:
    """Measure on both hosts, print the table, write the JSON."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=6, help="relaunches of the baseline per host")
    ap.add_argument("--json", type=Path, default=None, help="write the figures here")
    args = ap.parse_args()
    results: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "machine": f"{platform.node()} {platform.machine()}, {platform.processor() or ''}".strip(", "),
        "python": platform.python_version(),
        "command": " ".join(["python", *sys.argv]),
        "hosts": {},
    }
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        (tmp / "sshd").mkdir()
        server, proc = start_test_sshd(tmp / "sshd")
        try:
            for i, (name, host) in enumerate([("local", {"kind": "local"}), ("ssh", server.host_config())]):
                doc = run_experiment(tmp, name, host, args.repeats, 31800 + i)
                results["hosts"][name] = summarise(doc)
        finally:
            proc.terminate()
            proc.wait(timeout=10)
    print(f"{'host':6} {'metric':20} {'n':>3} {'median':>8} {'p90':>8} {'max':>8}")
    for host, table in results["hosts"].items():
        for metric, row in table.items():
            print(f"{host:6} {metric:20} {row['n']:>3} {row['median']:>8.3f} {row['p90']:>8.3f} {row['max']:>8.3f}")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
