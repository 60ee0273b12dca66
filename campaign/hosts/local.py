"""LocalHost: this machine, driven through subprocess.

Lifecycle: construct ``LocalHost()``; call ``run``/``write_file``/``read_file``/``url`` from any thread;
``close()`` marks it closed (idempotent), after which every call raises ``HostError`` — the same contract as
``SSHHost``, so code that uses a host after closing it fails in tests on this machine too.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import subprocess
import threading

from campaign.errors import HostError, HostTimeout
from campaign.hosts.base import Result, Scheduler, short_command

#: After a timeout kill, how long to wait for the pipes to drain before giving up on them.
_DRAIN_AFTER_KILL_S = 2.0


class LocalHost:
    """This machine: commands under ``/bin/sh -c`` in their own process group, files through the OS."""

    #: Servers run as process groups here (no batch scheduler).
    scheduler: Scheduler | None = None

    def __init__(self) -> None:
        self.name = "local"
        self._closed = threading.Event()

    def run(self, command: str, *, timeout: float = 30.0) -> Result:
        """Run ``command`` under ``/bin/sh -c`` with stdin /dev/null; past ``timeout`` kill its process group.

        The command leads a new process group (``start_new_session``), so a timeout kills everything it
        started except what deliberately left the group (``setsid``): a detached server survives, a hung
        ``sleep`` does not. The call returns when both streams reach EOF and the shell has exited.
        """
        self._check_open()
        try:
            proc = subprocess.Popen(
                ["/bin/sh", "-c", command],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,
            )
        except OSError as exc:
            raise HostError(f"local: cannot start /bin/sh: {exc.strerror or exc}") from exc
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired as exc:
            self._kill_group(proc)
            raise HostTimeout(
                f"local: command ran past its {timeout:g} s timeout and was killed: {short_command(command)}",
                hint="raise the timeout, or find out why the command hangs",
            ) from exc
        return Result(
            command=command,
            exit_code=_exit_code(proc.returncode),
            stdout=out.decode("utf-8", errors="replace"),
            stderr=err.decode("utf-8", errors="replace"),
        )

    def write_file(self, path: str, data: bytes, *, mode: int = 0o600) -> None:
        """Create or replace ``path`` atomically with ``data`` and exactly ``mode`` (parents must exist)."""
        self._check_open()
        tmp = f"{path}.tmp-{secrets.token_hex(4)}"
        try:
            # O_EXCL and the mode at creation: the data is never readable by others, even for an instant.
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode & 0o7777)
            try:
                os.fchmod(fd, mode & 0o7777)  # undo the umask
                with os.fdopen(fd, "wb", closefd=False) as out:
                    out.write(data)
            finally:
                os.close(fd)
            os.replace(tmp, path)
        except OSError as exc:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise HostError(f"local: cannot write {path}: {exc.strerror or exc}") from exc

    def read_file(self, path: str, *, offset: int = 0, limit: int | None = None) -> bytes:
        """Bytes of ``path`` from ``offset``, at most ``limit``; ``b""`` when it is missing or shorter."""
        self._check_open()
        if offset < 0 or (limit is not None and limit < 0):
            raise HostError(f"local: bad range for {path}: offset={offset} limit={limit}")
        try:
            with open(path, "rb") as src:
                src.seek(offset)
                return src.read(-1 if limit is None else limit)
        except FileNotFoundError:
            return b""
        except OSError as exc:
            raise HostError(f"local: cannot read {path}: {exc.strerror or exc}") from exc

    def url(self, port: int) -> str:
        """``http://127.0.0.1:port``: a local server is reached directly."""
        self._check_open()
        return f"http://127.0.0.1:{int(port)}"

    def close(self) -> None:
        """Mark the host closed; nothing is held, so this only makes later calls fail loudly. Idempotent."""
        self._closed.set()

    def _check_open(self) -> None:
        if self._closed.is_set():
            raise HostError("local: the host was closed", hint="open a new LocalHost")

    @staticmethod
    def _kill_group(proc: subprocess.Popen[bytes]) -> None:
        # The shell leads its group (start_new_session), so its pid is the group id.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        try:
            proc.communicate(timeout=_DRAIN_AFTER_KILL_S)
        except subprocess.TimeoutExpired:
            # A process outside the group still holds the pipes; stop reading rather than hang.
            for stream in (proc.stdout, proc.stderr):
                if stream is not None:
                    stream.close()
            proc.wait(timeout=_DRAIN_AFTER_KILL_S)


def _exit_code(returncode: int) -> int:
    """The shell's convention for a death by signal (128 + N), so local and SSH results read alike."""
    return 128 - returncode if returncode < 0 else returncode
