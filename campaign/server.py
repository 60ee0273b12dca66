"""A server's life on a host: render the launch script, upload it, start it detached, stop the tree it started.

Lifecycle of one attempt, as ``ServerControl`` drives it::

    prepare(run, attempt)    mkdir <workdir>/runs/<run>/<n>-<variant>/         (one remote call)
    launch(spec, dir)        upload launch.sh (0700, via write_file: never a heredoc inside a command),
                             then `setsid sh launch.sh </dev/null >server.log 2>&1 &` and read back the PID the
                             script wrote; with setsid the script leads its own session, so PID == PGID. The script
                             exports a fresh ``CAMPAIGN_TREE`` token that every descendant inherits
    ... readiness, smoke, bench (other modules) ...
    stop(running)            TERM the tree (``processes.tree``: the token's holders, their group, session and
                             descendants, so a child that left the group is stopped too), KILL after the grace
                             period, then verify: no process of the tree alive, its port not held by one of them,
                             and (where nvidia-smi exists) no GPU memory held by them. A box that stays dirty raises
                             DirtyHost. A process campaign did not start is never signalled: a port held by one after
                             the stop is reported in ``StopReport.foreign``, not blamed on the variant.

On a Slurm host (``hosts/slurm.py``) the same steps go through the scheduler instead: launch submits launch.sh with
``sbatch`` (its output file is server.log), records the job at once, then waits for its node; alive means the job is
active in ``squeue``; stop is ``scancel`` (matching the job's id and name), then the job must leave the queue and its
port on the node stop answering. The host gives that launcher: a host whose ``scheduler`` is set runs its servers
through ``campaign/jobs.py`` (``ServerControl.jobs``); readiness, smoke and bench do not change.

``current.json`` in the host's state folder (``lock.host_state_dir``, the same for every workdir) records what runs
now, so ``campaign status`` and the next run (from any laptop, for any experiment) know which tree to stop. Our
commands never wait on the server's streams: they go to a file.
"""

from __future__ import annotations

import secrets
import shlex
import time
from dataclasses import replace

from campaign.config import shell_word
from campaign.errors import DirtyHost, HostError
from campaign.hosts.base import Host
from campaign.jobs import JobLauncher
from campaign.lock import ensure_state_dir, host_state_dir
from campaign.ownership import ensure_own_dirs
from campaign.processes import TREE_VAR, PortHolders, Proc, port_holders, tree
from campaign.records import LaunchSpec, StopReport
from campaign.running import Running, describe_stopped, environment, parse, recover

__all__ = ["Running", "ServerControl"]

q = shlex.quote


class ServerControl:
    """Start and stop servers on one host, under one working directory there."""

    def __init__(self, host: Host, workdir: str, *, state_dir: str | None = None) -> None:
        self.host = host
        #: On a host with a scheduler (Slurm), servers are its jobs: launch, liveness and stop go through the launcher
        #: the host's scheduler gives (campaign/jobs.py); elsewhere they are process groups (setsid).
        self.jobs = JobLauncher(host, host.scheduler, self.forget) if host.scheduler is not None else None
        self._workdir_raw = workdir
        self._workdir: str | None = None
        self.state_dir = state_dir or host_state_dir()
        self._state_ready = False
        self._uid: int | None = None

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
            # Owned by the caller, 0700, no symbolic link, under folders no other user can swap (ownership.py).
            ensure_own_dirs(self.host, raw)
            self._workdir = raw.rstrip("/") or "/"
        return self._workdir

    @property
    def user_state(self) -> str:
        """The caller's own part of the host's state folder (``<state>/user-<uid>``, 0700): current.json lives here."""
        if self._uid is None:
            out = self.host.run("id -u", timeout=15).stdout.strip()
            if not out.isdigit():
                raise HostError(f"{self.host.name}: cannot tell the user id (`id -u` printed {out[:40]!r})")
            self._uid = int(out)
        return f"{self.state_dir}/user-{self._uid}"

    @property
    def current_path(self) -> str:
        """Where the record of the running server lives on the host (one per host and user, not per workdir); its
        folder is checked (and created) on first use."""
        self._state()
        return f"{self.user_state}/current.json"

    def _state(self) -> None:
        if not self._state_ready:
            ensure_state_dir(self.host, self.state_dir)
            ensure_own_dirs(self.host, self.user_state)
            self._state_ready = True

    def prepare(self, run_id: str, attempt: int, variant: str) -> str:
        """Create and return the per-attempt folder on the host (each level the caller's own, never a link)."""
        ensure_own_dirs(self.host, self.workdir, f"runs/{run_id}/{attempt:02d}-{variant}")
        return f"{self.workdir}/runs/{run_id}/{attempt:02d}-{variant}"

    # -- launch ------------------------------------------------------------------------------------

    @staticmethod
    def launch_script(
        spec: LaunchSpec, remote_dir: str, header: str, token: str = "", marks: dict[str, str] | None = None
    ) -> str:
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
        if token:
            # Every descendant inherits it, even one that leaves the group: that is how stop finds the whole tree.
            lines.append(f"export {TREE_VAR}={q(token)}")
        for name, value in (marks or {}).items():
            lines.append(f"export {name}={q(value)}")  # the record, for when current.json is lost (running.py)
        if spec.workdir:
            lines.append(f"cd {shell_word(spec.workdir)} || exit 97")
        for name, value in spec.env.items():
            lines.append(f"export {name}={shell_word(value)}")
        lines.append(" ".join(shell_word(a) for a in spec.command))
        lines.append(f"echo $? > {q(remote_dir + '/exit_code')}")
        return "\n".join(lines) + "\n"

    def launch(
        self,
        spec: LaunchSpec,
        remote_dir: str,
        *,
        run_id: str,
        attempt: int,
        variant: str,
        header: str = "",
        experiment: str = "",
    ) -> Running:
        """Upload the launch script and start it detached; returns once its PID is known (never waits on it)."""
        self._state()
        script = f"{remote_dir}/launch.sh"
        log = f"{remote_dir}/server.log"
        token = f"{run_id}:{attempt}:{secrets.token_hex(8)}"
        running = Running(
            pid=0,
            pgid=0,
            port=spec.port,
            remote_dir=remote_dir,
            log_path=log,
            started_at=time.time(),
            spec_hash=spec.spec_hash(),
            variant=variant,
            run_id=run_id,
            attempt=attempt,
            token=token,
            experiment=experiment,
            workdir=self.workdir,
        )
        marks = environment(running, self.user_state)
        self.host.write_file(script, self.launch_script(spec, remote_dir, header, token, marks).encode(), mode=0o700)
        if self.jobs is not None:
            running = self.jobs.submit(running, script, self._record)
        else:
            pid = self._start_group(script, remote_dir, log)
            running = replace(running, pid=pid, pgid=pid)
        self._record(running)
        return running

    def _record(self, running: Running) -> None:
        """Write what runs now to current.json."""
        self.host.write_file(self.current_path, running.to_json().encode(), mode=0o600)

    def _start_group(self, script: str, remote_dir: str, log: str) -> int:
        """Start the script under ``setsid`` (its own group and session) and return its PID, which is the PGID."""
        pidfile = f"{remote_dir}/pid"
        cmd = (
            f"cd {q(remote_dir)} && setsid /bin/sh {q(script)} </dev/null >{q(log)} 2>&1 & "
            f"i=0; while [ ! -s {q(pidfile)} ] && [ $i -lt 250 ]; do sleep 0.02; i=$((i+1)); done; "
            f"cat {q(pidfile)} 2>/dev/null"
        )
        res = self.host.run(cmd, timeout=30)
        pid_text = res.stdout.strip()
        if not pid_text.isdigit():
            raise HostError(
                f"{self.host.name}: the launch script did not start (no PID after 5 s): {res.tail(5) or 'no output'}",
                hint="is `setsid` installed on the host (util-linux)?",
            )
        return int(pid_text)

    # -- state ------------------------------------------------------------------------------------

    def current(self) -> Running | None:
        """The server campaign last started on this host for this user (it may have died since), or None.

        Read from current.json; without a readable one, from the process table (our processes carry their record).
        """
        self._state()
        raw = self.host.read_file(self.current_path)
        running = parse(raw) if raw else None
        if running is None:
            # Gone (a /tmp cleaner) or damaged: our own server still carries its record (running.py).
            why = "current.json is unreadable" if raw else "current.json is missing"
            running = recover(self.host, self.user_state, f"{why}; found by its token in the process table")
            if running is None:
                return None
        if self.jobs is not None and running.node_addr:
            self.jobs.scheduler.use_node(running.node_addr)
        return running

    def forget(self) -> None:
        """Remove the record of what runs (after a stop that left nothing of it alive)."""
        self.host.run(f"rm -f {q(self.current_path)}", timeout=10)

    def tree(self, running: Running) -> list[Proc]:
        """The live processes of ``running``'s launch: its token's holders, their group, session and descendants.

        A Slurm job's processes live on its node: while the job is active they are listed where the login node
        sees them (a node that is this machine), else the job stands for them (the script's PID and the job's state).
        """
        if running.job_id and self.jobs is not None:
            job = self.jobs.our_job(running)
            if job is None or not job.active:
                return []
            seen = tree(self.host, running.token, running.pgid)
            return seen or [Proc(pid=running.pid, command=f"Slurm job {job.job_id} ({job.name}, {job.state})")]
        return tree(self.host, running.token, running.pgid)

    def found_running(self) -> str:
        """What campaign's record says runs on the box, checked against the process table (for messages)."""
        cur = self.current()
        if cur is None:
            return "nothing campaign started"
        procs = self.tree(cur)
        if not procs:
            return f"nothing ({cur.variant}, recorded last, has exited)"
        return f"{cur.describe()}, {len(procs)} process{'es' if len(procs) != 1 else ''}"

    def port_holders(self, port: int) -> PortHolders:
        """Who listens on ``port`` on the host, with PIDs and command lines."""
        return port_holders(self.host, port)

    def alive(self, target: int | Running) -> bool:
        """True while a live (not zombie) process of the group exists; for a Slurm launch, while its job is active.

        Zombies count as gone: where PID 1 does not reap orphans (some containers), ``kill -0`` would see a dead
        server as alive forever. Read from /proc (no ps needed); hosts without /proc fall back to ``kill -0``.
        A bare PGID on a Slurm host is looked up in the record of what runs (a stored attempt knows only its PGID).
        """
        if self.jobs is not None and not isinstance(target, Running):
            cur = self.current()
            if cur is not None and cur.job_id and cur.pgid == target:
                target = cur
        if isinstance(target, Running):
            if target.job_id:
                return self.jobs is not None and self.jobs.alive(target)
            target = target.pgid
        return self.host.run(_group_cmd(target), timeout=10).ok

    def process_state(self, running: Running) -> str:
        """The /proc state of the launch's processes, for a diagnosis: ``PID 12 T (stopped), PID 13 S (sleeping)``."""
        names = {"R": "running", "S": "sleeping", "D": "in uninterruptible wait", "T": "stopped", "t": "traced"}
        pids = " ".join(str(p.pid) for p in self.tree(running))
        if not pids:
            return "no process left"
        cmd = (
            f"for p in {pids}; do s=$(cat /proc/$p/stat 2>/dev/null) || continue; "
            's=${s##*) }; echo "$p ${s%% *}"; done'
        )
        lines = self.host.run(cmd, timeout=10).stdout.splitlines()
        found = [line.split() for line in lines if len(line.split()) == 2]
        return ", ".join(f"PID {pid} {st} ({names.get(st, '?')})" for pid, st in found) or "unknown"

    def exit_code(self, remote_dir: str) -> int | None:
        """The exit status the launch script recorded (128+N for signal N), or None if it recorded none."""
        raw = self.host.read_file(f"{remote_dir}/exit_code").decode(errors="replace").strip()
        return int(raw) if raw.lstrip("-").isdigit() else None

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
        """TERM the launch's tree, KILL it after ``grace_s``, then verify it is gone, its port and GPU memory free.

        Raises ``DirtyHost`` when a process of the tree survives, or still holds the port or GPU memory. A port held
        by a process campaign did not start is not ours to clean: it is named in ``StopReport.foreign`` and the stop
        is clean. Stopping nothing is a clean no-op.
        """
        t0 = time.monotonic()
        if running is None:
            running = self.current()
        if running is None:
            return StopReport(
                stopped=False, clean=True, killed=False, seconds=0.0, detail="nothing recorded as running"
            )
        if running.job_id and self.jobs is not None:
            return self.jobs.stop(running, grace_s=grace_s, poll_s=poll_s, t0=t0)
        members = self.tree(running)
        seen = {p.pid for p in members}
        killed = False
        if members:
            self._signal(running, members, "TERM")
            deadline = time.monotonic() + grace_s
            while members and time.monotonic() < deadline:
                time.sleep(poll_s)
                members = self.tree(running)
                seen |= {p.pid for p in members}
            if members:
                killed = True
                self._signal(running, members, "KILL")
                deadline = time.monotonic() + 5.0
                while members and time.monotonic() < deadline:
                    time.sleep(poll_s)
                    members = self.tree(running)
        problems = []
        if members:
            problems.append("survived SIGKILL: " + ", ".join(p.describe() for p in members))
        holders = self.port_holders(running.port)
        deadline = time.monotonic() + 5.0
        while holders.listening and any(p.pid in seen for p in holders.procs) and time.monotonic() < deadline:
            time.sleep(poll_s)
            holders = self.port_holders(running.port)
        foreign: str | None = None
        if holders.listening:
            if any(p.pid in seen for p in holders.procs):
                problems.append(holders.describe())
            else:
                foreign = holders.describe() + ", a process campaign did not start (left alone)"
        gpu = self.gpu_pids()
        if gpu is not None and seen:
            deadline = time.monotonic() + 10.0
            held = sorted(set(gpu) & seen)
            while held and time.monotonic() < deadline:
                time.sleep(0.5)
                held = sorted(set(self.gpu_pids() or []) & seen)
            if held:
                problems.append(f"GPU memory still held by PIDs {held}")
        seconds = time.monotonic() - t0
        if problems:
            raise DirtyHost(
                f"{self.host.name}: stopping {running.variant} left the box dirty: " + "; ".join(problems),
                hint="inspect the host (ps, nvidia-smi) before running again",
            )
        self.forget()
        what = describe_stopped(running)
        if not seen:
            detail = f"{what} had already exited"
        else:
            how = "SIGKILL after the grace period" if killed else "SIGTERM"
            detail = f"stopped {what} ({how}, {len(seen)} process{'es' if len(seen) != 1 else ''})"
        return StopReport(
            stopped=bool(seen),
            clean=True,
            killed=killed,
            seconds=seconds,
            detail=detail,
            pids=tuple(sorted(seen)),
            foreign=foreign,
        )

    def _signal(self, running: Running, members: list[Proc], sig: str) -> None:
        """Send ``sig`` to the launch's group and to every member of its tree (those that left the group too)."""
        pids = " ".join(str(p.pid) for p in members if p.pid > 1)
        if not pids:
            return
        # The group only when its leader proved itself ours (it is in the tree), and never group 0 or 1.
        ours = running.pgid > 1 and running.pgid in {p.pid for p in members}
        group = f"kill -{sig} -{int(running.pgid)} 2>/dev/null; " if ours else ""
        self.host.run(f"{group}kill -{sig} {pids} 2>/dev/null; true", timeout=10)


def _group_cmd(pgid: int) -> str:
    """A shell command over /proc/*/stat: exit 0 iff the group has a live (not zombie) member."""
    pg = int(pgid)
    # /proc/PID/stat is "pid (comm) state ppid pgrp ..."; comm may hold spaces, so cut through the last ") ".
    body = f'{{sub(/^.*\\) /, ""); if ($3 == {pg} && $1 != "Z") f = 1}} END {{exit !f}}'
    fallback = f"kill -0 -{pg} 2>/dev/null"
    return f"if [ -r /proc/self/stat ]; then cat /proc/[0-9]*/stat 2>/dev/null | awk '{body}'; else {fallback}; fi"
