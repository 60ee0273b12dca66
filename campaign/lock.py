"""One pair of hands per box: a lock held on the host itself, whatever the experiment's workdir.

The host keeps campaign's state in one folder whose path does not depend on any experiment: ``/tmp/campaign`` by
default (``CAMPAIGN_HOST_STATE`` on the machine running the CLI names another path on the host; the tests give
each case its own). It holds::

    lock/              the lock: a directory made with ``mkdir`` (atomic on POSIX filesystems)
    lock/owner.json    who holds it: user, machine, PID of the CLI, command, run id, experiment, since when
    user-<uid>/        each user's own part (0700, owned by that user): no other user can write or replace it
      current.json     what campaign runs on the box now for that user (``running.Running``), whichever experiment

The folder is sticky and world-writable, and must be owned by the caller or by root: one another user made first
(who could replace anything in it) or a symbolic link is refused (``campaign.ownership``). A lock record is only
ever read to name its holder (another user could have written it); a process record only in the caller's own part.

``run``, ``restore`` and ``stop`` take the lock; one held by another live CLI is refused (``LockHeld``, exit 2,
naming the holder). A lock left by a CLI that died on this same machine (its PID is gone) is taken over, and the
caller is told whose it was so that run can be reconciled. ``force`` breaks any lock; the caller records that.

Breaking a lock is done by one CLI at a time, under a guard (``lock.breaking``, also made with ``mkdir``), and only
while the lock is still the one judged stale: two CLIs that found the same dead holder would otherwise each remove
the lock, the second removing the one the first had just taken, and both would go on holding the box.
"""

from __future__ import annotations

import contextlib
import getpass
import json
import os
import shlex
import socket
import time
from dataclasses import dataclass, field
from typing import Any

from campaign.errors import HostError, LockHeld
from campaign.hosts.base import Host
from campaign.ownership import ensure_shared_dir

q = shlex.quote

#: The environment variable (read where the CLI runs) naming the host's state folder.
HOST_STATE_ENV = "CAMPAIGN_HOST_STATE"
DEFAULT_HOST_STATE = "/tmp/campaign"
#: Looks at the lock before giving up: each lost race (a breaker at work, a holder that changed) costs one.
TRIES = 40


def host_state_dir() -> str:
    """The path of campaign's state folder on every host (the lock and current.json live there)."""
    raw = os.environ.get(HOST_STATE_ENV, "").strip()
    return (raw or DEFAULT_HOST_STATE).rstrip("/") or "/"


def ensure_state_dir(host: Host, path: str) -> None:
    """Create the state folder on the host (sticky and world-writable like /tmp, so every user's CLI meets there),
    or check an existing one: never a symbolic link, owned by the caller or root (``ownership.ensure_shared_dir``)."""
    ensure_shared_dir(host, path)


def describe_owner(owner: dict[str, Any]) -> str:
    """``run R (experiment E) by alice@laptop pid 123, `campaign run`, since T``."""
    run = owner.get("run_id") or "no run"
    exp = owner.get("experiment")
    who = f"{owner.get('user', '?')}@{owner.get('machine', '?')} pid {owner.get('pid', '?')}"
    cmd = f", `campaign {owner['command']}`" if owner.get("command") else ""
    return f"run {run}" + (f" (experiment {exp})" if exp else "") + f" by {who}{cmd}, since {owner.get('since', '?')}"


@dataclass
class HostLock:
    """The lock of one host; use as a context manager or call acquire/release."""

    host: Host
    run_id: str | None
    experiment: str | None
    command: str = "run"
    state_dir: str = field(default_factory=host_state_dir)
    held: bool = False
    #: After acquire: the owner record of a lock that was taken over (stale) or broken (force), else None.
    replaced: dict[str, Any] | None = None
    #: After acquire: "stale" or "forced" when ``replaced`` is set.
    replaced_how: str | None = None

    @property
    def path(self) -> str:
        """The lock directory on the host."""
        return f"{self.state_dir}/lock"

    def owner(self) -> dict[str, Any] | None:
        """The holder's record, or None when the lock is free (an unreadable record reads as ``{}``)."""
        if not self.host.run(f"test -d {q(self.path)}", timeout=15).ok:
            return None
        data: Any = {}
        # The winner of a race writes owner.json just after its mkdir: give it a moment before calling it unknown.
        for _ in range(10):
            raw = self.host.read_file(f"{self.path}/owner.json")
            if raw:
                try:
                    data = json.loads(raw)
                except ValueError:
                    data = {}
                break
            time.sleep(0.05)
        return data if isinstance(data, dict) else {}

    def acquire(self, *, force: bool = False) -> None:
        """Take the lock, or raise ``LockHeld`` naming its holder; a stale lock is taken over, ``force`` breaks any."""
        ensure_state_dir(self.host, self.state_dir)
        for _ in range(TRIES):
            res = self.host.run(f"mkdir {q(self.path)} 2>/dev/null", timeout=15)
            if res.ok:
                record = {
                    "user": _user(),
                    "machine": socket.gethostname(),
                    "pid": os.getpid(),
                    "command": self.command,
                    "run_id": self.run_id,
                    "experiment": self.experiment,
                    "since": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                }
                self.host.write_file(f"{self.path}/owner.json", json.dumps(record).encode(), mode=0o644)
                self.held = True
                return
            owner = self.owner()
            if owner is None:
                continue  # released between our mkdir and our look: try again
            if force and self._live_here(owner):
                raise LockHeld(
                    f"{self.host.name} is locked by {describe_owner(owner)}, which still runs on this machine",
                    holder=str(owner.get("run_id") or owner.get("pid") or "?"),
                    hint="--force breaks only the lock of a CLI that is gone; stop that one first (its PID is named)",
                )
            if force or self._stale(owner):
                if self._break(owner):
                    self.replaced, self.replaced_how = owner, ("forced" if force else "stale")
                else:
                    time.sleep(0.05)  # another CLI is breaking it, or it changed hands: look again
                continue
            raise LockHeld(
                f"{self.host.name} is locked by {describe_owner(owner)}",
                holder=str(owner.get("run_id") or owner.get("pid") or "?"),
                hint=f"wait for it to end; if that CLI is gone, --force breaks the lock ({self.path} on the host)",
            )
        raise HostError(f"{self.host.name}: could not take the lock at {self.path}")

    def _break(self, judged: dict[str, Any]) -> bool:
        """Remove the lock if it is still held by ``judged``, under the breaking guard; False if it was not removed."""
        guard = q(f"{self.path}.breaking")
        if not self.host.run(f"mkdir {guard} 2>/dev/null", timeout=15).ok:
            # Another CLI is breaking it. A guard whose CLI died mid-break is older than a minute: clear it.
            self.host.run(f"find {guard} -maxdepth 0 -mmin +1 -exec rmdir {{}} + 2>/dev/null", timeout=15)
            return False
        try:
            if self.owner() != judged:
                return False  # taken by a live CLI since it was judged (or gone): not ours to remove
            rm = self.host.run(f"rm -rf {q(self.path)}", timeout=15)
            if not rm.ok:
                raise HostError(f"{self.host.name}: cannot remove the lock {self.path}: {rm.tail(3)}")
            return True
        finally:
            self.host.run(f"rmdir {guard}", timeout=15)

    @staticmethod
    def _live_here(owner: dict[str, Any]) -> bool:
        """True when the holder is a campaign CLI alive on this machine (two runs on one box would fight)."""
        pid = owner.get("pid")
        if owner.get("machine") != socket.gethostname() or not isinstance(pid, int) or pid <= 1:
            return False
        return not HostLock._stale(owner) and os.path.exists(f"/proc/{pid}")

    @staticmethod
    def _stale(owner: dict[str, Any]) -> bool:
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
        # A PID reused by something else is no campaign CLI (where /proc says so).
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                return b"campaign" not in f.read()
        except OSError:
            return False

    def release(self) -> None:
        """Give the lock back (only if this object took it, and only while owner.json still says so: a lock broken
        with --force by another CLI is that CLI's now)."""
        if not self.held:
            return
        self.held = False
        owner = self.owner()
        if owner is not None and owner.get("pid") == os.getpid() and owner.get("run_id") == self.run_id:
            self.host.run(f"rm -rf {q(self.path)}", timeout=15)

    def __enter__(self) -> HostLock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def _user() -> str:
    with contextlib.suppress(Exception):
        return getpass.getuser()
    return str(os.getuid())
