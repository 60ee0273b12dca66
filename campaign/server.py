"""A server's life on a host: render the launch script, upload it, start it detached, stop its process group.

Lifecycle of one attempt, as ``ServerControl`` drives it::

    prepare(run, attempt)    mkdir <workdir>/runs/<run>/<n>-<variant>/         (one remote call)
    launch(spec, dir)        upload launch.sh (0700, via write_file: never a heredoc inside a command),
                             then `setsid sh launch.sh </dev/null >server.log 2>&1 &` and read back the PID the
                             script wrote; with setsid the script leads its own session, so PID == PGID
    ... readiness, smoke, bench (other modules) ...
    stop(running)            TERM the group, poll, KILL after the grace period, then verify: group gone,
                             port no longer listening, and (where nvidia-smi exists) no GPU memory held by the
                             group's PIDs. A box that stays dirty raises DirtyHost.

``<workdir>/current.json`` records what runs now, so ``campaign status`` and the next run (from any laptop) know
which group to stop. Our commands never wait on the server's streams: they go to a file.
"""

from __future__ import annotations

import json
import shlex
import time
from dataclasses import asdict, dataclass

from campaign.config import shell_word
from campaign.errors import DirtyHost, HostError
from campaign.hosts.base import Host
from campaign.records import LaunchSpec

q = shlex.quote


@dataclass(frozen=True)
class Running:
    """A server campaign started and believes may still run: its group, port and files on the host."""

    pid: int
    pgid: int
    port: int
    remote_dir: str
    log_path: str
    started_at: float
    spec_hash: str
    variant: str
    run_id: str
    attempt: int

    def to_json(self) -> str:
        """The record written to current.json."""
        return json.dumps(asdict(self), indent=2)


@dataclass(frozen=True)
class StopReport:
    """What a stop did and found."""

    stopped: bool
    clean: bool
    killed: bool
    seconds: float
    detail: str


class ServerControl:
    """Start and stop servers on one host, under one working directory there."""

    def __init__(self, host: Host, workdir: str) -> None:
        self.host = host
        self._workdir_raw = workdir
        self._workdir: str | None = None

    # -- paths ------------------------------------------------------------------------------------

    @property
    def workdir(self) -> str:
        """The absolute working directory on the host (``~`` expanded there, created on first use)."""
        if self._workdir is None:
            raw = self._workdir_raw
            if raw == "~" or raw.startswith("~/"):
                home = self.host.run('printf %s "$HOME"', timeout=15).stdout.strip()
                if not home:
                    raise HostError(f"{self.host.name}: cannot resolve $HOME for workdir {raw!r}")
                raw = home + raw[1:]
            res = self.host.run(f"mkdir -p {q(raw)} && chmod 700 {q(raw)}", timeout=15)
            if not res.ok:
                raise HostError(f"{self.host.name}: cannot create workdir {raw}: {res.tail(3)}")
            self._workdir = raw.rstrip("/") or "/"
        return self._workdir

    @property
    def current_path(self) -> str:
        """Where the record of the running server lives on the host."""
        return f"{self.workdir}/current.json"

    def prepare(self, run_id: str, attempt: int, variant: str) -> str:
        """Create and return the per-attempt folder on the host."""
        path = f"{self.workdir}/runs/{run_id}/{attempt:02d}-{variant}"
        res = self.host.run(f"mkdir -p {q(path)} && chmod 700 {q(path)}", timeout=15)
        if not res.ok:
            raise HostError(f"{self.host.name}: cannot create {path}: {res.tail(3)}")
        return path

    # -- launch ------------------------------------------------------------------------------------

    @staticmethod
    def launch_script(spec: LaunchSpec, remote_dir: str, header: str) -> str:
        """The shell script that runs ``spec``; every value quoted, so hostile config values stay literal.

        A leading ``~/`` in a value is the host's home (``shell_word``), as a user typing the command would expect.
        """
        lines = [
            "#!/bin/sh",
            f"# {header}",
            "# Records its PID (its own process group: it is started under setsid), runs the server in the",
            "# foreground, then records the server's exit status so a death is explained after the group is gone.",
            f"echo $$ > {q(remote_dir + '/pid')}",
        ]
        if spec.workdir:
            lines.append(f"cd {shell_word(spec.workdir)} || exit 97")
        for name, value in spec.env.items():
            lines.append(f"export {name}={shell_word(value)}")
        lines.append(" ".join(shell_word(a) for a in spec.command))
        lines.append(f"echo $? > {q(remote_dir + '/exit_code')}")
        return "\n".join(lines) + "\n"

    def launch(
        self, spec: LaunchSpec, remote_dir: str, *, run_id: str, attempt: int, variant: str, header: str = ""
    ) -> Running:
        """Upload the launch script and start it detached; returns once its PID is known (never waits on it)."""
        script = f"{remote_dir}/launch.sh"
        log = f"{remote_dir}/server.log"
        self.host.write_file(script, self.launch_script(spec, remote_dir, header).encode(), mode=0o700)
        pidfile = f"{remote_dir}/pid"
        cmd = (
            f"cd {q(remote_dir)} && setsid /bin/sh {q(script)} </dev/null >{q(log)} 2>&1 & "
            f"i=0; while [ ! -s {q(pidfile)} ] && [ $i -lt 250 ]; do sleep 0.02; i=$((i+1)); done; "
            f"cat {q(pidfile)} 2>/dev/null"
        )
        started = time.time()
        res = self.host.run(cmd, timeout=30)
        pid_text = res.stdout.strip()
        if not pid_text.isdigit():
            raise HostError(
                f"{self.host.name}: the launch script did not start (no PID after 5 s): {res.tail(5) or 'no output'}",
                hint="is `setsid` installed on the host (util-linux)?",
            )
        pid = int(pid_text)
        running = Running(
            pid=pid,
            pgid=pid,
            port=spec.port,
            remote_dir=remote_dir,
            log_path=log,
            started_at=started,
            spec_hash=spec.spec_hash(),
            variant=variant,
            run_id=run_id,
            attempt=attempt,
        )
        self.host.write_file(self.current_path, running.to_json().encode(), mode=0o600)
        return running

    # -- state ------------------------------------------------------------------------------------

    def current(self) -> Running | None:
        """The server campaign last started on this host, if its record is there (it may have died since)."""
        raw = self.host.read_file(self.current_path)
        if not raw:
            return None
        try:
            return Running(**json.loads(raw))
        except (ValueError, TypeError):
            return None

    def alive(self, pgid: int) -> bool:
        """True while a live (not zombie) process of the group exists.

        Zombies count as gone: where PID 1 does not reap orphans (some containers), ``kill -0`` would see a dead
        server as alive forever. Read from /proc (no ps needed); hosts without /proc fall back to ``kill -0``.
        """
        return self.host.run(_group_cmd(pgid, "alive"), timeout=10).ok

    def exit_code(self, remote_dir: str) -> int | None:
        """The exit status the launch script recorded (128+N for signal N), or None if it recorded none."""
        raw = self.host.read_file(f"{remote_dir}/exit_code").decode(errors="replace").strip()
        return int(raw) if raw.lstrip("-").isdigit() else None

    def port_listening(self, port: int) -> bool:
        """True when something on the host listens on ``port`` (read from /proc/net/tcp{,6}: no tools needed)."""
        cmd = (
            f"p=:$(printf '%04X' {int(port)}); "
            'awk -v p="$p" \'FNR>1 && $4=="0A" && substr($2, length($2)-4)==p {f=1} END {exit !f}\' '
            "/proc/net/tcp /proc/net/tcp6 2>/dev/null"
        )
        return self.host.run(cmd, timeout=10).ok

    def group_pids(self, pgid: int) -> list[int]:
        """PIDs of the live processes in the group (for the GPU-memory check after a stop)."""
        res = self.host.run(_group_cmd(pgid, "pids"), timeout=10)
        return [int(x) for x in res.stdout.split() if x.isdigit()]

    def gpu_pids(self) -> list[int] | None:
        """PIDs holding GPU memory per nvidia-smi, or None on hosts without it."""
        res = self.host.run(
            "command -v nvidia-smi >/dev/null 2>&1 || exit 3; "
            "nvidia-smi --query-compute-apps=pid --format=csv,noheader",
            timeout=20,
        )
        if res.exit_code == 3:
            return None
        return [int(x) for x in res.stdout.split() if x.strip().isdigit()]

    # -- stop ------------------------------------------------------------------------------------

    def stop(self, running: Running | None, *, grace_s: float = 10.0, poll_s: float = 0.1) -> StopReport:
        """TERM the group, KILL it after ``grace_s``, then verify it is gone, its port free and its GPU memory released.

        Raises ``DirtyHost`` when the box cannot be made clean. Stopping nothing is a clean no-op.
        """
        t0 = time.monotonic()
        if running is None:
            running = self.current()
        if running is None:
            return StopReport(
                stopped=False, clean=True, killed=False, seconds=0.0, detail="nothing recorded as running"
            )
        pgid = running.pgid
        members = self.group_pids(pgid)
        killed = False
        if self.alive(pgid):
            self.host.run(f"kill -TERM -{pgid} 2>/dev/null", timeout=10)
            deadline = time.monotonic() + grace_s
            while self.alive(pgid) and time.monotonic() < deadline:
                time.sleep(poll_s)
            if self.alive(pgid):
                killed = True
                self.host.run(f"kill -KILL -{pgid} 2>/dev/null", timeout=10)
                deadline = time.monotonic() + 5.0
                while self.alive(pgid) and time.monotonic() < deadline:
                    time.sleep(poll_s)
        problems = []
        if self.alive(pgid):
            problems.append(f"process group {pgid} survived SIGKILL")
        deadline = time.monotonic() + 5.0
        while self.port_listening(running.port) and time.monotonic() < deadline:
            time.sleep(poll_s)
        if self.port_listening(running.port):
            problems.append(f"port {running.port} is still listening")
        gpu = self.gpu_pids()
        if gpu is not None and members:
            deadline = time.monotonic() + 10.0
            held = sorted(set(gpu) & set(members))
            while held and time.monotonic() < deadline:
                time.sleep(0.5)
                held = sorted(set(self.gpu_pids() or []) & set(members))
            if held:
                problems.append(f"GPU memory still held by PIDs {held}")
        seconds = time.monotonic() - t0
        if problems:
            raise DirtyHost(
                f"{self.host.name}: stopping {running.variant} left the box dirty: " + "; ".join(problems),
                hint="inspect the host (ps, nvidia-smi) before running again",
            )
        self.host.run(f"rm -f {q(self.current_path)}", timeout=10)
        how = "SIGKILL after the grace period" if killed else "SIGTERM"
        return StopReport(
            stopped=True, clean=True, killed=killed, seconds=seconds, detail=f"stopped {running.variant} ({how})"
        )


def _group_cmd(pgid: int, what: str) -> str:
    """A shell command over /proc/*/stat: exit 0 iff the group has a live member, or print its PIDs."""
    pg = int(pgid)
    # /proc/PID/stat is "pid (comm) state ppid pgrp ..."; comm may hold spaces, so cut through the last ") ".
    if what == "alive":
        body = f'{{sub(/^.*\\) /, ""); if ($3 == {pg} && $1 != "Z") f = 1}} END {{exit !f}}'
        fallback = f"kill -0 -{pg} 2>/dev/null"
    else:
        body = f'{{pid = $1; sub(/^.*\\) /, ""); if ($3 == {pg} && $1 != "Z") print pid}}'
        fallback = "true"
    return f"if [ -r /proc/self/stat ]; then cat /proc/[0-9]*/stat 2>/dev/null | awk '{body}'; else {fallback}; fi"
