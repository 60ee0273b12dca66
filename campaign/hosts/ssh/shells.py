"""Running commands on an SSH host: a pool of long-lived remote shells, and an exec channel per command as fallback.

A login shell and its rc files cost tens of milliseconds to start on a typical host; a liveness poll every few
hundred milliseconds cannot pay that each time. ``ShellPool`` keeps up to ``MAX_SHELLS`` ``RemoteShell`` values
(each holds one SSH session; sshd's MaxSessions, 10 by default, also counts SFTP) and hands one to each command.
Every command is wrapped by ``wrap_command`` so the host kills it (group and all) shortly after the local deadline.
"""

from __future__ import annotations

import contextlib
import re
import secrets
import select
import shlex
import threading
import time
from collections.abc import Callable

import paramiko

from campaign.errors import HostError
from campaign.hosts.base import short_command

#: The remote ``timeout`` kill fires this long after the local deadline, so the local HostTimeout comes first.
REMOTE_KILL_GRACE_S = 1.0
#: Long-lived remote shells per host; more concurrent commands wait for one (sshd's MaxSessions is 10).
MAX_SHELLS = 6
#: How long a new remote shell may take to start (the login shell's rc files run then).
SHELL_START_S = 15.0
_READ_CHUNK = 1 << 16


def wrap_command(command: str, timeout: float) -> str:
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


class RemoteShell:
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
    def start(cls, transport: paramiko.Transport, timeout: float) -> RemoteShell:
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


class ShellPool:
    """Command slots of one host: idle remote shells for reuse, and a count of the sessions commands hold.

    Lifecycle: empty at first; ``take`` hands out an idle shell, starts a new one, or (when shells are off or do not
    work on this host) grants a slot for an exec channel; ``release`` keeps a healthy shell for the next command and
    retires a broken one. ``retire_locked`` drops the idle shells (after a reconnect, or with ``closing`` at the
    host's close, after which nothing is kept). The lock is the host's state lock, so a slot, the host's open check
    and a reconnect's swap are decided together.
    """

    def __init__(
        self,
        lock: threading.Lock,
        transport: Callable[[], paramiko.Transport],
        check_open_locked: Callable[[], None],
    ) -> None:
        #: Signalled when a command slot frees up.
        self._free = threading.Condition(lock)
        self._transport = transport
        self._check_open_locked = check_open_locked
        self._idle: list[RemoteShell] = []
        self._slots = 0  # commands in flight plus idle shells: each holds one SSH session
        self._closed = False
        #: Run commands in long-lived remote shells (fast); False: one exec channel per command, which pays
        #: the login shell's rc files every time but keeps no shell open on the host.
        self.persistent = True
        #: False once a shell failed to start on this host (until a reconnect).
        self._works = True

    def take(self, deadline: float) -> RemoteShell | None:
        """A command slot: an idle or new remote shell, or None to use an exec channel; waits up to ``deadline``.

        At most ``MAX_SHELLS`` commands hold a session at once; past that the caller waits for a slot.
        """
        with self._free:
            while True:
                self._check_open_locked()
                while self._idle and not self.persistent:
                    self._idle.pop().close()  # switched off since they were started
                    self._slots -= 1
                while self._idle:
                    shell = self._idle.pop()
                    if shell.alive:
                        return shell
                    shell.close()
                    self._slots -= 1
                if self._slots < MAX_SHELLS:
                    self._slots += 1
                    break
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError(f"all {MAX_SHELLS} command slots stayed busy")
                self._free.wait(remaining)
            if not self.persistent or not self._works:
                return None
        try:
            return RemoteShell.start(self._transport(), min(SHELL_START_S, max(0.1, deadline - time.monotonic())))
        except (TimeoutError, paramiko.SSHException, EOFError, OSError):
            with self._free:
                # A login shell that does not answer a plain printf (an rc file reading stdin, a restricted
                # shell): stop trying and use one exec channel per command on this host.
                self._works = False
            return None

    def release(self, shell: RemoteShell | None) -> None:
        """Free a command slot: keep a healthy shell for the next command, retire a broken one."""
        with self._free:
            if shell is not None and not self._closed and shell.alive:
                self._idle.append(shell)
            else:
                if shell is not None:
                    shell.close()
                self._slots -= 1
            self._free.notify()

    def retire_locked(self, *, closing: bool) -> list[RemoteShell]:
        """Drop the idle shells (the caller holds the lock and closes them); wake every waiter.

        ``closing``: the host is closing and keeps nothing from now on; otherwise a reconnect gives shells
        another try on the new connection.
        """
        stale, self._idle = self._idle, []
        self._slots -= len(stale)
        if closing:
            self._closed = True
        else:
            self._works = True
        self._free.notify_all()
        return stale


def run_on_exec_channel(
    name: str, chan: paramiko.Channel, command: str, timeout: float, deadline: float
) -> tuple[int, bytes, bytes]:
    """Run one command on its own exec channel (the fallback: pays the login shell's start every time)."""
    try:
        chan.exec_command(f"exec /bin/sh -c {shlex.quote(wrap_command(command, timeout))}")
        chan.shutdown_write()
        out, err = _drain(chan, deadline)
        if not chan.status_event.wait(max(0.0, deadline - time.monotonic())):
            raise TimeoutError()
        if chan.exit_status < 0:
            raise HostError(
                f"{name}: the command ended without an exit status (was the connection cut?): {short_command(command)}"
            )
        return chan.exit_status, out, err
    finally:
        chan.close()


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
