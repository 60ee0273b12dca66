"""FunctionHost: a host whose commands are answered by a plain function; the fake at the Host seam.

Tests of the rooms above the hosts (server, lock, readiness, campaign) use it to script a machine without
starting one: the handler sees each command string and returns what the machine would have said. Files written
through it live in memory and are served back by ``read_file``, so code that uploads a script and reads a log
works unchanged. Nothing here patches anything: it is a real implementation of the protocol.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from campaign.errors import HostError
from campaign.hosts.base import Result

#: What a handler returns: a full ``Result``, or ``(exit_code, stdout, stderr)`` for brevity.
Reply = Result | tuple[int, str, str]
Handler = Callable[[str], Reply]


class FunctionHost:
    """A scripted host: ``handler(command)`` answers ``run``; files are kept in ``files``.

    Lifecycle: construct with a handler (and optionally a ``url_for`` that maps a port to a base URL, e.g. a
    real HTTP server on loopback); use it from any thread; ``close()`` (idempotent) makes every later call
    raise ``HostError``, like the real hosts. ``commands`` records every command run, in order, and ``modes``
    the mode each file was written with, so a test can assert what a user would check on a real box.

    A handler may raise ``HostError`` or ``HostTimeout`` to play a failing machine; it may also read or
    change ``files`` (say, append to a log) since it runs in the caller's thread.
    """

    def __init__(
        self,
        handler: Handler,
        *,
        name: str = "function",
        url_for: Callable[[int], str] | None = None,
    ) -> None:
        self.name = name
        self.files: dict[str, bytes] = {}
        self.modes: dict[str, int] = {}
        self.commands: list[str] = []
        self.timeouts: list[float] = []
        self._handler = handler
        self._url_for = url_for
        self._lock = threading.Lock()
        self._closed = False

    def run(self, command: str, *, timeout: float = 30.0) -> Result:
        """Record ``command`` and return the handler's answer as a ``Result``."""
        with self._lock:
            self._check_open()
            self.commands.append(command)
            self.timeouts.append(timeout)
        reply = self._handler(command)
        if isinstance(reply, Result):
            return reply
        exit_code, stdout, stderr = reply
        return Result(command=command, exit_code=exit_code, stdout=stdout, stderr=stderr)

    def write_file(self, path: str, data: bytes, *, mode: int = 0o600) -> None:
        """Keep ``data`` in memory under ``path`` with ``mode``."""
        with self._lock:
            self._check_open()
            self.files[path] = bytes(data)
            self.modes[path] = mode

    def read_file(self, path: str, *, offset: int = 0, limit: int | None = None) -> bytes:
        """Bytes of an in-memory file from ``offset``, at most ``limit``; ``b""`` when missing or shorter."""
        if offset < 0 or (limit is not None and limit < 0):
            raise HostError(f"{self.name}: bad range for {path}: offset={offset} limit={limit}")
        with self._lock:
            self._check_open()
            data = self.files.get(path, b"")
        end = None if limit is None else offset + limit
        return data[offset:end]

    def url(self, port: int) -> str:
        """``url_for(port)`` when given, else ``http://127.0.0.1:port``."""
        with self._lock:
            self._check_open()
        return self._url_for(port) if self._url_for is not None else f"http://127.0.0.1:{int(port)}"

    def close(self) -> None:
        """Make later calls fail with ``HostError``. Idempotent."""
        with self._lock:
            self._closed = True

    def _check_open(self) -> None:
        if self._closed:
            raise HostError(f"{self.name}: the host was closed")
