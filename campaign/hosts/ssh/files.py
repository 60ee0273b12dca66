"""Files on an SSH host: one persistent SFTP session per host, shared under a lock.

Writes are atomic (a temp file with its mode set before any data lands, then renamed); reads take a byte range, so
a log is followed without re-reading it. After a timeout the session's request/response pairing cannot be
trusted, so it is dropped and the next call opens a new one.
"""

from __future__ import annotations

import contextlib
import errno
import secrets
import threading
from collections.abc import Callable

import paramiko

from campaign.errors import HostError, HostTimeout
from campaign.hosts.ssh.connect import lost, open_channel


class RemoteFiles:
    """The SFTP side of one host: ``write`` and ``read`` over a session opened on first use."""

    def __init__(self, name: str, user: str, transport: Callable[[], paramiko.Transport]) -> None:
        self._name = name
        self._user = user
        self._transport = transport
        #: Timeout of each SFTP request (the protocol gives them none).
        self.timeout = 30.0
        self._sftp: paramiko.SFTPClient | None = None
        self._lock = threading.Lock()

    def write(self, path: str, data: bytes, *, mode: int = 0o600) -> None:
        """Create or replace ``path`` with ``data`` and ``mode`` over SFTP (atomically: a temp file, renamed)."""
        tmp = f"{path}.tmp-{secrets.token_hex(4)}"
        with self._lock:
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
                self.drop_locked()
                raise HostTimeout(f"{self._name}: writing {path} ran past {self.timeout:g} s") from exc
            except OSError as exc:
                with contextlib.suppress(OSError, paramiko.SSHException, EOFError):
                    sftp.remove(tmp)
                raise HostError(
                    f"{self._name}: cannot write {path}: {_sftp_reason(exc)}",
                    hint="the parent folder must exist and be writable by " + self._user,
                ) from exc
            except (paramiko.SSHException, EOFError) as exc:
                self.drop_locked()
                raise lost(self._name, exc, f"write {path}") from exc
            except BaseException:
                # Cut mid-request (an interruption): the session's request/response pairing is no longer known.
                self.drop_locked()
                raise

    def read(self, path: str, offset: int, limit: int | None) -> bytes:
        """Bytes of ``path`` from ``offset``, at most ``limit``; ``b""`` when missing or shorter (one attempt)."""
        with self._lock:
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
                self.drop_locked()
                raise HostTimeout(f"{self._name}: reading {path} ran past {self.timeout:g} s") from exc
            except OSError as exc:
                raise HostError(f"{self._name}: cannot read {path}: {_sftp_reason(exc)}") from exc
            except (paramiko.SSHException, EOFError) as exc:
                self.drop_locked()
                raise lost(self._name, exc, f"read {path}") from exc
            except BaseException:
                self.drop_locked()  # cut mid-request, as in write
                raise

    def _sftp_session(self) -> paramiko.SFTPClient:
        """The persistent SFTP session, opened on first use (caller holds the lock)."""
        if self._sftp is not None and not self._sftp.sock.closed:
            return self._sftp
        chan = open_channel(self._name, lambda t: self._transport().open_session(timeout=t), self.timeout, "open SFTP")
        try:
            chan.invoke_subsystem("sftp")
            sftp = paramiko.SFTPClient(chan)
        except (paramiko.SSHException, EOFError, OSError) as exc:
            chan.close()
            raise HostError(
                f"{self._name}: the SFTP subsystem is not available: {exc}",
                hint="enable `Subsystem sftp` in the host's sshd_config",
            ) from exc
        chan.settimeout(self.timeout)
        self._sftp = sftp
        return sftp

    def drop_locked(self) -> None:
        """Forget the SFTP session: after a timeout its request/response pairing can no longer be trusted."""
        if self._sftp is not None:
            with contextlib.suppress(Exception):
                self._sftp.close()
            self._sftp = None

    def drop(self) -> None:
        """Forget the session (after a reconnect, or at close)."""
        with self._lock:
            self.drop_locked()


def _sftp_reason(exc: OSError) -> str:
    """The readable part of an SFTP error (paramiko puts the server's text in strerror or args)."""
    return str(exc.strerror or (exc.args[-1] if exc.args else exc))
