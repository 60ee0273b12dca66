"""Cold start against a wake restore of the reference server (issue 30): a table and JSON, medians of a few rounds.

Each round, on this machine:

1. **cold**: the known-good starts from nothing (``python -m campaign.refserver``): launch to ready (the ready line in
   its log and /health 200), then the proof questions, whose answer tokens' log-probabilities are recorded;
2. **park**: it is parked through the recipe's ``park:`` block (``campaign.parking``); its processes' RSS and GPU
   memory are measured before and after, and the machine's GPU memory in use (nvidia-smi) where there is one;
3. **variant**: another server starts on another port with a fault that changes its answers (``--inject-fault
   attention-x0.7``), the GPU memory in use is measured while it runs, and it is stopped (TERM to its group);
4. **wake restore**: the known-good is woken, ready again (/health 200) and proven: every proof answer right and
   its log-probabilities equal to those recorded at step 1.

``restore_s`` is stop + wake + ready + prove; ``ratio`` is ``restore_s`` over the cold start's launch to ready,
``ratio_to_relaunch`` over what a relaunch restore costs (stop + cold start + the same proof), ``wake_ready_ratio``
the wake and readiness alone over the cold start. The
GPU run (``scripts/gpu.sh wake``) adds the server's flags after ``--``; ``--via cuda_checkpoint`` parks a server
started with ``--disable-sleep-mode`` through ``cuda-checkpoint --toggle`` instead of its routes.

    .venv/bin/python scripts/bench_wake.py --rounds 3 --json wake.json
    python3 scripts/bench_wake.py --rounds 3 --json wake.json -- --device cuda --attention-backend mma --dtype bfloat16
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import socket
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx

from campaign.config import Parking, load_recipe
from campaign.hosts.local import LocalHost
from campaign.parking import Memory, gpu_by_pid, park, wake

QUESTIONS = {"What is 17×23?": "391", "What is 5-77?": "-72", "What is 63+58?": "121"}
READY = "The server is fired up and ready to roll!"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def launch(args: list[str], port: int, log: Path) -> subprocess.Popen[bytes]:
    """The server in a session of its own (its group is what a stop signals), logging to ``log``."""
    with log.open("wb") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "campaign.refserver", "--host", "127.0.0.1", "--port", str(port), *args],
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )


def wait_ready(proc: subprocess.Popen[bytes], url: str, log: Path, *, marker: bool, timeout: float = 900.0) -> None:
    """Until the ready line (when ``marker``) and /health answers 200."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"the server exited {proc.returncode}:\n{log.read_text()[-3000:]}")
        if not marker or READY in log.read_text(errors="replace"):
            try:
                if httpx.get(f"{url}/health", timeout=20).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
        time.sleep(0.02)
    raise SystemExit(f"not ready within {timeout:.0f} s:\n{log.read_text()[-3000:]}")


def prove(url: str) -> tuple[bool, list[list[float]]]:
    """Every proof question answered right, and each answer's token log-probabilities; asked at once (one batch)."""

    def ask(item: tuple[str, str]) -> tuple[bool, list[float]]:
        question, expected = item
        body = {"messages": [{"role": "user", "content": question}], "max_tokens": 8, "temperature": 0}
        reply = httpx.post(f"{url}/v1/chat/completions", json={**body, "logprobs": True}, timeout=60).json()
        choice = reply["choices"][0]
        return choice["message"]["content"] == expected, [c["logprob"] for c in choice["logprobs"]["content"]]

    with ThreadPoolExecutor(len(QUESTIONS)) as pool:
        answers = list(pool.map(ask, QUESTIONS.items()))
    return all(right for right, _ in answers), [lps for _, lps in answers]


def group(proc: subprocess.Popen[bytes]) -> list[int]:
    """The live processes of the server's group."""
    out = subprocess.run(["pgrep", "-g", str(proc.pid)], capture_output=True, text=True, check=False).stdout
    return [int(p) for p in out.split()]


def stop(proc: subprocess.Popen[bytes]) -> float:
    """TERM the server's group and wait for its leader; seconds it took."""
    began = time.monotonic()
    try:
        os.killpg(proc.pid, signal.SIGTERM)  # our own child's group
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    except ProcessLookupError:
        pass
    while group(proc):
        time.sleep(0.02)
    return time.monotonic() - began


def gpu_used() -> int | None:
    """GPU memory in use on the machine's first GPU (bytes), or None without nvidia-smi."""
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    return int(out.split()[0]) << 20


def mem(m: Memory) -> dict[str, int | None]:
    return {"rss_bytes": m.rss_bytes, "gpu_bytes": m.gpu_bytes}


def one_round(server_args: list[str], spec: Parking, workdir: Path) -> dict[str, Any]:
    host = LocalHost()
    port, vport = free_port(), free_port()
    url, vurl = host.url(port), host.url(vport)
    row: dict[str, Any] = {"port": port, "variant_port": vport, "gpu_used_idle": gpu_used()}
    began = time.monotonic()
    known = launch(server_args, port, workdir / "known-good.log")
    try:
        wait_ready(known, url, workdir / "known-good.log", marker=True)
        row["cold_ready_s"] = time.monotonic() - began
        t = time.monotonic()
        right, proven = prove(url)
        row["cold_prove_s"] = time.monotonic() - t
        assert right, "the known-good answered wrong at its cold start"
        row["gpu_used_ready"] = gpu_used()
        held = gpu_by_pid(host)
        # The processes a checkpoint toggles: those holding GPU memory (on a CPU machine, none: it is refused).
        gpu_pids = [p for p in group(known) if held and p in held]
        parked = park(host, port, spec, group(known), gpu_pids=gpu_pids)
        row |= {"park_s": parked.seconds, "before_park": mem(parked.before), "parked": mem(parked.after)}
        row["gpu_used_parked"] = gpu_used()

        t = time.monotonic()
        variant = launch([*server_args, "--inject-fault", "attention-x0.7"], vport, workdir / "variant.log")
        try:
            wait_ready(variant, vurl, workdir / "variant.log", marker=True)
            row["variant_ready_s"] = time.monotonic() - t
            row["gpu_used_variant"] = gpu_used()
            row["variant_same_logprobs"] = prove(vurl)[1] == proven
        finally:
            row["stop_s"] = stop(variant)

        t = time.monotonic()
        woke = wake(host, port, spec, group(known), gpu_pids=gpu_pids)
        row["wake_s"] = woke.seconds
        row["woken"] = mem(woke.after)
        t_ready = time.monotonic()
        wait_ready(known, url, workdir / "known-good.log", marker=False)
        row["ready_s"] = time.monotonic() - t_ready
        t_prove = time.monotonic()
        right, again = prove(url)
        row["prove_s"] = time.monotonic() - t_prove
        row["proven"] = right and again == proven
        row["restore_s"] = row["stop_s"] + (time.monotonic() - t)
        row["ratio"] = row["restore_s"] / row["cold_ready_s"]
        # Against a relaunch, which pays the same stop and proof around a cold start; and the wake alone.
        row["relaunch_s"] = row["stop_s"] + row["cold_ready_s"] + row["cold_prove_s"]
        row["ratio_to_relaunch"] = row["restore_s"] / row["relaunch_s"]
        row["wake_ready_ratio"] = (row["wake_s"] + row["ready_s"]) / row["cold_ready_s"]
    finally:
        stop(known)
    return row


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--json", type=Path, default=None, help="write every round and the medians here")
    p.add_argument("--via", choices=["endpoints", "cuda_checkpoint"], default="endpoints")
    p.add_argument("--workdir", type=Path, default=Path("/tmp/bench-wake"))
    p.add_argument("server_args", nargs="*", help="the server's flags (after --); default: CPU, no graphs")
    a = p.parse_args()
    server_args = a.server_args or ["--device", "cpu", "--disable-cuda-graph"]
    recipe = load_recipe("refserver").park
    assert recipe is not None
    spec = recipe if a.via == "endpoints" else Parking(via="cuda_checkpoint")
    if a.via == "cuda_checkpoint":
        server_args = [*server_args, "--disable-sleep-mode"]
    a.workdir.mkdir(parents=True, exist_ok=True)
    rounds = []
    for i in range(a.rounds):
        row = one_round(server_args, spec, a.workdir)
        rounds.append(row)
        print(
            f"round {i + 1}: cold start {row['cold_ready_s']:.2f} s; restore {row['restore_s']:.2f} s "
            f"(stop {row['stop_s']:.2f}, wake {row['wake_s']:.3f}, ready {row['ready_s']:.3f}, "
            f"prove {row['prove_s']:.3f}); ratio {row['ratio']:.3f}; proven {row['proven']}",
            flush=True,
        )
    keys = [
        "cold_ready_s",
        "cold_prove_s",
        "park_s",
        "stop_s",
        "wake_s",
        "ready_s",
        "prove_s",
        "restore_s",
        "ratio",
        "relaunch_s",
        "ratio_to_relaunch",
        "wake_ready_ratio",
    ]
    medians = {k: statistics.median(r[k] for r in rounds) for k in keys}
    print(f"\n{'median of ' + str(len(rounds)) + ' rounds':<24}{'value':>10}")
    for k in keys:
        print(f"{k:<24}{medians[k]:>10.3f}")
    last = rounds[-1]

    def mib(v: int | None) -> str:
        return "n/a" if v is None else f"{v / (1 << 20):.0f} MiB"

    print("\nmemory (last round)        RSS          GPU (its processes)   GPU used on the machine")
    for label, m, used in (
        ("ready", last["before_park"], last["gpu_used_ready"]),
        ("parked", last["parked"], last["gpu_used_parked"]),
        ("variant running", None, last["gpu_used_variant"]),
        ("woken", last["woken"], None),
    ):
        rss, gpu = (mib(m["rss_bytes"]), mib(m["gpu_bytes"])) if m else ("-", "-")
        print(f"{label:<26} {rss:<12} {gpu:<21} {mib(used)}")
    print(
        f"all proven by log-probabilities: {all(r['proven'] for r in rounds)}; "
        f"the faulty variant's differed: {not any(r['variant_same_logprobs'] for r in rounds)}"
    )
    if a.json is not None:
        doc = {
            "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
            "machine": platform.node(),
            "python": platform.python_version(),
            "server_args": server_args,
            "via": a.via,
            "rounds": rounds,
            "medians": medians,
        }
        a.json.write_text(json.dumps(doc, indent=2) + "\n")
    return 0 if all(r["proven"] for r in rounds) else 1


if __name__ == "__main__":
    sys.exit(main())
