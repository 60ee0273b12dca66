"""Fleets: one experiment over two SSH hosts at once, one run and one report.

The two hosts are two real sshd on 127.0.0.1 (``sshd`` and ``second_sshd``), each with its own keys, known_hosts,
workdir, state folder (its lock and current.json) and port: two boxes as campaign sees them. The CLI runs as a user
runs it (a subprocess, its stderr not a terminal) with the reference server on CPU, and the tests check what a user
checks: the exit code, `campaign show`/`runs`/`compare`, each host's baseline, where each variant ran, the per-host
lines of the output, that the hosts worked at the same time, and what each box holds afterwards.
"""

from __future__ import annotations

import json
import os
import re
import signal
import sys
import time
from datetime import datetime
from io import StringIO
from pathlib import Path
from typing import Any

import pytest
import yaml
from rich.console import Console

from campaign.console.run import RunDisplay
from campaign.hosts.ssh.testing import SSHServer
from campaign.pipeline import Event
from campaign.records import Attempt, LaunchSpec
from tests.test_faults import Background, cleanup, cli, free_port, ours_running, show

VARIANTS = [
    {"name": "small", "knobs": {"max_batch": 8}},
    {"name": "medium", "knobs": {"max_batch": 16}},
    {"name": "large", "knobs": {"max_batch": 32}},
]


@pytest.fixture
def runs(tmp_path: Path) -> Any:
    """The run store of a test; anything its runs leave running is killed afterwards (by PID, ours only)."""
    path = tmp_path / "runs"
    try:
        yield path
    finally:
        cleanup(path)


def fleet_experiment(tmp: Path, servers: list[SSHServer], **extra: Any) -> tuple[Path, list[Path]]:
    """A three-variant experiment over ``servers``; returns its path and each host's state folder."""
    states = [tmp / f"state-{i}" for i in range(len(servers))]
    hosts = [
        {
            **server.host_config(),
            "workdir": str(tmp / f"box-{i}"),
            "state_dir": str(state),
            "knobs": {"port": free_port()},
        }
        for i, (server, state) in enumerate(zip(servers, states, strict=True))
    ]
    doc: dict[str, Any] = {
        "name": "fleet",
        "hosts": hosts,
        "recipe": "refserver",
        "vars": {"python": sys.executable},
        "baseline": {"knobs": {"device": "cpu", "attention": "torch", "cuda_graph": False}},
        "variants": VARIANTS,
        "smoke": {"questions": 2, "seed": 3, "burst": False},
        "timeouts": {"ready_s": 90, "stop_grace_s": 5},
        "at_end": "stop",
        **extra,
    }
    path = tmp / "fleet.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path, states


def host_name(server: SSHServer) -> str:
    """The name campaign gives the host (``Host.name``): what its attempts, lock and known-good are named by."""
    host = server.connect()
    try:
        return host.name
    finally:
        host.close()


def interval(att: dict[str, Any]) -> tuple[datetime, datetime]:
    """An attempt's start and end as the report recorded them."""
    return datetime.fromisoformat(att["started_at"]), datetime.fromisoformat(att["ended_at"])


def test_three_variants_run_once_each_over_two_hosts_at_the_same_time(
    sshd: SSHServer, second_sshd: SSHServer, tmp_path: Path, runs: Path
) -> None:
    """Every variant once, on the host the report says; each host's baseline proven first; one report."""
    path, states = fleet_experiment(tmp_path, [sshd, second_sshd])
    names = [host_name(sshd), host_name(second_sshd)]
    res = cli("run", str(path), runs=runs, timeout=900)
    assert res.returncode == 0, res.stdout + res.stderr

    # One run, one report, naming both hosts.
    listed = json.loads(cli("runs", "--json", runs=runs).stdout)
    assert len(listed) == 1
    report = show(runs, listed[0]["run_id"])
    assert report["status"] == "passed"
    assert report["host"] == ", ".join(names)
    assert [h["host"] for h in report["hosts"]] == names

    attempts = [a for a in report["attempts"] if a["role"] == "variant"]
    # Attempt indexes are unique over the run (logs and `campaign logs --attempt N` go by them).
    assert len({a["index"] for a in report["attempts"]}) == len(report["attempts"])
    # The baseline ran and passed on each host, and the report names the attempt that proved it there.
    for part in report["hosts"]:
        base = [a for a in attempts if a["variant"] == "baseline" and a["host"] == part["host"]]
        assert [a["outcome"] for a in base] == ["passed"], part
        assert part["baseline_attempt"] == base[0]["index"]
        assert part["status"] == "passed"
        assert part["final"]["healthy"] is True
    # Each variant ran exactly once, on one of the two hosts, and only after that host's baseline was proven.
    for v in VARIANTS:
        runs_of = [a for a in attempts if a["variant"] == v["name"]]
        assert len(runs_of) == 1, runs_of
        att = runs_of[0]
        assert att["outcome"] == "passed"
        assert att["host"] in names
        base = next(a for a in attempts if a["variant"] == "baseline" and a["host"] == att["host"])
        assert interval(base)[1] <= interval(att)[0]
        # Its log is where the report says, and came from that host's workdir.
        box = tmp_path / f"box-{names.index(att['host'])}"
        assert att["remote_dir"].startswith(str(box))
        assert (runs / report["run_id"] / att["log_file"]).is_file()
    # The two hosts worked at the same time: an attempt on one overlaps an attempt on the other.
    on = {n: [interval(a) for a in report["attempts"] if a["host"] == n] for n in names}
    assert any(s1 < e2 and s2 < e1 for s1, e1 in on[names[0]] for s2, e2 in on[names[1]])

    # The output (not a terminal) names the host on each line of its progress.
    for n in names:
        assert f"[{n}] #" in res.stderr, res.stderr
    assert "fleet run" in res.stderr

    # at_end: stop on each host: nothing of ours left, each lock given back.
    assert ours_running(runs) == []
    for state in states:
        assert not (state / "lock").exists()

    # `campaign status` and `campaign stop` answer for each host of the fleet.
    status = json.loads(cli("status", str(path), "--json", runs=runs).stdout)
    assert [s["host"] for s in status] == names
    assert all(s["known_good"]["variant"] in {"baseline", *(v["name"] for v in VARIANTS)} for s in status)
    stopped = cli("stop", str(path), runs=runs)
    assert stopped.returncode == 0 and all(n in stopped.stdout for n in names), stopped.stderr

    # `campaign show` and `campaign compare` read it.
    shown = cli("show", report["run_id"], runs=runs)
    assert shown.returncode == 0, shown.stderr
    assert "Hosts" in shown.stdout and all(n in shown.stdout for n in names)
    compared = cli("compare", report["run_id"], "--json", runs=runs)
    assert compared.returncode == 0, compared.stderr
    columns = json.loads(compared.stdout)["columns"]
    assert sorted(c["variant"] for c in columns) == sorted(["baseline", "baseline", *(v["name"] for v in VARIANTS)])


def in_flight(doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The launched attempt still under way on each host, by host (variants only, not the baselines)."""
    return {
        a["host"]: a
        for a in doc["attempts"]
        if a["variant"] != "baseline" and a["pid"] is not None and a["ended_at"] is None
    }


def test_sigterm_stops_every_host_and_restores_each(
    sshd: SSHServer, second_sshd: SSHServer, tmp_path: Path, runs: Path
) -> None:
    """A SIGTERM while each host has a variant under test: each is stopped and its host's baseline put back."""
    path, states = fleet_experiment(tmp_path, [sshd, second_sshd], at_end="known_good")
    names = [host_name(sshd), host_name(second_sshd)]
    run = Background(tmp_path, "run", str(path), runs=runs)
    try:
        deadline = time.monotonic() + 300
        busy: dict[str, dict[str, Any]] = {}
        while time.monotonic() < deadline and len(busy) < 2 and run.proc.poll() is None:
            time.sleep(0.1)
            for report_file in runs.glob("*/report.json"):
                try:
                    busy = in_flight(json.loads(report_file.read_text()))
                except ValueError:
                    continue  # read while being replaced
        assert len(busy) == 2, run.err
        run.signal(signal.SIGTERM)
        rc, _out, err = run.finish()  # one that never ends fails with its stacks
        assert rc == 143, err
    finally:
        run.kill()
    report = show(runs)
    assert report["status"] == "interrupted" and report["signal"] == "SIGTERM"
    attempts = {a["index"]: a for a in report["attempts"]}
    for name, state in zip(names, states, strict=True):
        part = next(h for h in report["hosts"] if h["host"] == name)
        assert part["status"] == "interrupted", part
        # The variant under test there was cut short and recorded so; the host's own baseline runs again, proven.
        cut = attempts[busy[name]["index"]]
        assert cut["outcome"] == "interrupted" and cut["host"] == name
        assert part["final"] == {**part["final"], "variant": "baseline", "healthy": True}, part
        restores = [a for a in report["attempts"] if a["role"] == "restore" and a["host"] == name]
        assert [a["outcome"] for a in restores] == ["passed"]
        # Each user's record lives in that user's own part of the state folder (campaign/running.py).
        current = json.loads((state / f"user-{os.getuid()}" / "current.json").read_text())
        assert current["variant"] == "baseline" and current["attempt"] == restores[0]["index"]
        assert not (state / "lock").exists()
    assert not [a for a in report["attempts"] if a["outcome"] == "skipped"]


@pytest.mark.parametrize(
    ("hosts", "line", "field", "words"),
    [
        ("  - {kind: ssh, host: a}\n  - {host: b}\n", 6, "hosts.1", "kind: local, ssh or slurm"),
        ("  - {kind: ssh, host: a}\n  - {kind: ssh, host: b, port: x}\n", 6, "hosts.1.port", "integer"),
        ("  - {kind: ssh, host: a}\n  - {kind: ssh, host: a}\n", 6, "hosts.1", "the same box as hosts.0"),
        ("  - {kind: ssh, host: a, knobs: {prot: 1}}\n", 5, "hosts.0.knobs.prot", "has no knob 'prot'"),
        ("  []\n", 4, "hosts", "at least one host"),
    ],
)
def test_a_bad_hosts_entry_names_file_line_and_field(
    tmp_path: Path, hosts: str, line: int, field: str, words: str
) -> None:
    """A wrong entry under `hosts:` is refused before anything is touched, saying where and what (exit 2)."""
    path = tmp_path / "bad.yaml"
    path.write_text(f"name: bad\nrecipe: refserver\nvariants: [{{name: v, knobs: {{max_batch: 8}}}}]\nhosts:\n{hosts}")
    res = cli("run", str(path), "--dry-run", runs=tmp_path / "runs")
    assert res.returncode == 2, res.stderr
    assert f"{path}:{line}: {field}: " in res.stderr and words in res.stderr, res.stderr
    assert "Traceback" not in res.stderr


def test_both_host_and_hosts_is_refused_at_the_hosts_line(tmp_path: Path) -> None:
    """`host:` and `hosts:` together: which one is meant cannot be guessed."""
    path = tmp_path / "both.yaml"
    path.write_text("name: both\nrecipe: refserver\nhost: {kind: local}\nhosts:\n  - {kind: ssh, host: a}\n")
    res = cli("run", str(path), "--dry-run", runs=tmp_path / "runs")
    assert res.returncode == 2
    assert f"{path}:4: hosts: give either `host` (one host) or `hosts` (a fleet)" in res.stderr, res.stderr


def test_the_dry_run_plans_the_fleet_and_resume_is_refused(
    sshd: SSHServer, second_sshd: SSHServer, tmp_path: Path, runs: Path
) -> None:
    """The plan names both hosts and counts each baseline; --resume of a fleet says it cannot, touching nothing."""
    path, states = fleet_experiment(tmp_path, [sshd, second_sshd])
    res = cli("run", str(path), "--dry-run", "--json", runs=runs)
    assert res.returncode == 0, res.stderr
    plan = json.loads(res.stdout)
    assert plan["host"] == f"fleet of 2: ssh 127.0.0.1:{sshd.port}, ssh 127.0.0.1:{second_sshd.port}"
    assert [v["name"] for v in plan["variants"]] == ["baseline", *(v["name"] for v in VARIANTS)]
    assert plan["estimate"]["hosts"] == 2 and plan["estimate"]["trials"] == 5
    text = cli("run", str(path), "--dry-run", runs=runs)
    assert "host 1: ssh 127.0.0.1" in text.stdout, text.stdout

    res = cli("run", str(path), "--resume", runs=runs)
    assert res.returncode == 2
    assert "--resume does not continue a fleet run yet" in res.stderr, res.stderr
    assert not runs.exists() or not list(runs.glob("*/report.json"))
    assert not any(state.exists() for state in states)


def test_a_host_locked_by_another_campaign_takes_no_part(
    sshd: SSHServer, second_sshd: SSHServer, tmp_path: Path, runs: Path
) -> None:
    """Each host has its own lock: one held elsewhere leaves that host alone, and the other runs every variant."""
    path, states = fleet_experiment(tmp_path, [sshd, second_sshd])
    names = [host_name(sshd), host_name(second_sshd)]
    held = states[1] / "lock"
    held.mkdir(parents=True)
    owner = {"user": "someone", "machine": "another-laptop", "pid": 4242, "run_id": "their-run", "command": "run"}
    (held / "owner.json").write_text(json.dumps(owner))
    res = cli("run", str(path), runs=runs, timeout=900)
    assert res.returncode == 0, res.stdout + res.stderr
    report = show(runs)
    parts = {h["host"]: h for h in report["hosts"]}
    assert "took no part" in parts[names[1]]["note"] and "their-run" in parts[names[1]]["note"]
    assert {a["host"] for a in report["attempts"]} == {names[0]}
    assert sorted(a["variant"] for a in report["attempts"] if a["role"] == "variant") == sorted(
        ["baseline", *(v["name"] for v in VARIANTS)]
    )
    # Their lock is untouched; ours is given back.
    assert json.loads((held / "owner.json").read_text()) == owner
    assert not (states[0] / "lock").exists()


_SPEC = LaunchSpec(recipe="refserver", command=["serve"], port=1, ready_marker="ready", health_path="/health")


def test_the_live_view_shows_each_hosts_progress() -> None:
    """On a terminal, a line per host (done, passed, what runs there now) above the attempts, which name their host."""
    screen = StringIO()
    display = RunDisplay(Console(file=screen, force_terminal=True, width=160), live=True)
    with display.session() as sink:
        sink(Event("attempt_start", 0, "baseline", "variant", host="box-a"))
        sink(Event("attempt_start", 1, "baseline", "variant", host="box-b"))
        done = Attempt(index=0, variant="baseline", host="box-a", spec=_SPEC, outcome="passed")
        sink(Event("attempt_end", 0, "baseline", "variant", text="passed", record=done, host="box-a"))
        sink(Event("attempt_start", 2, "small", "variant", host="box-a"))
        sink(Event("phase", 2, "small", "variant", text="load", phase="load", host="box-a"))
    text = _plain(screen.getvalue())
    assert "box-a  1 done, 1 passed  now #2 small: load" in text, text
    assert "box-b  0 done, 0 passed  now #1 baseline: stopping" in text, text
    # The attempts table gains a host column.
    assert "#  host  variant  role" in text, text


def _plain(ansi: str) -> str:
    """What a terminal shows of ``ansi``, roughly: escape sequences out, runs of spaces kept as two."""
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", ansi)
    return re.sub(r" {2,}", "  ", text)
