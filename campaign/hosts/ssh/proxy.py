"""A ProxyCommand as OpenSSH runs it: the user's shell runs it, the SSH connection flows over its stdin/stdout.

OpenSSH runs ``exec COMMAND`` through ``$SHELL -c`` with the ``%`` tokens expanded, and speaks SSH over the
command's standard input and output (``ssh -W %h:%p bastion``, ``aws ssm start-session ...``, ``cloudflared access
ssh ...``, ``gcloud compute start-iap-tunnel ...``). campaign does the same, over one end of a socket pair, so that
paramiko sees a real socket (timeouts and keepalives work as on TCP). The command's standard error is kept (the
last lines) for the message when the connection fails: a proxy that cannot reach the box says why there.

The command runs in its own session, so a Ctrl-C at the terminal does not cut the connection campaign still needs
to put the box back; closing the ``Proxy`` ends it (it is our child: we started it).
"""

from __future__ import annotations

import collections
import contextlib
import os
import signal
import socket
import subprocess
import threading

from campaign.errors import HostError

#: Lines of the command's standard error kept for messages.
STDERR_LINES = 20
#: Seconds the command gets to exit after its socket is closed, before it is killed.
STOP_GRACE_S = 2.0


class Proxy:
    """One running ProxyCommand and our end of the socket it speaks SSH over."""

    def __init__(self, command: str, name: str) -> None:
        self.command = command
        self.name = name
        ours, theirs = socket.socketpair()
        shell = os.environ.get("SHELL") or "/bin/sh"
        try:
            self.process = subprocess.Popen(
                [shell, "-c", f"exec {command}"],
                stdin=theirs.fileno(),
                stdout=theirs.fileno(),
                stderr=subprocess.PIPE,
                start_new_session=True,
            )
        except OSError as exc:
            ours.close()
            raise HostError(
                f"{name}: cannot start the ProxyCommand with {shell}: {exc.strerror or exc}",
                hint="check the SHELL variable and the ProxyCommand in the ssh_config",
            ) from exc
        finally:
            theirs.close()
        self.sock = ours
        self._stderr: collections.deque[str] = collections.deque(maxlen=STDERR_LINES)
        self._reader = threading.Thread(target=self._read_stderr, name=f"proxy-stderr {name}", daemon=True)
        self._reader.start()

    def _read_stderr(self) -> None:
        stream = self.process.stderr
        if stream is None:
            return
        with stream:
            for raw in iter(stream.readline, b""):
                line = raw.decode(errors="replace").rstrip()
                if line:
                    self._stderr.append(line[:500])

    def diagnosis(self) -> str:
        """What the command said and how it ended, for an error message (waits briefly for it to finish)."""
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=0.5)
        self._reader.join(timeout=0.5)
        status = self.process.poll()
        ended = "still running" if status is None else f"exited with status {status}"
        said = " | ".join(self._stderr) or "nothing on its stderr"
        return f"the ProxyCommand `{self.command}` {ended}; it said: {said}"

    def close(self) -> None:
        """Close our end of the socket; the command ends on its EOF, or is ended after a grace period."""
        with contextlib.suppress(OSError):
            self.sock.close()
        if self.process.poll() is None:
            try:
                self.process.wait(timeout=STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                # Our own child, in its own session: its group is ours to end.
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(self.process.pid, signal.SIGTERM)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self.process.wait(timeout=STOP_GRACE_S)
                if self.process.poll() is None:
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.killpg(self.process.pid, signal.SIGKILL)
                    self.process.wait()
