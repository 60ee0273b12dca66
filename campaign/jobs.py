"""Servers as batch jobs: the launcher a host with a scheduler (Slurm, ``hosts/slurm.py``) gives ``ServerControl``.

A job is launched by submitting launch.sh (its output file is server.log) and recorded at once; then the launch waits
until the job has a node (cancelled past the scheduler's ``start_timeout_s``) and reads the PID the script wrote
there. It is alive while the queue shows it active; it is stopped by cancelling it, matching its id and its name (an
id the scheduler gave to someone else's job after a reset is left alone), then it must leave the queue and its port
on the node stop answering. Readiness, smoke and bench do not change: they go through ``Host.url``.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable
from dataclasses import replace

from campaign.errors import DirtyHost, HostError
from campaign.hosts.base import Host, Job, Scheduler
from campaign.records import StopReport
from campaign.running import Running, describe_stopped


class JobLauncher:
    """Launch, liveness and stop of servers that run as the scheduler's jobs; ``forget`` drops the record."""

    def __init__(self, host: Host, scheduler: Scheduler, forget: Callable[[], None]) -> None:
        self.host = host
        self.scheduler = scheduler
        self._forget = forget

    def submit(self, running: Running, script: str, record: Callable[[Running], None]) -> Running:
        """Submit the launch script, record the job at once, wait for its node; returns the record with the PID."""
        job_name = f"campaign-{running.run_id}-{running.attempt}"
        job_id = self.scheduler.submit(script, output=running.log_path, job_name=job_name, chdir=running.remote_dir)
        running = replace(running, job_id=job_id, job_name=job_name)
        # Recorded before the wait: a CLI that dies while the job is pending leaves a job `campaign stop` finds.
        record(running)
        running = self.await_node(running)
        pid = self.read_pid(running)
        return replace(running, pid=pid, pgid=pid)

    def alive(self, running: Running) -> bool:
        """True while the job ``running`` records is still ours and active in the queue."""
        job = self.our_job(running)
        return job is not None and job.active

    def await_node(self, running: Running) -> Running:
        """Wait until the submitted job runs on a node (or has already ended); the record gains the node."""
        deadline = time.monotonic() + self.scheduler.start_timeout_s
        while True:
            job = self.our_job(running)
            if job is None or (job.state != "PENDING" and job.nodes):
                break
            if time.monotonic() >= deadline:
                self.scheduler.cancel(running.job_id, job_name=running.job_name)
                self._wait_job_gone(running, 30.0, 0.2)
                self._forget()
                raise HostError(
                    f"{self.host.name}: Slurm job {running.job_id} was still pending after "
                    f"{self.scheduler.start_timeout_s:g} s (cancelled)",
                    hint="the partition is busy or the job asks for more than a node has (squeue, sinfo)",
                )
            time.sleep(0.2)
        node = job.nodes if job is not None else ""
        addr = self.scheduler.node_address(node) if node else ""
        if addr:
            self.scheduler.use_node(addr)
        return replace(running, node=node, node_addr=addr)

    def read_pid(self, running: Running) -> int:
        """The PID the launch script wrote on the node (0 when the job ended before it wrote one)."""
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            text = self.host.read_file(f"{running.remote_dir}/pid").decode(errors="replace").strip()
            if text.isdigit():
                return int(text)
            found = self.our_job(running)
            if found is None or not found.active:
                return 0
            time.sleep(0.1)
        return 0

    def stop(self, running: Running, *, grace_s: float, poll_s: float, t0: float) -> StopReport:
        """scancel the job (Slurm TERMs it, KILLs it after its KillWait), then verify it left and its port is free.

        Only the job we submitted is cancelled: its id and its name must both match (scancel filters on the name
        too), so an id the scheduler gave to someone else's job after a reset is left alone and reported.
        """
        job = self.scheduler.job(running.job_id)
        foreign: str | None = None
        if job is not None and job.name != running.job_name:
            foreign = f"Slurm job {job.job_id} is now {job.name!r}, a job campaign did not submit (left alone)"
            job = None
        seen = job is not None
        killed = False
        if job is not None:
            self.scheduler.cancel(running.job_id, job_name=running.job_name)
            job = self._wait_job_gone(running, grace_s + 5.0, poll_s)
            if job is not None:
                killed = True
                self.scheduler.cancel(running.job_id, job_name=running.job_name, signal="KILL")
                job = self._wait_job_gone(running, 10.0, poll_s)
        problems = []
        if job is not None:
            problems.append(f"Slurm job {job.job_id} is still {job.state} after scancel and SIGKILL")
        addr = running.node_addr
        deadline = time.monotonic() + 5.0
        while addr and _answers(addr, running.port) and time.monotonic() < deadline:
            time.sleep(poll_s)
        if addr and _answers(addr, running.port):
            problems.append(f"port {running.port} on {running.node} ({addr}) still answers after the job ended")
        if problems:
            raise DirtyHost(
                f"{self.host.name}: stopping {running.variant} left the box dirty: " + "; ".join(problems),
                hint="inspect the job and the node (squeue, scontrol show job, ss on the node) before running again",
            )
        self._forget()
        if seen:
            how = "SIGKILL after the grace period" if killed else "scancel"
            detail = f"stopped {describe_stopped(running)} (Slurm job {running.job_id}, {how})"
        else:
            detail = f"{describe_stopped(running)} had already exited (Slurm job {running.job_id} left the queue)"
        return StopReport(
            stopped=seen,
            clean=True,
            killed=killed,
            seconds=time.monotonic() - t0,
            detail=detail,
            pids=(running.pid,) if seen and running.pid else (),
            foreign=foreign,
        )

    def _wait_job_gone(self, running: Running, seconds: float, poll_s: float) -> Job | None:
        """Poll the queue until the job has left it (or ended); returns its entry if it is still there."""
        deadline = time.monotonic() + seconds
        while True:
            job = self.our_job(running)
            if job is None or (not job.active and job.state != "COMPLETING"):
                return None
            if time.monotonic() >= deadline:
                return job
            time.sleep(max(poll_s, 0.2))

    def our_job(self, running: Running) -> Job | None:
        """The queue's entry for the job ``running`` records, when it is still the job we submitted (same name)."""
        if not running.job_id:
            return None
        job = self.scheduler.job(running.job_id)
        return job if job is not None and job.name == running.job_name else None


def _answers(addr: str, port: int) -> bool:
    """True when a TCP connection to ``addr:port`` is accepted (a Slurm node's port, seen from here)."""
    try:
        with socket.create_connection((addr, int(port)), timeout=1.0):
            return True
    except OSError:
        return False
