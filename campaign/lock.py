"""One campaign per host at a time: a lock held on the host itself, so two laptops cannot drive one box.

The lock is a directory, ``<workdir>/lock``, made with ``mkdir`` (atomic on POSIX filesystems); ``owner.json``
inside names the run, the machine and the PID of the CLI holding it. A lock left by a CLI that died on the same
machine (its PID is gone) is taken over; any other holder is refused with a message naming its run.
"""

from __future__ import annotations

import json
import os
import shlex
import socket
import time
from dataclasses import dataclass

from campaign.errors import HostError, LockHeld
from campaign.hosts.base import Host

q = shlex.quote


@dataclass
class HostLock:
    """The lock on one host's workdir; use as a context manager or call acquire/release."""

    host: Host
    workdir: str
    run_id: str
    experiment: str
    held: bool = False

    @property
    def path(self) -> str:
        """The lock directory on the host."""
        return f"{self.workdir}/lock"

    def _owner(self) -> dict[str, object]:
        raw = self.host.read_file(f"{self.path}/owner.json")
        try:
            data = json.loads(raw) if raw else {}
        except ValueError:
            data = {}
        return data if isinstance(data, dict) else {}

    def acquire(self) -> None:
        """Take the lock or raise ``LockHeld`` naming the run that holds it."""
        for _ in range(2):
            res = self.host.run(f"mkdir {q(self.path)} 2>/dev/null", timeout=15)
            if res.ok:
                owner = {
                    "run_id": self.run_id,
                    "experiment": self.experiment,
                    "machine": socket.gethostname(),
                    "pid": os.getpid(),
                    "since": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                }
                self.host.write_file(f"{self.path}/owner.json", json.dumps(owner).encode(), mode=0o600)
                self.held = True
                return
            owner = self._owner()
            if self._stale(owner):
                self.host.run(f"rm -rf {q(self.path)}", timeout=15)
                continue
            holder = str(owner.get("run_id", "an unknown run"))
            raise LockHeld(
                f"{self.host.name} is locked by run {holder} "
                f"(experiment {owner.get('experiment', '?')}, from {owner.get('machine', '?')} "
                f"pid {owner.get('pid', '?')}, since {owner.get('since', '?')})",
                holder=holder,
                hint=f"wait for it to end; if that run is dead, remove {self.path} on the host",
            )
        raise HostError(f"{self.host.name}: could not take the lock at {self.path}")

    def _stale(self, owner: dict[str, object]) -> bool:
        """A lock whose CLI ran on this machine and whose PID is gone is stale; others are never guessed at."""
        pid = owner.get("pid")
        if owner.get("machine") != socket.gethostname() or not isinstance(pid, int):
            return False
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        except PermissionError:
            return False
        return False

    def release(self) -> None:
        """Give the lock back (only if this object took it)."""
        if self.held:
            self.host.run(f"rm -rf {q(self.path)}", timeout=15)
            self.held = False

    def __enter__(self) -> HostLock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()
