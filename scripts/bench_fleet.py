"""Measure a fleet against one host: the same three-variant experiment run serially and over two SSH hosts.

Two real sshd on 127.0.0.1 stand for two boxes (their own keys, workdir, state folder and port). Each round runs
the experiment once on one host (``host:``: baseline + three variants, one after the other) and once as a fleet
(``hosts:`` with both: each host proves its own baseline, the three variants go to whichever host is free), with
the reference server on the CPU, through the CLI as a user runs it. The figure is the wall time of each
`campaign run`; the table gives the median over the rounds, and the ratio serial / fleet.

Both boxes are this machine, so on its CPU two servers starting at once share its cores, which two GPU boxes would
not. ``--load-s`` stands in for what a real box spends on its own: every server waits that long at interpreter
start (a sitecustomize on its PYTHONPATH; a real model's weights load for 10-30 minutes); 0 measures the bare
reference server, whose start is all CPU.

    .venv/bin/python scripts/bench_fleet.py --rounds 3 --load-s 8 --json docs/results/2026-12-03-dev-vm/fleet.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from importlib import metadata
from pathlib import Path
from typing import Any

import yaml

from campaign import __version__
from campaign.hosts.ssh.testing import SSHServer, start_test_sshd

REPO = Path(__file__).resolve().parents[1]
VARIANTS = [
    {"name": "small", "knobs": {"max_batch": 8}},
    {"name": "medium", "knobs": {"max_batch": 16}},
    {"name": "large", "knobs": {"max_batch": 32}},
]


def free_port() -> int:
    """A loopback port nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def experiment(tmp: Path, name: str, servers: list[SSHServer], load_s: float) -> Path:
    """The three-variant experiment over ``servers`` (one: ``host:``, several: ``hosts:``); returns its path."""
    hosts = [
        {
            **server.host_config(),
            "workdir": str(tmp / f"box-{i}"),
            "state_dir": str(tmp / f"state-{i}"),
            "knobs": {"port": free_port()},
        }
        for i, server in enumerate(servers)
    ]
    env: dict[str, str] = {}
    if load_s > 0:
        folder = tmp / "load"
        folder.mkdir(exist_ok=True)
        (folder / "sitecustomize.py").write_text(f"import time\ntime.sleep({load_s})\n")
        env["PYTHONPATH"] = str(folder)
    doc: dict[str, Any] = {
        "name": name,
        **({"host": hosts[0]} if len(hosts) == 1 else {"hosts": hosts}),
        "recipe": "refserver",
        "vars": {"python": sys.executable},
        "baseline": {"knobs": {"device": "cpu", "attention": "torch", "cuda_graph": False}, "env": env},
        "variants": VARIANTS,
        "smoke": {"questions": 2, "seed": 3, "burst": False},
        "timeouts": {"ready_s": 180, "stop_grace_s": 5},
        "at_end": "stop",
    }
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def run_once(tmp: Path, path: Path) -> dict[str, Any]:
    """One `campaign run` of ``path``: its wall time and what the report says (attempts per host)."""
    t0 = time.monotonic()
    res = subprocess.run(
        [sys.executable, "-m", "campaign.cli", "--runs-dir", str(tmp / "runs"), "run", str(path), "--json"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    wall = time.monotonic() - t0
    if res.returncode != 0:
        raise SystemExit(f"{path.name}: campaign run exited {res.returncode}:\n{res.stderr[-3000:]}")
    doc = json.loads(res.stdout)
    report = json.loads((tmp / "runs" / doc["run_id"] / "report.json").read_text())
    per_host: dict[str, int] = {}
    for a in report["attempts"]:
        per_host[a["host"]] = per_host.get(a["host"], 0) + 1
    return {"wall_s": round(wall, 2), "run_id": doc["run_id"], "attempts_per_host": per_host}


def main() -> None:
    """Run the rounds, print the table, write the JSON."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3, help="serial and fleet runs each (alternating)")
    ap.add_argument("--load-s", type=float, default=8.0, help="seconds each server waits at start (0: none)")
    ap.add_argument("--json", type=Path, default=None, help="write the figures here")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-fleet-") as raw:
        tmp = Path(raw)
        started = [start_test_sshd(_mkdir(tmp / f"sshd-{i}")) for i in range(2)]
        servers = [s for s, _p in started]
        try:
            serial = experiment(tmp, "serial", servers[:1], args.load_s)
            fleet = experiment(tmp, "fleet", servers, args.load_s)
            rows: dict[str, list[dict[str, Any]]] = {"serial": [], "fleet": []}
            for i in range(args.rounds):
                for mode, path in (("serial", serial), ("fleet", fleet)):
                    rows[mode].append(run_once(tmp, path))
                    print(f"round {i + 1} {mode}: {rows[mode][-1]['wall_s']:.1f} s", file=sys.stderr)
        finally:
            for _s, proc in started:
                proc.terminate()
                proc.wait(timeout=10)
    med = {mode: statistics.median(r["wall_s"] for r in rs) for mode, rs in rows.items()}
    ratio = med["serial"] / med["fleet"]
    print(f"{'mode':8} {'hosts':>5} {'runs':>4} {'median s':>9} {'min s':>7} {'max s':>7}")
    for mode, rs in rows.items():
        walls = [r["wall_s"] for r in rs]
        hosts = 1 if mode == "serial" else 2
        print(f"{mode:8} {hosts:>5} {len(rs):>4} {med[mode]:>9.1f} {min(walls):>7.1f} {max(walls):>7.1f}")
    print(f"serial / fleet: {ratio:.2f}x")
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        doc = {
            "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "machine": f"{platform.node()} ({platform.machine()}, {_cpus()} CPUs), {platform.platform()}",
            "cpu": _cpu_model(),
            "python": platform.python_version(),
            "campaign": __version__,
            "versions": _versions(),
            "command": " ".join(["scripts/bench_fleet.py", *sys.argv[1:]]),
            "load_s": args.load_s,
            "variants": [v["name"] for v in VARIANTS],
            "runs": rows,
            "median_s": med,
            "serial_over_fleet": round(ratio, 3),
        }
        args.json.write_text(json.dumps(doc, indent=2) + "\n")


def _mkdir(path: Path) -> Path:
    path.mkdir(parents=True)
    return path


def _cpus() -> int:
    return os.cpu_count() or 0


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "?"


def _versions() -> dict[str, str]:
    """The versions the figures depend on: the SSH client library, OpenSSH's sshd, the server's torch."""
    out = {}
    for name in ("paramiko", "torch", "httpx"):
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = "absent"
    ssh = subprocess.run(["ssh", "-V"], capture_output=True, text=True, check=False)
    out["openssh"] = (ssh.stderr or ssh.stdout).strip()
    return out


if __name__ == "__main__":
    main()
