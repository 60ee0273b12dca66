"""The campaign loop end to end: the real CLI, the real reference server, a real sshd on loopback.

Each test runs `campaign` as a user would (a subprocess, --json on stdout) against experiment files written to a
tmp folder, then checks what a user would check: outcomes, diagnoses, restores, the run store, the host's state.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from campaign.hosts.ssh.testing import SSHServer, cut_connections, start_test_sshd
from campaign.records import ErrorDocument, HostStatus, RunSummary
from tests.helpers import run_cli as campaign

REPO = Path(__file__).resolve().parents[1]
SECRET = "hf_s3cr3t-value-0123456789"
_next_port = [31400 + (os.getpid() % 200) * 3]


def free_port() -> int:
    """A loopback port nobody listens on (a fresh one per experiment, so tests never share a server)."""
    import socket

    while True:
        _next_port[0] += 1
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", _next_port[0]))
            except OSError:
                continue
            return _next_port[0]


def experiment(tmp: Path, name: str, host: dict[str, Any], variants: list[dict[str, Any]], **extra: Any) -> Path:
    """Write an experiment file for the reference server on CPU and return its path."""
    port = free_port()
    doc: dict[str, Any] = {
        "name": name,
        "host": {**host, "workdir": str(tmp / "box")},
        "recipe": "refserver",
        "vars": {"python": sys.executable},
        "baseline": {"knobs": {"device": "cpu", "attention": "torch", "cuda_graph": False, "port": port}},
        "variants": variants,
        "smoke": {"questions": 4, "seed": 3},
        "timeouts": {"ready_s": 60, "stop_grace_s": 5},
        **extra,
    }
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


@pytest.fixture(scope="session")
def untrained_weights(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real model that was never trained: it loads and answers, wrongly."""
    out = tmp_path_factory.mktemp("weights") / "untrained.safetensors"
    subprocess.run(
        [sys.executable, "-m", "campaign.refserver.train", "--steps", "0", "--device", "cpu", "--out", str(out)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    return out


def by_variant(doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The run's attempts of role variant, keyed by variant name."""
    return {a["variant"]: a for a in doc["attempts"] if a["role"] == "variant"}


def test_full_loop_over_ssh(sshd: SSHServer, tmp_path: Path, untrained_weights: Path) -> None:
    """Pass, die, stall, answer wrong, survive hostile values: each failure diagnosed and the box restored."""
    pwned = tmp_path / "pwned"
    hostile = f"$(touch {pwned}); `touch {pwned}`; touch {pwned}\nsecond line 'quoted' \"double\""
    stall_port = free_port()
    path = experiment(
        tmp_path,
        "full",
        sshd.host_config(),
        [
            {"name": "cuda-graphs", "knobs": {"cuda_graph": True}},
            {"name": "untrained", "knobs": {"model_path": str(untrained_weights)}},
            # The server listens elsewhere than the recipe probes: the ready line appears, health never answers.
            {"name": "wrong-port", "args": ["--port", str(stall_port)]},
            {"name": "hostile", "env": {"CAMPAIGN_HOSTILE": hostile, "HF_TOKEN": SECRET}},
        ],
        timeouts={"ready_s": 25, "stop_grace_s": 5},
    )
    runs = tmp_path / "runs"
    res = campaign("run", str(path), "--json", runs=runs)
    assert res.returncode == 1, res.stderr
    doc = json.loads(res.stdout)
    # The document is a RunSummary, key for key.
    assert json.loads(RunSummary.model_validate(doc).model_dump_json()) == doc
    att = by_variant(doc)

    base = att["baseline"]
    assert base["outcome"] == "passed"
    # 5 questions asked alone, then again in bursts of 2, 4, 8, 16 and 32 (no batch knob set: smoke's default).
    assert base["smoke"] == {"passed": 5 + 62, "total": 5 + 62}
    assert base["timings"]["ready_detect_lag_s"] < 0.5

    dies = att["cuda-graphs"]
    assert dies["outcome"] == "failed"
    assert dies["failed_phase"] == "graph_capture"
    assert dies["diagnosis"]["kind"] in {"unsupported_hardware", "cuda_graph_capture_failed"}
    assert any("Capture cuda graph" in e["text"] or "CUDA" in e["text"] for e in dies["diagnosis"]["evidence"])
    assert dies["timings"]["death_detect_lag_s"] < 1.0
    assert dies["restore"]["outcome"] == "restored"

    wrong = att["untrained"]
    assert wrong["failed_phase"] == "smoke"
    assert wrong["diagnosis"]["kind"] == "wrong_output"
    assert wrong["smoke"]["passed"] < wrong["smoke"]["total"]
    assert wrong["restore"]["outcome"] == "restored"

    stall = att["wrong-port"]
    assert stall["failed_phase"] == "ready"
    assert stall["diagnosis"]["kind"] == "startup_timeout"
    assert stall["restore"]["outcome"] == "restored"

    ok = att["hostile"]
    assert ok["outcome"] == "passed"
    assert not pwned.exists(), "a config value reached a shell unquoted"

    # Every restore relaunched the baseline's exact spec and proved it.
    restores = [a for a in doc["attempts"] if a["role"] == "restore"]
    assert len(restores) == 3
    assert all(r["outcome"] == "passed" and r["spec_hash"] == base["spec_hash"] for r in restores)
    assert doc["restore"]["outcome"] == "restored"
    assert doc["final"] == {"variant": "hostile", "spec_hash": ok["spec_hash"], "healthy": True, "detail": None}

    # The hostile value arrived literally in the server's environment (read from /proc of the live server).
    status = json.loads(campaign("status", str(path), "--json", runs=runs).stdout)
    assert HostStatus.model_validate(status).running is not None
    assert status["running"]["variant"] == "hostile" and status["health"] == 200
    assert status["known_good"]["variant"] == "hostile"
    pgid = status["running"]["pgid"]
    envs = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                if os.getpgid(int(proc.name)) == pgid:
                    envs.append((proc / "environ").read_bytes().split(b"\0"))
            except (ProcessLookupError, PermissionError, FileNotFoundError):
                continue
    assert any(f"CAMPAIGN_HOSTILE={hostile}".encode() in env for env in envs)

    # The secret reached the server but nothing we print or write.
    assert any(f"HF_TOKEN={SECRET}".encode() in env for env in envs)
    assert SECRET not in res.stdout + res.stderr
    run_dir = runs / doc["run_id"]
    for f in run_dir.rglob("*"):
        if f.is_file():
            assert SECRET.encode() not in f.read_bytes(), f

    # The stored report and the logs agree with what was printed.
    shown = json.loads(campaign("show", doc["run_id"], "--json", runs=runs).stdout)
    assert [a["outcome"] for a in shown["attempts"]] == [a["outcome"] for a in doc["attempts"]]
    log = campaign("logs", doc["run_id"], "--attempt", str(dies["index"]), runs=runs)
    assert "Capture cuda graph" in log.stdout

    stopped = campaign("stop", str(path), "--json", runs=runs)
    assert stopped.returncode == 0 and json.loads(stopped.stdout)["clean"]
    status = json.loads(campaign("status", str(path), "--json", runs=runs).stdout)
    assert status["running"] is None


def test_restore_command_relaunches_known_good(sshd: SSHServer, tmp_path: Path) -> None:
    """`campaign restore` brings back exactly the proven spec and proves it; with none recorded it is loud."""
    runs = tmp_path / "runs"
    path = experiment(tmp_path, "restorable", sshd.host_config(), [], at_end="stop")
    empty = campaign("restore", str(path), "--json", runs=runs)
    assert empty.returncode == 3
    assert "no known-good" in empty.stderr
    # Under --json the error is an ErrorDocument, key for key.
    refused = json.loads(empty.stdout)
    assert json.loads(ErrorDocument.model_validate(refused).model_dump_json()) == refused
    assert refused["kind"] == "RestoreFailed" and refused["exit_code"] == 3
    first = json.loads(campaign("run", str(path), "--json", runs=runs).stdout)
    assert first["exit_code"] == 0
    res = campaign("restore", str(path), "--json", runs=runs)
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout)
    # The document is a RunSummary, key for key.
    assert json.loads(RunSummary.model_validate(doc).model_dump_json()) == doc
    assert doc["attempts"][0]["role"] == "restore"
    assert doc["attempts"][0]["spec_hash"] == first["attempts"][0]["spec_hash"]
    assert doc["final"]["healthy"] is True
    campaign("stop", str(path), runs=runs)


def test_a_dropped_ssh_connection_does_not_end_the_run(tmp_path: Path) -> None:
    """sshd drops every connection while the baseline starts: the loop reconnects and the run passes."""
    (tmp_path / "sshd").mkdir()
    server, proc = start_test_sshd(tmp_path / "sshd")
    try:
        path = experiment(tmp_path, "blip", server.host_config(), [{"name": "bigger-batch", "knobs": {"max_batch": 8}}])
        runs = tmp_path / "runs"
        cli = subprocess.Popen(
            [sys.executable, "-m", "campaign.cli", "--runs-dir", str(runs), "run", str(path), "--json"],
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        # The box is this machine: cut the connections once the baseline's server log exists (it is starting).
        deadline = time.monotonic() + 60
        while not list((tmp_path / "box").glob("runs/*/*-baseline/server.log")) and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.3)
        cut = cut_connections(proc.pid)
        out, err = cli.communicate(timeout=300)
        assert cut > 0
        assert cli.returncode == 0, err
        doc = json.loads(out)
        assert [a["outcome"] for a in doc["attempts"]] == ["passed", "passed"]
        assert len(server.accepted_logins()) >= 2  # the loop connected again, verifying the host key again
        campaign("stop", str(path), runs=runs)
    finally:
        proc.terminate()
        proc.wait(timeout=5)


def test_unknown_host_key_is_refused(sshd: SSHServer, tmp_path: Path) -> None:
    """An sshd whose key is not in known_hosts is refused unless the user says to accept new keys."""
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    host = {**sshd.host_config(), "known_hosts": str(empty)}
    path = experiment(tmp_path, "unknown-key", host, [], at_end="stop")
    runs = tmp_path / "runs"
    res = campaign("run", str(path), "--json", runs=runs)
    assert res.returncode == 2
    assert "host key" in res.stderr.lower()
    assert "Traceback" not in res.stderr
    # Under --json the error is a JSON document on stdout (the prose stays on stderr).
    assert json.loads(res.stdout)["kind"] == "HostKeyError"
    assert empty.read_text() == "", "an unknown key was recorded without being asked to"


def test_host_lock_names_the_holder(tmp_path: Path) -> None:
    """A second campaign against a host that one already drives exits 2 and names the run holding it."""
    runs = tmp_path / "runs"
    path = experiment(tmp_path, "locked", {"kind": "local"}, [], at_end="stop")
    first = subprocess.Popen(
        [sys.executable, "-m", "campaign.cli", "--runs-dir", str(runs), "run", str(path), "--json"],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        # The lock lives in the host's state folder, whatever the workdir (tests/conftest.py gives each test one).
        lock = Path(os.environ["CAMPAIGN_HOST_STATE"]) / "lock"
        owner = lock / "owner.json"
        deadline = time.monotonic() + 60
        while not owner.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert owner.exists(), "the first run never took the lock"
        holder = json.loads(owner.read_text())["run_id"]
        second = campaign("run", str(path), "--json", runs=runs)
        assert second.returncode == 2
        assert holder in second.stderr
        out, err = first.communicate(timeout=120)
        assert first.returncode == 0, err
        assert json.loads(out)["run_id"] == holder
    finally:
        if first.poll() is None:
            first.send_signal(signal.SIGINT)
            first.wait(30)
    # The lock is released at the end: a new run can start.
    assert not lock.exists()


def test_dry_run_touches_nothing(tmp_path: Path) -> None:
    """--dry-run shows every variant's exact launch and the failure policy, and creates nothing."""
    path = experiment(tmp_path, "dry", {"kind": "local"}, [{"name": "graphs", "knobs": {"cuda_graph": True}}])
    runs = tmp_path / "runs"
    res = campaign("run", str(path), "--dry-run", "--json", runs=runs)
    assert res.returncode == 0, res.stderr
    plan = json.loads(res.stdout)
    assert [v["name"] for v in plan["variants"]] == ["baseline", "graphs"]
    assert "--disable-cuda-graph" in plan["variants"][0]["command"]
    assert "--disable-cuda-graph" not in plan["variants"][1]["command"]
    assert "known-good" in plan["on_failure"]
    text = campaign("run", str(path), "--dry-run", runs=runs)
    assert "campaign.refserver" in text.stdout and "On failure" in text.stdout
    # The box is not touched and no run is recorded; the store keeps only the server's --help (read-only to get).
    assert not (tmp_path / "box").exists()
    assert sorted(p.name for p in runs.iterdir()) == ["help-cache"]


@pytest.mark.parametrize(
    ("body", "where", "field"),
    [
        ("name: x\nrecipe: refserver\nbaseline:\n  knobs:\n    atention: torch\n", ":5", "atention"),
        ("name: x\nrecipe: refserver\ntimeouts:\n  ready_s: soon\n", ":4", "timeouts.ready_s"),
        ("name: x\nrecipe: refserver\nvariants:\n  - name: a\n    colour: red\n", ":5", "colour"),
        ("name: x\nrecipe: nosuch\n", "", "recipe"),
        ("name: x\nrecipe: refserver\nbaseline: [\n", ":4", ""),
    ],
)
def test_bad_config_names_file_line_field(tmp_path: Path, body: str, where: str, field: str) -> None:
    """A bad experiment file exits 2 with file, line and field, never a traceback, and runs nothing."""
    path = tmp_path / "bad.yaml"
    path.write_text(body)
    res = campaign("run", str(path), runs=tmp_path / "runs")
    assert res.returncode == 2
    assert "Traceback" not in res.stderr
    assert f"{path}{where}" in res.stderr or field == "recipe"
    assert field in res.stderr
    assert not (tmp_path / "runs").exists()


def test_set_override_and_unknown_variant(tmp_path: Path) -> None:
    """--set changes the plan; an unknown --variant is a usage error naming the variants."""
    path = experiment(tmp_path, "sets", {"kind": "local"}, [{"name": "b8", "knobs": {"max_batch": 8}}])
    runs = tmp_path / "runs"
    res = campaign("run", str(path), "--dry-run", "--json", "--set", "baseline.knobs.max_batch=4", runs=runs)
    plan = json.loads(res.stdout)
    cmd = plan["variants"][0]["command"]
    assert cmd[cmd.index("--max-running-requests") + 1] == "4"
    bad = campaign("run", str(path), "--variant", "nope", runs=runs)
    assert bad.returncode == 2 and "b8" in bad.stderr


def test_bench_gates_decide_known_good(tmp_path: Path) -> None:
    """A variant that answers right but serves slower than the gate allows fails at `gates`, and the box is restored.

    --max-running-requests 1 serialises decoding on the reference server, so at concurrency 8 its output tokens/s
    falls far below the baseline's (which batches all 8): a real regression the gate must catch.
    """
    path = experiment(
        tmp_path,
        "gated",
        {"kind": "local"},
        [{"name": "serial", "knobs": {"max_batch": 1}}],
        bench={
            "concurrency": [8],
            "requests": 32,
            "warmup": 2,
            "gates": [{"metric": "output_throughput", "concurrency": 8, "min_ratio": 0.8}],
        },
        at_end="stop",
    )
    runs = tmp_path / "runs"
    res = campaign("run", str(path), "--json", runs=runs)
    assert res.returncode == 1, res.stderr
    doc = json.loads(res.stdout)
    # The document is a RunSummary, key for key.
    assert json.loads(RunSummary.model_validate(doc).model_dump_json()) == doc
    att = by_variant(doc)
    base, serial = att["baseline"], att["serial"]
    assert base["outcome"] == "passed" and base["bench"]["passed"]
    assert serial["smoke"]["passed"] == serial["smoke"]["total"]
    assert serial["failed_phase"] == "gates"
    assert [g["passed"] for g in serial["gates"]] == [False]
    tput = {a["variant"]: a["bench"]["levels"][0]["output_throughput"] for a in (base, serial)}
    assert tput["serial"] < 0.8 * tput["baseline"]
    assert serial["restore"]["outcome"] == "restored"
    status = json.loads(campaign("status", str(path), "--json", runs=runs).stdout)
    assert status["known_good"]["variant"] == "baseline"


@pytest.mark.parametrize("name", sorted(p.stem for p in (REPO / "configs").glob("*.yaml")))
def test_every_shipped_experiment_plans(name: str, tmp_path: Path) -> None:
    """Each experiment in configs/ validates and renders (its dry run needs no host)."""
    res = campaign("run", name, "--dry-run", "--json", runs=tmp_path / "runs")
    assert res.returncode == 0, res.stderr
    plan = json.loads(res.stdout)
    assert plan["variants"] and all(v["command"] for v in plan["variants"])
