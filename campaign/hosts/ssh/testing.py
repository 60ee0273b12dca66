"""A real OpenSSH sshd on 127.0.0.1 with throwaway host and client keys: what the SSH host is tested against.

``start_test_sshd(root)`` starts one and returns an ``SSHServer`` describing it: ``host``, ``port``, ``user``,
``client_key``, ``known_hosts`` (holds the right host key), ``ssh_config`` (Host ``campaign-test`` with HostName,
Port, User, IdentityFile, UserKnownHostsFile), ``jump_ssh_config`` (also Host ``campaign-test-via-jump``: the same
sshd reached through a ProxyJump via ``campaign-test``), ``host_public_key`` and the sshd ``log``.
``cut_connections`` ends its per-connection processes, as a network drop would.

An experiment's ``host:`` section that points at this sshd is ``server.host_config()``::

    host:
      kind: ssh
      host: 127.0.0.1
      port: <server.port>
      user: <server.user>
      key: <server.client_key>
      known_hosts: <server.known_hosts>
      ssh_config: null        # the developer's ~/.ssh/config must not change what the tests reach

The "remote" is this machine, as ``server.user``: files and servers there are visible locally too.

sshd runs from its own sshd_config in a tmp folder (UsePAM no, StrictModes no, PidFile/AuthorizedKeysFile/HostKey
in tmp, ListenAddress 127.0.0.1), so it works as root (CI) and as a normal user.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import pwd
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from campaign.hosts.ssh.host import SSHHost
from campaign.hosts.ssh.target import SSHTarget

ALIAS = "campaign-test"
JUMP_ALIAS = "campaign-test-via-jump"
_SEARCH_PATH = "/usr/sbin:/usr/bin:/sbin:/bin:/usr/local/sbin:/usr/local/bin"


@dataclass(frozen=True)
class SSHServer:
    """A running test sshd and everything needed to reach it."""

    host: str
    port: int
    user: str
    client_key: Path
    known_hosts: Path
    ssh_config: Path
    jump_ssh_config: Path
    host_public_key: str
    log: Path
    root: Path
    alias: str = ALIAS
    jump_alias: str = JUMP_ALIAS

    @property
    def known_hosts_line(self) -> str:
        """The known_hosts line OpenSSH writes for this server (non-default port: ``[host]:port``)."""
        return f"[{self.host}]:{self.port} {self.host_public_key}"

    def host_config(self) -> dict[str, Any]:
        """An experiment's ``host:`` section (as a dict) that reaches this sshd."""
        return {
            "kind": "ssh",
            "host": self.host,
            "port": self.port,
            "user": self.user,
            "key": str(self.client_key),
            "known_hosts": str(self.known_hosts),
            "ssh_config": None,
        }

    def target(self, **overrides: Any) -> SSHTarget:
        """The ``SSHTarget`` that reaches this sshd directly (keyword arguments override its fields)."""
        direct = SSHTarget(
            host=self.host,
            user=self.user,
            port=self.port,
            key=str(self.client_key),
            known_hosts=str(self.known_hosts),
            ssh_config=None,
        )
        return dataclasses.replace(direct, **overrides)

    def connect(self, **overrides: Any) -> SSHHost:
        """An SSHHost connected straight to this sshd (keyword arguments override the target's fields)."""
        return SSHHost.open(self.target(**overrides))

    def accepted_logins(self) -> list[str]:
        """The sshd log's "Accepted publickey" lines so far: one per authenticated connection."""
        return [line for line in self.log.read_text(errors="replace").splitlines() if "Accepted publickey" in line]


class ToolMissing(RuntimeError):
    """An OpenSSH program the test sshd needs is not installed."""


def find_tool(name: str) -> str:
    """The path of an OpenSSH program (sshd, ssh-keygen, ...), also looked for in the sbin folders."""
    path = shutil.which(name, path=_SEARCH_PATH)
    if path is None:
        raise ToolMissing(
            f"OpenSSH `{name}` is not installed, and the SSH tests need a real sshd: run `make sshd-deps`"
        )
    return path


def _keygen(keygen: str, path: Path, comment: str) -> str:
    subprocess.run(
        [keygen, "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)],
        check=True,
        capture_output=True,
        timeout=30,
    )
    kind, blob = Path(f"{path}.pub").read_text().split()[0:2]
    return f"{kind} {blob}"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _banner(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1) as s:
            return s.recv(64).startswith(b"SSH-")
    except OSError:
        return False


def _sshd_config(root: Path, port: int, extra: str = "") -> str:
    return (
        extra
        + f"""\
Port {port}
ListenAddress 127.0.0.1
AddressFamily inet
HostKey {root}/host_ed25519
PidFile {root}/sshd.pid
AuthorizedKeysFile {root}/authorized_keys
UsePAM no
StrictModes no
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
PermitRootLogin prohibit-password
AllowTcpForwarding yes
Subsystem sftp internal-sftp
LogLevel INFO
PrintMotd no
PrintLastLog no
UseDNS no
"""
    )


def _start(sshd_bin: str, root: Path, extra: str = "", port: int | None = None) -> tuple[subprocess.Popen[bytes], int]:
    """Start sshd on a free port (or ``port``); a lost race for a free port is retried on another one."""
    log = root / "sshd.log"
    last = ""
    for _ in range(5):
        port = port or _free_port()
        config = root / "sshd_config"
        config.write_text(_sshd_config(root, port, extra))
        proc = subprocess.Popen(
            [sshd_bin, "-D", "-e", "-f", str(config), "-E", str(log)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and proc.poll() is None:
            if _banner(port):
                return proc, port
            time.sleep(0.05)
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        proc.wait(timeout=5)
        last = log.read_text(errors="replace") if log.exists() else ""
        port = None
    raise RuntimeError(f"the test sshd did not start; its log:\n{last}")


def start_test_sshd(root: Path, extra_config: str = "") -> tuple[SSHServer, subprocess.Popen[bytes]]:
    """Start a throwaway sshd under ``root`` (keys, config, known_hosts there); the caller terminates the process.

    Used by the tests' ``sshd`` fixture and by scripts that measure the loop over real SSH (scripts/loop_lag.py).
    ``extra_config`` goes first in its sshd_config (sshd takes the first value of a keyword), e.g.
    ``TrustedUserCAKeys``. Raises ``ToolMissing`` when OpenSSH is not installed.
    """
    sshd_bin = find_tool("sshd")
    keygen = find_tool("ssh-keygen")
    if os.geteuid() == 0:
        # Debian's sshd refuses to start as root without its privilege-separation folder.
        with contextlib.suppress(OSError):
            os.makedirs("/run/sshd", mode=0o755, exist_ok=True)
    host_public = _keygen(keygen, root / "host_ed25519", "campaign-test-host")
    client_key = root / "client_ed25519"
    _keygen(keygen, client_key, "campaign-test-client")
    (root / "authorized_keys").write_text(Path(f"{client_key}.pub").read_text())
    user = pwd.getpwuid(os.geteuid()).pw_name

    proc, port = _start(sshd_bin, root, extra_config)
    known_hosts = root / "known_hosts"
    known_hosts.write_text(f"[127.0.0.1]:{port} {host_public}\n")
    block = (
        f"Host {ALIAS}\n    HostName 127.0.0.1\n    Port {port}\n    User {user}\n"
        f"    IdentityFile {client_key}\n    UserKnownHostsFile {known_hosts}\n"
    )
    ssh_config = root / "ssh_config"
    ssh_config.write_text(block)
    jump_config = root / "ssh_config_jump"
    jump_config.write_text(
        block + f"\nHost {JUMP_ALIAS}\n    HostName 127.0.0.1\n    Port {port}\n    User {user}\n"
        f"    IdentityFile {client_key}\n    UserKnownHostsFile {known_hosts}\n    ProxyJump {ALIAS}\n"
    )
    server = SSHServer(
        host="127.0.0.1",
        port=port,
        user=user,
        client_key=client_key,
        known_hosts=known_hosts,
        ssh_config=ssh_config,
        jump_ssh_config=jump_config,
        host_public_key=host_public,
        log=root / "sshd.log",
        root=root,
    )
    return server, proc


def restart_test_sshd(server: SSHServer, proc: subprocess.Popen[bytes]) -> subprocess.Popen[bytes]:
    """Restart a test sshd as an admin would: every connection cut, the daemon stopped, started again on its port."""
    cut_connections(proc.pid)
    proc.terminate()
    proc.wait(timeout=10)
    sshd_bin = find_tool("sshd")
    config = server.root / "sshd_config"
    new = subprocess.Popen(
        [sshd_bin, "-D", "-e", "-f", str(config), "-E", str(server.log)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and new.poll() is None:
        if _banner(server.port):
            return new
        time.sleep(0.05)
    raise RuntimeError(f"the test sshd did not come back on port {server.port}")


def cut_connections(sshd_pid: int) -> int:
    """Kill every per-connection process of one sshd, as a network drop would end them; returns how many.

    Call it while the sshd itself still runs: its children are found by their parent PID.
    """
    killed = 0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == sshd_pid:
            try:
                os.kill(int(stat.parent.name), signal.SIGKILL)
                killed += 1
            except ProcessLookupError:
                pass
    return killed
