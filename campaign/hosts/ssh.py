"""SSHHost: a machine reached over SSH with paramiko (the only module that imports paramiko).

One SSH connection per host carries everything: each ``run`` is a new exec channel on the persistent transport,
files move over one persistent SFTP session, and ``url(port)`` is a local listener whose connections become
``direct-tcpip`` channels to ``127.0.0.1:port`` on the remote. Host keys are always verified. paramiko and socket
errors are mapped here to ``HostError`` / ``HostKeyError`` / ``HostTimeout`` with a message that says what to do.
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import errno
import getpass
import hashlib
import os
import re
import secrets
import select
import shlex
import socket
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import paramiko

from campaign.errors import HostError, HostKeyError, HostTimeout
from campaign.hosts.base import Result
from campaign.hosts.local import short_command

DEFAULT_SSH_CONFIG = "~/.ssh/config"
DEFAULT_KNOWN_HOSTS = "~/.ssh/known_hosts"
SYSTEM_KNOWN_HOSTS = "/etc/ssh/ssh_known_hosts"
#: Seconds between keepalive messages on the transport: a NAT or firewall does not drop an idle campaign.
KEEPALIVE_S = 15
#: The remote ``timeout`` kill fires this long after the local deadline, so the local HostTimeout comes first.
REMOTE_KILL_GRACE_S = 1.0
#: Long-lived remote shells per host; more concurrent commands wait for one (sshd's MaxSessions is 10).
MAX_RUNNERS = 6
#: How long a new remote shell may take to start (the login shell's rc files run then).
RUNNER_START_S = 15.0
#: A ProxyJump chain longer than this is taken for a loop in the config.
MAX_JUMPS = 8
_READ_CHUNK = 1 << 16


@dataclass(frozen=True)
class _Target:
    """Where one SSH hop goes, with ~/.ssh/config applied and explicit arguments winning over it."""

    alias: str
    hostname: str
    port: int
    user: str
    key_files: list[str]
    known_hosts: str
    #: ``[user@]host[:port]`` hops, first hop first; empty for a direct connection.
    jumps: list[str] = field(default_factory=list)

    @property
    def hostkey_name(self) -> str:
        """The name OpenSSH files this host's key under in known_hosts."""
        return self.hostname if self.port == 22 else f"[{self.hostname}]:{self.port}"


class SSHHost:
    """A remote machine over one persistent SSH connection.

    Lifecycle: ``SSHHost.connect(...)`` resolves the target through the ssh_config, verifies the host key, and
    authenticates (key file, IdentityFile, or ssh-agent) — through a ProxyJump host first when the config says
    so. The host is then usable from several threads at once: commands open their own channels, file calls share
    one SFTP session under a lock, forwarders carry traffic on their own threads. ``close()`` (idempotent)
    stops the forwarders, ends the SFTP session and the connection, then the jump host's; later calls raise
    ``HostError``.

    A lost connection (sshd restarted, a network blip, the box rebooted) is re-established by the next call that
    finds it down: the same target, keys and host-key check, retried with backoff for up to ``reconnect_s``; the
    forwarders keep their local ports and carry new connections over the new transport, so URLs handed out
    stay valid. A call that was in flight when the connection broke still raises ``HostError`` (whether a command
    ran is then unknown, so it is not re-sent), except ``read_file``, which is safe to repeat and is retried once.
    A changed host key on reconnect is refused like any other.
    """

    def __init__(self, client: paramiko.SSHClient, target: _Target, *, via: SSHHost | None = None) -> None:
        self._client = client
        self._target = target
        #: The ProxyJump host this connection goes through, or None for a direct connection.
        self.via = via
        self.hostname = target.hostname
        self.port = target.port
        self.user = target.user
        self.name = f"{target.user}@{target.hostname}:{target.port}"
        #: Timeout of each SFTP request made by write_file / read_file (the protocol gives them none).
        self.file_timeout = 30.0
        self._sftp: paramiko.SFTPClient | None = None
        self._sftp_lock = threading.Lock()
        self._forwarders: dict[int, _Forwarder] = {}
        self._idle: list[_Runner] = []
        self._slots = 0  # commands in flight plus idle shells: each holds one SSH session
        #: Run commands in long-lived remote shells (fast); False: one exec channel per command, which pays
        #: the login shell's rc files every time but keeps no shell open on the host.
        self.persistent_shells = True
        self._runners_work = True
        self._state_lock = threading.Lock()
        #: Signalled when a command slot frees up (shares the state lock: slots are host state).
        self._pool_free = threading.Condition(self._state_lock)
        self._closed = False
        #: Re-opens the same target (set by ``_open``); None: a lost connection stays lost.
        self._reopen: Callable[[], SSHHost] | None = None
        #: How long a reconnect keeps trying before the call raises ``HostError``; 0 turns reconnecting off.
        self.reconnect_s = 60.0
        #: Connections re-established so far (the loop reports them).
        self.reconnects = 0
        self._reconnect_lock = threading.Lock()
        transport = client.get_transport()
        if transport is None:  # connect() returned, so this is a paramiko invariant, not a user error
            raise HostError(f"{self.name}: the SSH transport vanished right after connecting")
        self._transport = transport
        transport.set_keepalive(KEEPALIVE_S)

    # -- construction ------------------------------------------------------------------------------------------------

    @classmethod
    def connect(
        cls,
        host: str,
        *,
        user: str | None = None,
        port: int | None = None,
        key_filename: str | None = None,
        known_hosts: str | None = None,
        accept_new_host_key: bool = False,
        ssh_config: str | None = DEFAULT_SSH_CONFIG,
        connect_timeout: float = 10.0,
    ) -> SSHHost:
        """Connect to ``host`` (a name, an address, or a Host alias of the ssh_config).

        Explicit ``user``/``port``/``key_filename`` win over the config, as on the ssh command line. Without a
        key, the config's IdentityFile keys, the ssh-agent and the default ~/.ssh keys are tried. ``known_hosts``
        defaults to the config's UserKnownHostsFile, else ~/.ssh/known_hosts; /etc/ssh/ssh_known_hosts is read
        too. An unknown host key raises ``HostKeyError`` unless ``accept_new_host_key``, which records it in
        ``known_hosts`` (OpenSSH's accept-new); a changed key is always refused.
        """
        config = _load_ssh_config(ssh_config)
        return cls._open(
            host,
            user=user,
            port=port,
            key_filename=key_filename,
            fallback_key=None,
            known_hosts=known_hosts,
            accept_new_host_key=accept_new_host_key,
            config=config,
            connect_timeout=connect_timeout,
            jumps=None,
            depth=0,
        )

    @classmethod
    def _open(
        cls,
        host: str,
        *,
        user: str | None,
        port: int | None,
        key_filename: str | None,
        fallback_key: str | None,
        known_hosts: str | None,
        accept_new_host_key: bool,
        config: paramiko.SSHConfig | None,
        connect_timeout: float,
        jumps: list[str] | None,
        depth: int,
    ) -> SSHHost:
        if depth > MAX_JUMPS:
            raise HostError(
                f"ProxyJump chain to {host} is longer than {MAX_JUMPS} hops",
                hint="check the ssh_config for a ProxyJump loop",
            )
        target = _resolve(config, host, user=user, port=port, key_filename=key_filename, known_hosts=known_hosts)
        if not target.key_files and fallback_key:
            target = dataclasses.replace(target, key_files=[os.path.expanduser(fallback_key)])
        chain = target.jumps if jumps is None else jumps
        via: SSHHost | None = None
        sock: paramiko.Channel | None = None
        if chain:
            hop_user, hop_host, hop_port = _parse_hop(chain[-1])
            via = cls._open(
                hop_host,
                user=hop_user,
                port=hop_port,
                key_filename=None,
                fallback_key=key_filename or fallback_key,
                known_hosts=known_hosts,
                accept_new_host_key=accept_new_host_key,
                config=config,
                connect_timeout=connect_timeout,
                # One hop: the jump host's own config applies (its ProxyJump too). More: the rest of the chain.
                jumps=chain[:-1] or None,
                depth=depth + 1,
            )
            try:
                sock = via._open_direct(target.hostname, target.port, connect_timeout)
            except BaseException:
                via.close()
                raise
        try:
            client = _handshake(target, sock, accept_new_host_key, connect_timeout, agent=not key_filename)
        except BaseException:
            if via is not None:
                via.close()
            raise
        opened = cls(client, target, via=via)
        opened._reopen = lambda: cls._open(
            host,
            user=user,
            port=port,
            key_filename=key_filename,
            fallback_key=fallback_key,
            known_hosts=known_hosts,
            accept_new_host_key=accept_new_host_key,
            config=config,
            connect_timeout=connect_timeout,
            jumps=jumps,
            depth=depth,
        )
        return opened

    # -- the Host protocol --------------------------------------------------------------------------------------------

    def run(self, command: str, *, timeout: float = 30.0) -> Result:
        """Run ``command`` under ``/bin/sh -c`` on the host; stdin is /dev/null; wait at most ``timeout``.

        Commands go to a pool of long-lived remote shells (see ``_Runner``): the host's login shell and its rc
        files start once per shell, not once per command, so a liveness poll costs a few milliseconds. When a
        shell cannot be had (or ``persistent_shells`` is False), the command runs on its own exec channel.
        Past ``timeout`` the local call raises ``HostTimeout`` and coreutils ``timeout`` on the host kills the
        command's process group a moment later. A detached child (``setsid ... </dev/null >log 2>&1 &``)
        never holds the call open.
        """
        self._ensure_connected()
        deadline = time.monotonic() + timeout
        runner: _Runner | None = None
        slot = False
        try:
            runner, slot = self._take_slot(deadline)
            if runner is not None:
                try:
                    code, out, err = runner.run(_inner(command, timeout), deadline)
                except BaseException:
                    runner.close()  # mid-command state is unknown: _release retires it
                    raise
            else:
                code, out, err = self._exec(command, timeout, deadline)
        except TimeoutError as exc:
            raise HostTimeout(
                f"{self.name}: command ran past its {timeout:g} s timeout: {short_command(command)}",
                hint="raise the timeout, or find out why the command hangs on the host",
            ) from exc
        except (paramiko.SSHException, EOFError, OSError) as exc:
            raise self._lost(exc, "run a command") from exc
        finally:
            if slot:
                self._release(runner)
        return Result(
            command=command,
            exit_code=code,
            stdout=out.decode("utf-8", errors="replace"),
            stderr=err.decode("utf-8", errors="replace"),
        )

    def _exec(self, command: str, timeout: float, deadline: float) -> tuple[int, bytes, bytes]:
        """Run one command on its own exec channel (the fallback: pays the login shell's start every time)."""
        chan = self._channel(lambda t: self._transport.open_session(timeout=t), timeout, "open a command channel")
        try:
            chan.exec_command(f"exec /bin/sh -c {shlex.quote(_inner(command, timeout))}")
            chan.shutdown_write()
            out, err = _drain(chan, deadline)
            if not chan.status_event.wait(max(0.0, deadline - time.monotonic())):
                raise TimeoutError()
            if chan.exit_status < 0:
                raise HostError(
                    f"{self.name}: the command ended without an exit status (was the connection cut?): "
                    f"{short_command(command)}"
                )
            return chan.exit_status, out, err
        finally:
            chan.close()

    def _take_slot(self, deadline: float) -> tuple[_Runner | None, bool]:
        """A command slot: (an idle or new remote shell, True), or (None, True) to use an exec channel.

        At most ``MAX_RUNNERS`` commands hold a session at once (sshd's MaxSessions, 10 by default, also
        counts SFTP); past that the caller waits for a slot, up to its own deadline.
        """
        with self._pool_free:
            while True:
                self._check_open_locked()
                while self._idle and not self.persistent_shells:
                    self._idle.pop().close()  # switched off since they were started
                    self._slots -= 1
                while self._idle:
                    runner = self._idle.pop()
                    if runner.alive:
                        return runner, True
                    runner.close()
                    self._slots -= 1
                if self._slots < MAX_RUNNERS:
                    self._slots += 1
                    break
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError(f"all {MAX_RUNNERS} command slots stayed busy")
                self._pool_free.wait(remaining)
            if not self.persistent_shells or not self._runners_work:
                return None, True
        try:
            return _Runner.start(self._transport, min(RUNNER_START_S, max(0.1, deadline - time.monotonic()))), True
        except (TimeoutError, paramiko.SSHException, EOFError, OSError):
            with self._pool_free:
                # A login shell that does not answer a plain printf (an rc file reading stdin, a restricted
                # shell): stop trying and use one exec channel per command on this host.
                self._runners_work = False
            return None, True

    def _release(self, runner: _Runner | None) -> None:
        """Free a command slot: keep a healthy shell for the next command, retire a broken one."""
        with self._pool_free:
            if runner is not None and not self._closed and runner.alive:
                self._idle.append(runner)
            else:
                if runner is not None:
                    runner.close()
                self._slots -= 1
            self._pool_free.notify()

    def write_file(self, path: str, data: bytes, *, mode: int = 0o600) -> None:
        """Create or replace ``path`` with ``data`` and ``mode`` over SFTP (atomically: a temp file, renamed)."""
        self._ensure_connected()
        tmp = f"{path}.tmp-{secrets.token_hex(4)}"
        with self._sftp_lock:
            sftp = self._sftp_session()
            try:
                with sftp.open(tmp, "wb") as out:
                    out.chmod(mode & 0o7777)  # before any data lands: a secret is never world-readable
                    out.set_pipelined(True)
                    out.write(data)
                try:
                    sftp.posix_rename(tmp, path)
                except OSError:
                    # Servers without the posix-rename extension: a plain rename refuses to replace.
                    with contextlib.suppress(OSError):
                        sftp.remove(path)
                    sftp.rename(tmp, path)
            except TimeoutError as exc:
                self._drop_sftp()
                raise HostTimeout(f"{self.name}: writing {path} ran past {self.file_timeout:g} s") from exc
            except OSError as exc:
                with contextlib.suppress(OSError, paramiko.SSHException, EOFError):
                    sftp.remove(tmp)
                raise HostError(
                    f"{self.name}: cannot write {path}: {_sftp_reason(exc)}",
                    hint="the parent folder must exist and be writable by " + self.user,
                ) from exc
            except (paramiko.SSHException, EOFError) as exc:
                self._drop_sftp()
                raise self._lost(exc, f"write {path}") from exc

    def read_file(self, path: str, *, offset: int = 0, limit: int | None = None) -> bytes:
        """Bytes of ``path`` from ``offset``, at most ``limit``, over SFTP; ``b""`` when missing or shorter."""
        if offset < 0 or (limit is not None and limit < 0):
            raise HostError(f"{self.name}: bad range for {path}: offset={offset} limit={limit}")
        self._ensure_connected()
        try:
            return self._read_once(path, offset, limit)
        except HostError:
            if self._closed or self._transport.is_active():
                raise
        # The connection broke under the read; a read changes nothing on the host, so it is safe to repeat.
        self._ensure_connected()
        return self._read_once(path, offset, limit)

    def _read_once(self, path: str, offset: int, limit: int | None) -> bytes:
        with self._sftp_lock:
            sftp = self._sftp_session()
            try:
                try:
                    src = sftp.open(path, "rb")
                except OSError as exc:
                    if exc.errno == errno.ENOENT:
                        return b""
                    raise
                with src:
                    size = src.stat().st_size or 0
                    n = max(0, size - offset) if limit is None else max(0, min(limit, size - offset))
                    src.seek(offset)
                    if n > src.MAX_REQUEST_SIZE:
                        # Pipelined reads: a big log costs one round trip's latency, not one per 32 KiB.
                        head = b"".join(bytes(part) for part in src.readv([(offset, n)]))
                    else:
                        head = bytes(src.read(n)) if n else b""
                    if limit is not None and len(head) >= limit:
                        return head
                    # Past what stat promised: bytes written since, or a file that reports size 0 (/proc).
                    more = src.read(None if limit is None else limit - len(head))
                    return head + bytes(more)
            except TimeoutError as exc:
                self._drop_sftp()
                raise HostTimeout(f"{self.name}: reading {path} ran past {self.file_timeout:g} s") from exc
            except OSError as exc:
                raise HostError(f"{self.name}: cannot read {path}: {_sftp_reason(exc)}") from exc
            except (paramiko.SSHException, EOFError) as exc:
                self._drop_sftp()
                raise self._lost(exc, f"read {path}") from exc

    def url(self, port: int) -> str:
        """``http://127.0.0.1:LOCAL``: a local listener (one per remote port, reused) forwarding to ``port``."""
        port = int(port)
        self._ensure_connected()
        with self._state_lock:
            self._check_open_locked()
            fwd = self._forwarders.get(port)
            if fwd is None:
                fwd = _Forwarder(self._transport, port, self.name)
                self._forwarders[port] = fwd
        return f"http://127.0.0.1:{fwd.local_port}"

    @property
    def connected(self) -> bool:
        """Whether the SSH connection is up right now (a lost one comes back at the next call)."""
        return not self._closed and self._transport.is_active()

    def close(self) -> None:
        """Stop the forwarders, end SFTP and the connection, then the jump host's. Idempotent."""
        with self._state_lock:
            if self._closed:
                return
            self._closed = True
            forwarders = list(self._forwarders.values())
            self._forwarders.clear()
            runners, self._idle = self._idle, []
            self._slots -= len(runners)
            self._pool_free.notify_all()
        for runner in runners:
            runner.close()
        for fwd in forwarders:
            fwd.close()
        with self._sftp_lock:
            self._drop_sftp()
        self._client.close()
        if self.via is not None:
            self.via.close()

    # -- internals -----------------------------------------------------------------------------------------------------

    def _ensure_connected(self) -> None:
        """Raise if closed; re-establish a lost connection (one thread at a time) before a call goes out."""
        with self._state_lock:
            if self._closed:
                self._check_open_locked()
            if self._transport.is_active():
                return
        with self._reconnect_lock:
            with self._state_lock:
                if self._closed or self._transport.is_active():
                    self._check_open_locked()  # closed meanwhile: raises; reconnected by another thread: returns
                    return
            self._reconnect()

    def _reconnect(self) -> None:
        """Open the same target again and move the pool, SFTP and forwarders onto the new transport."""
        if self._reopen is None or self.reconnect_s <= 0:
            with self._state_lock:
                self._check_open_locked()
            return
        deadline = time.monotonic() + self.reconnect_s
        delay = 0.25
        while True:
            try:
                fresh = self._reopen()
                break
            except HostKeyError:
                raise  # a changed key is an answer, not a blip
            except HostError as exc:
                if time.monotonic() + delay > deadline:
                    raise HostError(
                        f"{self.name}: the SSH connection was lost and could not be re-established within "
                        f"{self.reconnect_s:g} s: {exc}",
                        hint="check that the host is up and sshd answers; `campaign restore` puts the known-good back",
                    ) from exc
            time.sleep(delay)
            delay = min(delay * 2, 5.0)
        with self._pool_free:
            if self._closed:
                fresh.close()
                self._check_open_locked()
            stale, self._idle = self._idle, []
            self._slots -= len(stale)
            old_client, old_via = self._client, self.via
            self._client, self._transport, self.via = fresh._client, fresh._transport, fresh.via
            self._runners_work = True
            self.reconnects += 1
            forwarders = list(self._forwarders.values())
            self._pool_free.notify_all()
        for runner in stale:
            runner.close()
        for fwd in forwarders:
            fwd.retarget(self._transport)
        with self._sftp_lock:
            self._drop_sftp()
        old_client.close()
        if old_via is not None:
            old_via.close()

    def _check_open_locked(self) -> None:
        if self._closed:
            raise HostError(f"{self.name}: the SSH host was closed", hint="connect a new SSHHost")
        if not self._transport.is_active():
            raise HostError(
                f"{self.name}: the SSH connection was lost",
                hint="check that the host is up and reachable, then connect again",
            )

    def _lost(self, exc: BaseException, doing: str) -> HostError:
        """The error for a call whose connection or channel broke under it."""
        return HostError(
            f"{self.name}: could not {doing}: {exc or type(exc).__name__}",
            hint="the SSH connection may have dropped; check the host, then connect again",
        )

    def _channel(
        self,
        opener: Callable[[float], paramiko.Channel],
        timeout: float,
        doing: str,
        refused_hint: str = "sshd may limit sessions per connection (MaxSessions)",
    ) -> paramiko.Channel:
        """Open a channel with ``opener(timeout)``, mapping paramiko's failures to our errors."""
        try:
            return opener(timeout)
        except TimeoutError as exc:
            raise HostTimeout(f"{self.name}: could not {doing} within {timeout:g} s") from exc
        except paramiko.ChannelException as exc:
            raise HostError(f"{self.name}: the server refused to {doing}: {exc}", hint=refused_hint) from exc
        except (paramiko.SSHException, EOFError, OSError) as exc:
            if "Timeout" in str(exc):  # paramiko reports a slow channel open as a plain SSHException
                raise HostTimeout(f"{self.name}: could not {doing} within {timeout:g} s") from exc
            raise self._lost(exc, doing) from exc

    def _open_direct(self, hostname: str, port: int, timeout: float) -> paramiko.Channel:
        """A direct-tcpip channel to ``hostname:port`` as seen from this host (the next ProxyJump hop)."""
        return self._channel(
            lambda t: self._transport.open_channel("direct-tcpip", (hostname, port), ("127.0.0.1", 0), timeout=t),
            timeout,
            f"open a tunnel to {hostname}:{port}",
            refused_hint="check the HostName and Port of the target as the jump host sees them, and AllowTcpForwarding",
        )

    def _sftp_session(self) -> paramiko.SFTPClient:
        """The persistent SFTP session, opened on first use (caller holds ``_sftp_lock``)."""
        if self._sftp is not None and not self._sftp.sock.closed:
            return self._sftp
        chan = self._channel(lambda t: self._transport.open_session(timeout=t), self.file_timeout, "open SFTP")
        try:
            chan.invoke_subsystem("sftp")
            sftp = paramiko.SFTPClient(chan)
        except (paramiko.SSHException, EOFError, OSError) as exc:
            chan.close()
            raise HostError(
                f"{self.name}: the SFTP subsystem is not available: {exc}",
                hint="enable `Subsystem sftp` in the host's sshd_config",
            ) from exc
        chan.settimeout(self.file_timeout)
        self._sftp = sftp
        return sftp

    def _drop_sftp(self) -> None:
        """Forget the SFTP session: after a timeout its request/response pairing can no longer be trusted."""
        if self._sftp is not None:
            with contextlib.suppress(Exception):
                self._sftp.close()
            self._sftp = None


# ---------------------------------------------------------------------------------------------------------------------
# Port forwarding


class _Forwarder:
    """One local listener on 127.0.0.1 whose connections become direct-tcpip channels to one remote port.

    Lifecycle: created listening, with an accept thread; each accepted connection gets its own thread that opens
    the channel (so a slow open never stalls other connections) and pumps both directions; ``close()`` stops
    accepting, resets live connections and closes their channels. A connection made while nothing listens on the
    remote port is reset at once (the remote refused it), which a client sees as a failed request, not a hang.
    """

    def __init__(self, transport: paramiko.Transport, remote_port: int, host_name: str) -> None:
        self._transport = transport
        self.remote_port = remote_port
        self._host_name = host_name
        self.open_timeout = 10.0
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(1024)
        self.local_port: int = self._listener.getsockname()[1]
        self._lock = threading.Lock()
        self._live: set[_Pump] = set()
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._accept_loop, name=f"forward-{remote_port}", daemon=True)
        self._thread.start()

    def _accept_loop(self) -> None:
        while not self._closed.is_set():
            try:
                ready, _, _ = select.select([self._listener], [], [], 0.25)
                if not ready:
                    continue
                client, peer = self._listener.accept()
            except OSError:
                if self._closed.is_set():
                    return
                continue
            threading.Thread(target=self._serve, args=(client, peer), daemon=True).start()

    def _serve(self, client: socket.socket, peer: tuple[str, int]) -> None:
        client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            chan = self._transport.open_channel(
                "direct-tcpip", ("127.0.0.1", self.remote_port), peer, timeout=self.open_timeout
            )
        except (paramiko.SSHException, EOFError, OSError):
            _reset(client)
            return
        pump = _Pump(client, chan)
        with self._lock:
            if self._closed.is_set():
                pump.close()
                return
            self._live.add(pump)
        try:
            pump.run()
        finally:
            with self._lock:
                self._live.discard(pump)

    def retarget(self, transport: paramiko.Transport) -> None:
        """Carry new connections over ``transport`` (after a reconnect); the local port stays the same."""
        self._transport = transport

    def close(self) -> None:
        """Stop listening and cut every live connection."""
        self._closed.set()
        with contextlib.suppress(OSError):
            self._listener.close()
        self._thread.join(timeout=2)
        with self._lock:
            live = list(self._live)
            self._live.clear()
        for pump in live:
            pump.close()


class _Pump:
    """Copies bytes both ways between one local socket and one channel until both sides are done."""

    def __init__(self, sock: socket.socket, chan: paramiko.Channel) -> None:
        self.sock = sock
        self.chan = chan

    def run(self) -> None:
        """Pump channel→socket on a helper thread and socket→channel here; close both at the end."""
        back = threading.Thread(target=self._chan_to_sock, daemon=True)
        back.start()
        try:
            while True:
                data = self.sock.recv(_READ_CHUNK)
                if not data:
                    self.chan.shutdown_write()
                    break
                self.chan.sendall(data)
        except (OSError, EOFError, paramiko.SSHException):
            self.close()
        back.join()
        self.close()

    def _chan_to_sock(self) -> None:
        try:
            while True:
                data = self.chan.recv(_READ_CHUNK)
                if not data:
                    self.sock.shutdown(socket.SHUT_WR)
                    break
                self.sock.sendall(data)
        except (OSError, EOFError, paramiko.SSHException):
            self.close()

    def close(self) -> None:
        """Shut the socket (which wakes a thread blocked in recv on it) and close the channel."""
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        with contextlib.suppress(OSError):
            self.sock.close()
        with contextlib.suppress(Exception):
            self.chan.close()


def _reset(sock: socket.socket) -> None:
    """Close with a TCP reset, so the client fails at once as if the port had refused it."""
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    with contextlib.suppress(OSError):
        sock.close()


# ---------------------------------------------------------------------------------------------------------------------
# Commands


def _inner(command: str, timeout: float) -> str:
    """``command`` under ``/bin/sh -c``, killed on the host (group and all) shortly after the local deadline.

    Not exec-ing ``timeout`` keeps the shell's 128+N exit code when the command dies of a signal. A host
    without coreutils ``timeout`` still runs the command; only the remote kill is lost.
    """
    quoted = shlex.quote(command)
    limit = f"{timeout + REMOTE_KILL_GRACE_S:.1f}"
    return (
        f"if command -v timeout >/dev/null 2>&1; then timeout -s KILL {limit} /bin/sh -c {quoted}; "
        f"else /bin/sh -c {quoted}; fi"
    )


class _Runner:
    """A long-lived ``/bin/sh`` on one exec channel that runs the commands written to its stdin, one at a time.

    Lifecycle: ``start`` opens the channel with ``exec /bin/sh`` (the login shell and its rc files run once,
    here) and waits for a first marker, which also swallows anything an rc file printed. Each ``run`` writes one
    line: the command, with stdin /dev/null and its streams in fresh files of a private folder on the host, then
    the files' contents each followed by a random marker (with the exit code on stdout). Files, not the shell's
    own streams, so a child that keeps them open cannot leak into the next command's output. A runner whose
    command timed out or whose channel broke is closed, never reused.
    """

    def __init__(self, chan: paramiko.Channel) -> None:
        self.chan = chan
        self._out = bytearray()
        self._err = bytearray()
        self._fd = chan.fileno()

    @classmethod
    def start(cls, transport: paramiko.Transport, timeout: float) -> _Runner:
        """Open the channel, start the shell and its private folder; raise ``TimeoutError`` if it is mute."""
        chan = transport.open_session(timeout=timeout)
        try:
            chan.exec_command("exec /bin/sh")
            runner = cls(chan)
            token = secrets.token_hex(16)
            chan.sendall(
                (
                    'D=$(mktemp -d "${TMPDIR:-/tmp}/campaign-run.XXXXXX") || exit 97; '
                    "trap 'rm -rf \"$D\"' EXIT; "
                    f"printf '%s:%d:\\n' {token} 0; printf '%s:\\n' {token} >&2\n"
                ).encode()
            )
            runner._collect(token, time.monotonic() + timeout)
        except BaseException:
            chan.close()
            raise
        return runner

    @property
    def alive(self) -> bool:
        """True while the shell's channel is open."""
        return not (self.chan.closed or self.chan.eof_received or self.chan.exit_status_ready())

    def run(self, inner: str, deadline: float) -> tuple[int, bytes, bytes]:
        """Run one shell line and return (exit code, stdout, stderr); ``TimeoutError`` at ``deadline``."""
        token = secrets.token_hex(16)
        line = (
            f'{{ {inner}\n}} </dev/null >"$D/o" 2>"$D/e"; c=$?; '
            f'cat "$D/o"; printf \'%s:%d:\\n\' {token} "$c"; '
            f'cat "$D/e" >&2; printf \'%s:\\n\' {token} >&2; rm -f "$D/o" "$D/e"\n'
        )
        self.chan.sendall(line.encode())
        return self._collect(token, deadline)

    def _collect(self, token: str, deadline: float) -> tuple[int, bytes, bytes]:
        out_mark = re.compile(re.escape(token.encode()) + rb":(\d+):\n")
        err_mark = token.encode() + b":\n"
        found_out: re.Match[bytes] | None = None
        err_at = -1
        while True:
            while self.chan.recv_ready():
                self._out += self.chan.recv(_READ_CHUNK)
            while self.chan.recv_stderr_ready():
                self._err += self.chan.recv_stderr(_READ_CHUNK)
            if found_out is None:
                found_out = out_mark.search(self._out)
            if err_at < 0:
                err_at = self._err.find(err_mark)
            if found_out is not None and err_at >= 0:
                break
            if self.chan.closed or self.chan.eof_received:
                raise EOFError("the remote shell ended")
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError()
            select.select([self._fd], [], [], min(remaining, 1.0))
        # Read the match before trimming: it refers into the buffer it was found in.
        code = int(found_out.group(1))
        out = bytes(self._out[: found_out.start()])
        err = bytes(self._err[:err_at])
        del self._out[: found_out.end()]
        del self._err[: err_at + len(err_mark)]
        return code, out, err

    def close(self) -> None:
        """End the shell (its EXIT trap removes the private folder)."""
        with contextlib.suppress(Exception):
            self.chan.close()


def _drain(chan: paramiko.Channel, deadline: float) -> tuple[bytes, bytes]:
    """Read stdout and stderr as they arrive until EOF; raise ``TimeoutError`` at ``deadline``.

    Both streams share the channel's flow-control window, so reading only one could stall the other forever
    on a big output. ``fileno()`` is readable when either has data, or at EOF.
    """
    out: list[bytes] = []
    err: list[bytes] = []
    fd = chan.fileno()
    while True:
        done = chan.eof_received or chan.closed
        while chan.recv_ready():
            out.append(chan.recv(_READ_CHUNK))
        while chan.recv_stderr_ready():
            err.append(chan.recv_stderr(_READ_CHUNK))
        if done:
            return b"".join(out), b"".join(err)
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError()
        select.select([fd], [], [], min(remaining, 1.0))


# ---------------------------------------------------------------------------------------------------------------------
# Connecting: ssh_config, host keys, errors


def _load_ssh_config(path: str | None) -> paramiko.SSHConfig | None:
    """The parsed ssh_config, or None. The default file may be missing; a file named on purpose may not."""
    if path is None:
        return None
    full = os.path.expanduser(path)
    if not os.path.exists(full):
        if path == DEFAULT_SSH_CONFIG:
            return None
        raise HostError(f"ssh_config file {path} does not exist", hint="fix the path, or leave ssh_config unset")
    try:
        return paramiko.SSHConfig.from_path(full)
    except (OSError, paramiko.SSHException, ValueError) as exc:
        raise HostError(f"cannot read ssh_config {path}: {exc}", hint="fix the file (see `man ssh_config`)") from exc


def _resolve(
    config: paramiko.SSHConfig | None,
    host: str,
    *,
    user: str | None,
    port: int | None,
    key_filename: str | None,
    known_hosts: str | None,
) -> _Target:
    """Apply the config's Host block for ``host``; explicit arguments win, as on the ssh command line."""
    entry: dict[str, Any] = dict(config.lookup(host)) if config is not None else {}
    hostname = str(entry.get("hostname") or host)
    raw_port: Any = port if port is not None else entry.get("port", 22)
    try:
        resolved_port = int(raw_port)
    except (TypeError, ValueError) as exc:
        raise HostError(f"bad Port {raw_port!r} for host {host}", hint="Port must be a number") from exc
    if key_filename:
        keys = [os.path.expanduser(key_filename)]
        if not os.path.exists(keys[0]):
            raise HostError(f"key file {key_filename} does not exist", hint="fix the key path")
    else:
        # OpenSSH skips IdentityFile entries that do not exist; so do we.
        keys = [os.path.expanduser(k) for k in entry.get("identityfile", []) if os.path.exists(os.path.expanduser(k))]
    kh = known_hosts
    if kh is None and entry.get("userknownhostsfile"):
        kh = str(entry["userknownhostsfile"]).split()[0]
    jumps_raw = str(entry.get("proxyjump") or "")
    jumps = [] if jumps_raw.lower() in ("", "none") else [j.strip() for j in jumps_raw.split(",") if j.strip()]
    if entry.get("proxycommand") and not jumps:
        raise HostError(
            f"host {host} uses ProxyCommand, which campaign does not run",
            hint="use ProxyJump in the ssh_config instead",
        )
    return _Target(
        alias=host,
        hostname=hostname,
        port=resolved_port,
        user=user or str(entry.get("user") or getpass.getuser()),
        key_files=keys,
        known_hosts=os.path.expanduser(kh or DEFAULT_KNOWN_HOSTS),
        jumps=jumps,
    )


def _parse_hop(text: str) -> tuple[str | None, str, int | None]:
    """``[user@]host[:port]`` (or ``ssh://...``, or ``[v6addr]:port``) of one ProxyJump hop."""
    rest = text.removeprefix("ssh://")
    user, _, hostport = rest.rpartition("@")
    port_text = ""
    if hostport.startswith("["):
        host, _, tail = hostport[1:].partition("]")
        port_text = tail.removeprefix(":")
    elif hostport.count(":") == 1:
        host, _, port_text = hostport.partition(":")
    else:
        host = hostport
    if not host or (port_text and not port_text.isdigit()):
        raise HostError(f"bad ProxyJump hop {text!r}", hint="write it as [user@]host[:port]")
    return user or None, host, int(port_text) if port_text else None


def _fingerprint(key: paramiko.PKey) -> str:
    """The key's fingerprint as OpenSSH prints it (``ED25519 SHA256:...``), to compare with ssh-keygen -l."""
    digest = base64.b64encode(hashlib.sha256(key.asbytes()).digest()).decode().rstrip("=")
    kind = key.get_name().removeprefix("ssh-").split("-")[0].upper()
    return f"{kind} SHA256:{digest}"


class _KnownHostsPolicy(paramiko.MissingHostKeyPolicy):
    """Refuse a host whose key is not known, or, with accept-new, record the key and go on."""

    def __init__(self, known_hosts: str, accept_new: bool) -> None:
        self.known_hosts = known_hosts
        self.accept_new = accept_new

    def missing_host_key(self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey) -> None:
        """Called by paramiko only when no key at all is known for ``hostname`` (a mismatch never gets here)."""
        if not self.accept_new:
            raise HostKeyError(
                f"the host key of {hostname} is not known ({_fingerprint(key)}); campaign does not trust it blindly",
                hint=(
                    f"check the fingerprint with the host's owner, then connect once with `ssh` to record it in "
                    f"{self.known_hosts}, or set accept_new_host_key: true"
                ),
            )
        line = f"{hostname} {key.get_name()} {key.get_base64()}\n"
        try:
            folder = os.path.dirname(self.known_hosts)
            if folder:
                os.makedirs(folder, mode=0o700, exist_ok=True)
            fd = os.open(self.known_hosts, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
            with os.fdopen(fd, "ab") as out:
                if out.tell() > 0 and not _ends_with_newline(self.known_hosts):
                    out.write(b"\n")
                out.write(line.encode())
        except OSError as exc:
            raise HostKeyError(
                f"cannot record the new host key of {hostname} in {self.known_hosts}: {exc.strerror or exc}",
                hint="make the known_hosts file writable, or add the key to it yourself",
            ) from exc
        client.get_host_keys().add(hostname, key.get_name(), key)


def _ends_with_newline(path: str) -> bool:
    with open(path, "rb") as src:
        src.seek(-1, os.SEEK_END)
        return src.read(1) == b"\n"


def _handshake(
    target: _Target,
    sock: paramiko.Channel | None,
    accept_new: bool,
    timeout: float,
    *,
    agent: bool,
) -> paramiko.SSHClient:
    """Open, verify and authenticate one SSH connection; every failure becomes a HostError that says what to do."""
    where = f"{target.user}@{target.hostname}:{target.port}"
    client = paramiko.SSHClient()
    try:
        if os.path.exists(SYSTEM_KNOWN_HOSTS):
            client.load_system_host_keys(SYSTEM_KNOWN_HOSTS)
        if os.path.exists(target.known_hosts):
            client.load_host_keys(target.known_hosts)
    except OSError as exc:
        raise HostKeyError(
            f"cannot read known_hosts {target.known_hosts}: {exc.strerror or exc}", hint="fix its permissions"
        ) from exc
    client.set_missing_host_key_policy(_KnownHostsPolicy(target.known_hosts, accept_new))
    started = time.monotonic()
    try:
        client.connect(
            target.hostname,
            port=target.port,
            username=target.user,
            # paramiko documents a list of key files here; types-paramiko only knows a single str.
            key_filename=target.key_files or None,  # type: ignore[arg-type]
            # An explicit key is the one to use; otherwise the agent and the default keys, as ssh does.
            allow_agent=agent,
            look_for_keys=not target.key_files,
            timeout=timeout,
            banner_timeout=timeout,
            auth_timeout=timeout,
            channel_timeout=timeout,
            sock=sock,
        )
    except HostError:
        client.close()
        raise
    except Exception as exc:
        client.close()
        raise _connect_error(exc, target, where, timeout, time.monotonic() - started) from exc
    transport = client.get_transport()
    if transport is not None and isinstance(transport.sock, socket.socket):
        with contextlib.suppress(OSError):
            transport.sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
            # Small messages (a channel open, a short request) must not wait out Nagle + delayed ACK (~40 ms).
            transport.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return client


def _connect_error(exc: Exception, target: _Target, where: str, timeout: float, elapsed: float) -> HostError:
    """The HostError for a failed connect, with the next step in its hint."""
    if isinstance(exc, paramiko.BadHostKeyException):
        return HostKeyError(
            f"the host key of {target.hostkey_name} CHANGED: known_hosts has {_fingerprint(exc.expected_key)}, "
            f"the host offered {_fingerprint(exc.key)}. This can be a reinstalled host or an attack; refusing.",
            hint=(
                "if the change is expected, remove the old key with "
                f"`ssh-keygen -R '{target.hostkey_name}' -f {target.known_hosts}` and connect again"
            ),
        )
    if isinstance(exc, paramiko.PasswordRequiredException):
        return HostError(
            f"{where}: the private key is protected by a passphrase",
            hint="load it into the ssh-agent with `ssh-add`, and leave the key unset",
        )
    if isinstance(exc, paramiko.AuthenticationException):
        keys = ", ".join(target.key_files) or "the ssh-agent and ~/.ssh/id_*"
        return HostError(
            f"{where}: authentication failed (tried {keys})",
            hint="check the user and key (IdentityFile), and that the public key is in the host's authorized_keys",
        )
    if isinstance(exc, TimeoutError):
        return HostTimeout(
            f"{where}: no answer within {timeout:g} s", hint="check that the host is up and the port is right"
        )
    if isinstance(exc, paramiko.SSHException | EOFError):
        text = str(exc) or type(exc).__name__
        # paramiko gives up on a mute server with "No existing session" once the timeout has passed.
        if "timeout" in text.lower() or "timed out" in text.lower() or elapsed >= timeout:
            return HostTimeout(f"{where}: the SSH handshake took over {timeout:g} s: {text}")
        return HostError(
            f"{where}: the SSH handshake failed: {text}", hint="is an SSH server listening there (not another service)?"
        )
    if isinstance(exc, socket.gaierror):
        return HostError(
            f"cannot resolve host name {target.hostname}: {exc.strerror}",
            hint="check the name, or the HostName of the Host block in the ssh_config",
        )
    if isinstance(exc, ConnectionRefusedError | paramiko.ssh_exception.NoValidConnectionsError):
        return HostError(
            f"{where}: connection refused", hint="is sshd running there, and is the port right (Port / port:)?"
        )
    if isinstance(exc, OSError):
        return HostError(f"{where}: cannot connect: {exc.strerror or exc}", hint="check the network path to the host")
    return HostError(f"{where}: cannot connect: {type(exc).__name__}: {exc}")


def _sftp_reason(exc: OSError) -> str:
    """The readable part of an SFTP error (paramiko puts the server's text in strerror or args)."""
    return str(exc.strerror or (exc.args[-1] if exc.args else exc))
