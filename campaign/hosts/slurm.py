"""SlurmHost: servers run as Slurm batch jobs, submitted from a login node through the cluster's own scheduler.

The login node is another host (``LocalHost`` here: this machine runs ``sbatch``, ``squeue``, ``scancel`` and
``scontrol``); every file call goes to it, and the working directory must be on a filesystem the compute nodes share
with it (the job writes its PID, its exit status and its output file there). ``url`` reaches the port on the node the
current job was given, by the address ``scontrol show node`` names (``NodeAddr``): ``ServerControl`` tells the host
which node that is once the job runs, or when it reads the record of what runs.

The job operations below return values and never wait on a job; ``ServerControl`` (``campaign/server.py``) decides
when to submit, poll and cancel. Every value reaches the shell quoted; ``SLURM_CONF``, when the config names one, is
passed on each command so a cluster other than the default one can be driven.
"""

from __future__ import annotations

import re
import shlex

from campaign.errors import HostError
from campaign.hosts.base import ACTIVE_STATES, Host, Job, Result

__all__ = ["ACTIVE_STATES", "Job", "SlurmHost"]

q = shlex.quote

_JOB_ID = re.compile(r"^(\d+)(?:;[\w.-]+)?$")


class SlurmHost:
    """A Slurm cluster reached through its login node: files and commands there, servers as batch jobs."""

    def __init__(
        self,
        login: Host,
        *,
        partition: str | None = None,
        sbatch_args: tuple[str, ...] = (),
        slurm_conf: str | None = None,
        start_timeout_s: float = 600.0,
    ) -> None:
        self.login = login
        self.partition = partition
        self.sbatch_args = tuple(sbatch_args)
        self.slurm_conf = slurm_conf
        #: How long a launch waits for its job to leave PENDING before it cancels the job and fails.
        self.start_timeout_s = start_timeout_s
        where = partition or "default"
        self.name = f"slurm:{where}" if login.name == "local" else f"slurm:{where}@{login.name}"
        #: The address of the node the current job runs on (set by ``use_node``); None before any job ran.
        self.node_addr: str | None = None
        self._closed = False

    # -- the Host protocol: the login node's --------------------------------------------------------

    def run(self, command: str, *, timeout: float = 30.0) -> Result:
        """Run ``command`` on the login node."""
        return self.login.run(command, timeout=timeout)

    def write_file(self, path: str, data: bytes, *, mode: int = 0o600) -> None:
        """Write ``path`` on the login node (the shared filesystem the job reads)."""
        self.login.write_file(path, data, mode=mode)

    def read_file(self, path: str, *, offset: int = 0, limit: int | None = None) -> bytes:
        """Read ``path`` on the login node (the job's output file is followed this way)."""
        return self.login.read_file(path, offset=offset, limit=limit)

    def url(self, port: int) -> str:
        """``http://NODEADDR:port`` for the node of the current job."""
        if self._closed:
            raise HostError(f"{self.name}: the host was closed", hint="open a new host")
        if self.node_addr is None:
            raise HostError(
                f"{self.name}: no job's node is known yet, so port {int(port)} cannot be reached",
                hint="a server must be launched (or recorded as running) first",
            )
        return f"http://{self.node_addr}:{int(port)}"

    def close(self) -> None:
        """Close the login node's host. Idempotent."""
        self._closed = True
        self.login.close()

    @property
    def scheduler(self) -> SlurmHost:
        """This host schedules its servers as jobs (``campaign/jobs.py`` launches them)."""
        return self

    def use_node(self, addr: str) -> None:
        """Reach servers on ``addr`` from now on (the node the current job runs on)."""
        self.node_addr = addr

    # -- job operations ----------------------------------------------------------------------------

    def _slurm(self, words: list[str]) -> str:
        """A Slurm client command line, every word quoted, with ``SLURM_CONF`` set when the config names one."""
        line = " ".join(q(w) for w in words)
        return f"SLURM_CONF={q(self.slurm_conf)} {line}" if self.slurm_conf else line

    def submit(self, script: str, *, output: str, job_name: str, chdir: str) -> str:
        """Submit ``script`` as a batch job writing ``output``; returns the job id (raises HostError on refusal)."""
        words = ["sbatch", "--parsable", f"--output={output}", f"--job-name={job_name}", f"--chdir={chdir}"]
        if self.partition:
            words.append(f"--partition={self.partition}")
        words += [*self.sbatch_args, script]
        res = self.run(self._slurm(words), timeout=60)
        found = _JOB_ID.match(res.stdout.strip())
        if not res.ok or found is None:
            raise HostError(
                f"{self.name}: sbatch refused the job: {res.tail(5) or 'no output'}",
                hint="check the partition and sbatch_args of the host config (sinfo lists partitions)",
            )
        return found.group(1)

    def job(self, job_id: str) -> Job | None:
        """The job as squeue shows it, or None once it has left the queue (finished, cancelled, unknown)."""
        res = self.run(self._slurm(["squeue", "-h", "-j", str(job_id), "-o", "%i|%j|%T|%N"]), timeout=30)
        if not res.ok:
            # squeue exits non-zero for a job id it no longer knows: the job is gone.
            if "Invalid job id" in res.stderr:
                return None
            raise HostError(f"{self.name}: squeue failed: {res.tail(3)}", hint="is slurmctld reachable (sinfo)?")
        for line in res.stdout.splitlines():
            parts = line.strip().split("|")
            if len(parts) == 4 and parts[0] == str(job_id):
                return Job(job_id=parts[0], name=parts[1], state=parts[2], nodes=parts[3])
        return None

    def node_address(self, node: str) -> str:
        """The address to reach ``node`` at (its ``NodeAddr``; the node name when Slurm names none)."""
        res = self.run(self._slurm(["scontrol", "-o", "show", "node", node]), timeout=30)
        found = re.search(r"\bNodeAddr=(\S+)", res.stdout)
        return found.group(1) if res.ok and found else node

    def cancel(self, job_id: str, *, job_name: str, signal: str | None = None) -> Result:
        """Cancel (or signal) the job, only while it still carries ``job_name`` (scancel matches both)."""
        words = ["scancel", f"--name={job_name}"]
        if signal:
            words.append(f"--signal={signal}")
        return self.run(self._slurm([*words, str(job_id)]), timeout=30)
