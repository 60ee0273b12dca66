"""A campaign through a real single-node Slurm: every server is a batch job, its output file the log.

The cluster is the ``slurm`` fixture (tests/fixtures/slurm.py): munge, slurmctld and slurmd on this machine, on free
ports, with their state in a temp folder. The CLI runs as a user would run it (a subprocess, ``--json``), and the
test checks what a user would check: outcomes, the diagnosis read from the job's output file, the restore, the
queue and the port at the end.
"""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest

from campaign.errors import HostError
from campaign.hosts.local import LocalHost
from campaign.hosts.slurm import SlurmHost
from campaign.records import LaunchSpec
from campaign.server import ServerControl
from tests.fixtures.slurm import SlurmCluster
from tests.test_loop import by_variant, campaign, experiment


def answers(port: int) -> bool:
    """True when something accepts a connection on 127.0.0.1:port."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False


def ours(cluster: SlurmCluster) -> list[str]:
    """The queue's campaign jobs (``id|name|state``)."""
    return [line for line in cluster.jobs() if "|campaign-" in line]


def test_campaign_runs_through_slurm(slurm: SlurmCluster, tmp_path: Path) -> None:
    """Baseline, a passing and a dying variant as Slurm jobs: diagnosed from the job's output, restored, cancelled."""
    host = {"kind": "slurm", "partition": slurm.partition, "slurm_conf": str(slurm.conf), "sbatch_args": ["-c", "1"]}
    path = experiment(
        tmp_path,
        "slurmed",
        host,
        [
            {"name": "quiet", "env": {"CAMPAIGN_QUIET": "yes it's quoted; $(false)"}},
            {"name": "cuda-graphs", "knobs": {"cuda_graph": True}},
        ],
        timeouts={"ready_s": 60, "stop_grace_s": 5},
    )
    runs = tmp_path / "runs"
    res = campaign("run", str(path), "--json", runs=runs)
    assert res.returncode == 1, res.stderr
    doc = json.loads(res.stdout)
    att = by_variant(doc)
    assert att["baseline"]["outcome"] == "passed"
    assert att["quiet"]["outcome"] == "passed"

    dies = att["cuda-graphs"]
    assert dies["outcome"] == "failed"
    assert dies["failed_phase"] == "graph_capture"
    assert dies["diagnosis"]["kind"] in {"unsupported_hardware", "cuda_graph_capture_failed"}
    assert dies["restore"]["outcome"] == "restored"
    # The diagnosis came from the job's output file, which sbatch wrote where the attempt's log is.
    job_log = tmp_path / "box" / "runs" / doc["run_id"] / f"{dies['index']:02d}-cuda-graphs" / "server.log"
    assert "Capture cuda graph" in job_log.read_text()
    assert "Capture cuda graph" in campaign("logs", doc["run_id"], "--attempt", str(dies["index"]), runs=runs).stdout
    assert doc["restore"]["outcome"] == "restored"
    assert doc["final"]["variant"] == "quiet" and doc["final"]["healthy"] is True

    # What runs now is one job of ours, named after the run, running on the node; its health answers there.
    status = json.loads(campaign("status", str(path), "--json", runs=runs).stdout)
    running = status["running"]
    assert running["variant"] == "quiet" and running["alive"] and status["health"] == 200
    # The job's processes, visible here (the node is this machine), count as the running server, not as strays.
    assert running["processes"] >= 2
    assert not [p for p in status["untracked"] if f"--port {running['port']}" in p["command"]]
    assert running["node"] == slurm.node and running["node_addr"] == "127.0.0.1"
    assert ours(slurm) == [f"{running['job_id']}|{running['job_name']}|RUNNING"]
    assert running["job_name"] == f"campaign-{doc['run_id']}-{running['attempt']}"
    port = running["port"]
    assert answers(port)

    # `campaign stop` cancels the job: nothing of ours is left in the queue, nothing listens on the port.
    stopped = campaign("stop", str(path), "--json", runs=runs)
    assert stopped.returncode == 0, stopped.stderr
    stop = json.loads(stopped.stdout)
    assert stop["clean"] and f"Slurm job {running['job_id']}" in stop["detail"]
    assert ours(slurm) == []
    assert not answers(port)
    assert json.loads(campaign("status", str(path), "--json", runs=runs).stdout)["running"] is None


def test_stop_leaves_a_job_it_did_not_submit_alone(slurm: SlurmCluster, tmp_path: Path) -> None:
    """A recorded job id that now names someone else's job is never cancelled: the stop says so and forgets it."""
    script = tmp_path / "other.sh"
    script.write_text("#!/bin/sh\nsleep 60\n")
    sub = slurm.cmd("sbatch", "--parsable", "--job-name=not-campaign", f"--output={tmp_path}/o.log", str(script))
    assert sub.returncode == 0, sub.stderr
    other = sub.stdout.strip()
    try:
        host = SlurmHost(LocalHost(), partition=slurm.partition, slurm_conf=str(slurm.conf))
        control = ServerControl(host, str(tmp_path / "box"))
        control._state()
        # The record of a job campaign once ran, whose id the scheduler has since given to another job.
        record = {
            "pid": 1,
            "pgid": 1,
            "port": 1,
            "remote_dir": str(tmp_path),
            "log_path": str(tmp_path / "o.log"),
            "started_at": 0.0,
            "spec_hash": "x",
            "variant": "old",
            "run_id": "r",
            "attempt": 1,
            "job_id": other,
            "job_name": "campaign-r-1",
        }
        host.write_file(control.current_path, json.dumps(record).encode())
        assert not control.alive(1)
        rep = control.stop(None, grace_s=1)
        assert rep.clean and not rep.stopped
        assert rep.foreign is not None and "did not submit" in rep.foreign
        assert any(line.startswith(f"{other}|not-campaign|") for line in slurm.jobs())
        assert control.current() is None
    finally:
        slurm.cmd("scancel", other)


def test_sbatch_refusal_is_a_clear_host_error(slurm: SlurmCluster, tmp_path: Path) -> None:
    """A partition the cluster does not have: sbatch's own words, and where to fix it."""
    host = SlurmHost(LocalHost(), partition="no-such-partition", slurm_conf=str(slurm.conf))
    script = tmp_path / "s.sh"
    script.write_text("#!/bin/sh\ntrue\n")
    with pytest.raises(HostError) as err:
        host.submit(str(script), output=str(tmp_path / "o.log"), job_name="campaign-x-1", chdir=str(tmp_path))
    assert "sbatch refused the job" in str(err.value) and "partition" in str(err.value).lower()
    assert "sbatch_args" in (err.value.hint or "")


def test_a_job_that_never_starts_is_cancelled_and_forgotten(slurm: SlurmCluster, tmp_path: Path) -> None:
    """A job still pending past start_timeout_s is cancelled, the launch fails with why, and no record is left."""
    host = SlurmHost(
        LocalHost(),
        partition=slurm.partition,
        slurm_conf=str(slurm.conf),
        sbatch_args=("--begin=now+3600",),  # held by the scheduler for an hour: pending for the whole test
        start_timeout_s=2,
    )
    control = ServerControl(host, str(tmp_path / "box"))
    spec = LaunchSpec(recipe="x", command=["sleep", "60"], port=1, ready_marker="r", health_path="/h")
    remote_dir = control.prepare("r1", 1, "held")
    with pytest.raises(HostError) as err:
        control.launch(spec, remote_dir, run_id="r1", attempt=1, variant="held")
    assert "still pending after 2 s (cancelled)" in str(err.value)
    assert ours(slurm) == []
    assert control.current() is None


def test_url_needs_a_job_node(tmp_path: Path) -> None:
    """Before a job has landed on a node there is no address to reach: said plainly, not guessed as loopback."""
    host = SlurmHost(LocalHost(), partition="gpu")
    with pytest.raises(HostError, match="no job's node is known yet"):
        host.url(30000)
    host.use_node("10.1.2.3")
    assert host.url(30000) == "http://10.1.2.3:30000"
    assert host.name == "slurm:gpu"
