"""SSHHost: the Host protocol over one persistent SSH connection, put together from the package's rooms."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import paramiko

from campaign.errors import HostError, HostTimeout
from campaign.hosts.base import Result, Scheduler, short_command
from campaign.hosts.ssh.connect import Connector, Link, lost, open_channel
from campaign.hosts.ssh.files import RemoteFiles
from campaign.hosts.ssh.forward import Forwarder
from campaign.hosts.ssh.reconnect import reopen
from campaign.hosts.ssh.shells import ShellPool, run_on_exec_channel, wrap_command
from campaign.hosts.ssh.target import SSHTarget


class SSHHost:
    """A remote machine over one persistent SSH connection.

    Lifecycle: ``SSHHost.open(target)`` resolves the target through the ssh_config, verifies the host key, and
    authenticates (key file, IdentityFile, or ssh-agent) — through a ProxyJump host first when the config says so
    (``via`` is then that host). The host is then usable from several threads at once: commands take a slot of the
    shell pool, file calls share one SFTP session under a lock, forwarders carry traffic on their own threads.
    ``close()`` (idempotent) stops the forwarders, ends the shells, the SFTP session and the connection, then the jump
    host's; later calls raise ``HostError``.

    A lost connection is re-established by the next call that finds it down (``reconnect``), for up to
    ``reconnect_s``; the forwarders keep their local ports and carry new connections over the new transport, so
    URLs handed out stay valid. A call that was in flight when the connection broke still raises ``HostError``
    (whether a command ran is then unknown, so it is not re-sent), except ``read_file``, which is safe to repeat
    and is retried once.
    """

    #: Servers run as process groups there (no batch scheduler).
    scheduler: Scheduler | None = None

    def __init__(
        self, link: Link, *, reopen_link: Callable[[float], Link] | None = None, connect_timeout: float = 10.0
    ) -> None:
        self._link = link
        #: The ProxyJump host this connection goes through, or None for a direct connection.
        self.via = SSHHost(link.via) if link.via is not None else None
        self.hostname = link.hop.hostname
        self.port = link.hop.port
        self.user = link.hop.user
        self.name = link.name
        self._state_lock = threading.Lock()
        self._closed = False
        self._shells = ShellPool(self._state_lock, lambda: self._link.transport, self._check_open_locked)
        self._files = RemoteFiles(self.name, self.user, lambda: self._link.transport)
        self._forwarders: dict[int, Forwarder] = {}
        #: Opens the same target again, each network wait bounded by its argument; None: a lost connection stays lost
        #: (a jump host's comes back with its target).
        self._reopen = reopen_link
        #: How long a reconnect keeps trying, from the moment a call found the connection down, before that call
        #: raises ``HostLost``; 0 turns reconnecting off.
        self.reconnect_s = 60.0
        #: The longest one reconnect attempt may wait on the network (less when the budget has less left).
        self.connect_timeout = connect_timeout
        #: Connections re-established so far (the loop reports them).
        self.reconnects = 0
        self._reconnect_lock = threading.Lock()

    @property
    def link(self) -> Link:
        """The connection in use now (a reconnect replaces it): its hop, and the jump host or ProxyCommand it uses."""
        return self._link

    # -- construction ------------------------------------------------------------------------------------------------

    @classmethod
    def open(cls, target: SSHTarget) -> SSHHost:
        """Connect to ``target``; a lost connection later reopens the same target."""
        connector = Connector(target)
        return cls(connector.open(), reopen_link=connector.open, connect_timeout=target.connect_timeout)

    # -- the Host protocol --------------------------------------------------------------------------------------------

    def run(self, command: str, *, timeout: float = 30.0) -> Result:
        """Run ``command`` under ``/bin/sh -c`` on the host; stdin is /dev/null; wait at most ``timeout``.

        Commands go to the pool of long-lived remote shells (``shells.ShellPool``): the host's login shell and its
        rc files start once per shell, not once per command, so a liveness poll costs a few milliseconds. When a
        shell cannot be had (or ``persistent_shells`` is False), the command runs on its own exec channel.
        Past ``timeout`` the local call raises ``HostTimeout`` and coreutils ``timeout`` on the host kills the
        command's process group a moment later. A detached child (``setsid ... </dev/null >log 2>&1 &``)
        never holds the call open.
        """
        self._ensure_connected()
        deadline = time.monotonic() + timeout
        shell = None
        taken = False
        try:
            shell = self._shells.take(deadline)
            taken = True
            if shell is not None:
                try:
                    code, out, err = shell.run(wrap_command(command, timeout), deadline)
                except BaseException:
                    shell.close()  # mid-command state is unknown: release retires it
                    raise
            else:
                chan = open_channel(
                    self.name,
                    lambda t: self._link.transport.open_session(timeout=t),
                    timeout,
                    "open a command channel",
                )
                code, out, err = run_on_exec_channel(self.name, chan, command, timeout, deadline)
        except TimeoutError as exc:
            raise HostTimeout(
                f"{self.name}: command ran past its {timeout:g} s timeout: {short_command(command)}",
                hint="raise the timeout, or find out why the command hangs on the host",
            ) from exc
        except (paramiko.SSHException, EOFError, OSError) as exc:
            raise lost(self.name, exc, "run a command") from exc
        finally:
            if taken:
                self._shells.release(shell)
        return Result(
            command=command,
            exit_code=code,
            stdout=out.decode("utf-8", errors="replace"),
            stderr=err.decode("utf-8", errors="replace"),
        )

    def write_file(self, path: str, data: bytes, *, mode: int = 0o600) -> None:
        """Create or replace ``path`` with ``data`` and ``mode`` over SFTP (atomically: a temp file, renamed)."""
        self._ensure_connected()
        self._files.write(path, data, mode=mode)

    def read_file(self, path: str, *, offset: int = 0, limit: int | None = None) -> bytes:
        """Bytes of ``path`` from ``offset``, at most ``limit``, over SFTP; ``b""`` when missing or shorter."""
        if offset < 0 or (limit is not None and limit < 0):
            raise HostError(f"{self.name}: bad range for {path}: offset={offset} limit={limit}")
        self._ensure_connected()
        try:
            return self._files.read(path, offset, limit)
        except HostError:
            if self._closed or self._link.transport.is_active():
                raise
        # The connection broke under the read; a read changes nothing on the host, so it is safe to repeat.
        self._ensure_connected()
        return self._files.read(path, offset, limit)

    def url(self, port: int) -> str:
        """``http://127.0.0.1:LOCAL``: a local listener (one per remote port, reused) forwarding to ``port``."""
        port = int(port)
        self._ensure_connected()
        with self._state_lock:
            self._check_open_locked()
            fwd = self._forwarders.get(port)
            if fwd is None:
                fwd = Forwarder(self._link.transport, port, self.name)
                self._forwarders[port] = fwd
        return f"http://127.0.0.1:{fwd.local_port}"

    def close(self) -> None:
        """Stop the forwarders, end the shells, SFTP and the connection, then the jump host's. Idempotent."""
        with self._state_lock:
            if self._closed:
                return
            self._closed = True
            forwarders = list(self._forwarders.values())
            self._forwarders.clear()
            shells = self._shells.retire_locked(closing=True)
        for shell in shells:
            shell.close()
        for fwd in forwarders:
            fwd.close()
        self._files.drop()
        self._link.client.close()
        if self._link.proxy is not None:
            self._link.proxy.close()  # ends and reaps the ProxyCommand we started
        if self.via is not None:
            self.via.close()

    # -- settings and state ----------------------------------------------------------------------------------------

    @property
    def connected(self) -> bool:
        """Whether the SSH connection is up right now (a lost one comes back at the next call)."""
        return not self._closed and self._link.transport.is_active()

    @property
    def persistent_shells(self) -> bool:
        """Run commands in long-lived remote shells (fast); False: one exec channel per command, which pays the
        login shell's rc files every time but keeps no shell open on the host."""
        return self._shells.persistent

    @persistent_shells.setter
    def persistent_shells(self, value: bool) -> None:
        self._shells.persistent = value

    @property
    def file_timeout(self) -> float:
        """Timeout of each SFTP request made by write_file / read_file (the protocol gives them none)."""
        return self._files.timeout

    @file_timeout.setter
    def file_timeout(self, value: float) -> None:
        self._files.timeout = value

    # -- reconnecting --------------------------------------------------------------------------------------------------

    def _ensure_connected(self) -> None:
        """Raise if closed; re-establish a lost connection (one thread at a time) before a call goes out."""
        with self._state_lock:
            if self._closed:
                self._check_open_locked()
            if self._link.transport.is_active():
                return
        with self._reconnect_lock:
            with self._state_lock:
                if self._closed or self._link.transport.is_active():
                    self._check_open_locked()  # closed meanwhile: raises; reconnected by another thread: returns
                    return
            self._reconnect()

    def _reconnect(self) -> None:
        """Open the same target again and move the shells, SFTP and forwarders onto the new transport."""
        if self._reopen is None or self.reconnect_s <= 0:
            with self._state_lock:
                self._check_open_locked()
            return
        fresh = reopen(self._reopen, self.reconnect_s, self.name, self.connect_timeout)
        with self._state_lock:
            if self._closed:
                fresh.close()
                self._check_open_locked()
            stale = self._shells.retire_locked(closing=False)
            old_link, old_via = self._link, self.via
            self._link = fresh
            self.via = SSHHost(fresh.via) if fresh.via is not None else None
            self.reconnects += 1
            forwarders = list(self._forwarders.values())
        for shell in stale:
            shell.close()
        for fwd in forwarders:
            fwd.retarget(fresh.transport)
        self._files.drop()
        old_link.client.close()
        if old_link.proxy is not None:
            old_link.proxy.close()  # the dead route's ProxyCommand, ours to end
        if old_via is not None:
            old_via.close()

    def _check_open_locked(self) -> None:
        if self._closed:
            raise HostError(f"{self.name}: the SSH host was closed", hint="connect a new SSHHost")
        if not self._link.transport.is_active():
            raise HostError(
                f"{self.name}: the SSH connection was lost",
                hint="check that the host is up and reachable, then connect again",
            )
