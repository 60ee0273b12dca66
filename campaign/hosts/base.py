"""The Host protocol: the one seam between campaign's core and the machine servers run on.

A host runs shell command strings (callers build them with ``shlex.quote``; no value from a config reaches a
shell unquoted), moves whole files in and out, reads a file from a byte offset (so a log is followed without
re-reading it), and gives an HTTP base URL that reaches a port on the host (loopback for ``local``; a
forwarded local port for ``ssh``). Every call has a timeout.

Implementations: ``LocalHost`` (subprocess) and ``SSHHost`` (paramiko; its package is the only one that imports it).
Tests run both against real things (this machine, a real sshd on loopback), so there is no fake host.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from campaign.redaction import mask_command


@dataclass(frozen=True)
class Result:
    """What one command did: its exit code and both streams, decoded as UTF-8 with replacement."""

    command: str
    exit_code: int
    stdout: str
    stderr: str

    @property
    def ok(self) -> bool:
        """True when the command exited 0."""
        return self.exit_code == 0

    def tail(self, lines: int = 10) -> str:
        """The last ``lines`` lines of stderr, or of stdout when stderr is empty."""
        text = self.stderr if self.stderr.strip() else self.stdout
        return "\n".join(text.rstrip().splitlines()[-lines:])


#: Job states in which the job's processes may run or are about to (squeue's long names).
ACTIVE_STATES = frozenset({"PENDING", "CONFIGURING", "RUNNING", "SUSPENDED", "RESIZING", "REQUEUED"})


@dataclass(frozen=True)
class Job:
    """One job as the scheduler shows it: id, name, state (long name) and node list (empty while pending)."""

    job_id: str
    name: str
    state: str
    nodes: str

    @property
    def active(self) -> bool:
        """True while the job's processes may run (pending, starting, running, suspended)."""
        return self.state in ACTIVE_STATES


class Scheduler(Protocol):
    """A batch scheduler a host runs servers through (Slurm): a server is a job, not a process group.

    Its calls return values and never wait on a job; ``campaign/jobs.py`` decides when to submit, poll and cancel.
    """

    #: How long a submitted job may stay pending before the launch cancels it.
    start_timeout_s: float

    def submit(self, script: str, *, output: str, job_name: str, chdir: str) -> str:
        """Submit ``script`` as a job; its id."""
        ...

    def job(self, job_id: str) -> Job | None:
        """The queue's entry for ``job_id``, or None once it left the queue."""
        ...

    def cancel(self, job_id: str, *, job_name: str, signal: str | None = None) -> Result:
        """Cancel the job with this id and name (signal it, with ``signal``)."""
        ...

    def node_address(self, node: str) -> str:
        """The address that reaches ``node`` from here ("" when unknown)."""
        ...

    def use_node(self, addr: str) -> None:
        """Make ``url`` reach ports on the node at ``addr``."""
        ...


@runtime_checkable
class Host(Protocol):
    """A machine that campaign drives. Paths are absolute POSIX paths on that machine."""

    #: Short human name: ``local`` or ``user@host:port``; used in reports and the lock.
    name: str

    @property
    def scheduler(self) -> Scheduler | None:
        """The host's batch scheduler when servers run as its jobs (Slurm); None: they run as process groups."""
        ...

    def run(self, command: str, *, timeout: float = 30.0) -> Result:
        """Run a shell command string under ``/bin/sh -c`` and wait for it; stdin is /dev/null.

        Raises ``HostTimeout`` past ``timeout`` and ``HostError`` when the command could not be started.
        A non-zero exit is not an error: it is in ``Result.exit_code``.
        """
        ...

    def write_file(self, path: str, data: bytes, *, mode: int = 0o600) -> None:
        """Create or replace ``path`` with ``data`` and ``mode`` (parents must exist)."""
        ...

    def read_file(self, path: str, *, offset: int = 0, limit: int | None = None) -> bytes:
        """Bytes of ``path`` from ``offset`` (at most ``limit``); ``b""`` when the file is missing or shorter."""
        ...

    def url(self, port: int) -> str:
        """An ``http://host:port`` base URL, usable from this process, that reaches ``port`` on the host."""
        ...

    def close(self) -> None:
        """Release connections and forwarded ports. Idempotent."""
        ...


def short_command(command: str, width: int = 80) -> str:
    """A command as a message may show it: first line, secret-looking values masked, cut to ``width``.

    Every host uses it. Callers never put secrets on a command line (the launch script carries the env), but a
    message must stay safe even when one does.
    """
    first = command.strip().splitlines()[0] if command.strip() else ""
    first = mask_command(first)
    return first if len(first) <= width else first[: width - 1] + "…"
