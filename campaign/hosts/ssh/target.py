"""Where an SSH host is: the target as asked for, and each hop as the ssh_config resolves it.

``SSHTarget`` is the one value the rest of the package passes around (frozen: a reconnect opens the same target
again). ``resolve`` applies the ssh_config to one hop with paramiko's reader, explicit values winning over the config
as on the ssh command line: the fallback where no OpenSSH client is installed (``openssh.resolve_openssh`` asks
``ssh -G`` otherwise); ``parse_hop`` reads one ProxyJump entry.
"""

from __future__ import annotations

import getpass
import os
from dataclasses import dataclass
from typing import Any

import paramiko

from campaign.errors import HostError

DEFAULT_SSH_CONFIG = "~/.ssh/config"
DEFAULT_KNOWN_HOSTS = "~/.ssh/known_hosts"


@dataclass(frozen=True)
class SSHTarget:
    """An SSH host as an experiment (or a caller) names it; None leaves a value to the ssh_config and defaults.

    ``host`` is a name, an address or a Host alias of ``ssh_config``. Without ``key``, the config's IdentityFile
    keys, the ssh-agent and the default ~/.ssh keys are tried. ``known_hosts`` defaults to the config's
    UserKnownHostsFile, else ~/.ssh/known_hosts. ``accept_new_host_key`` records a key seen for the first time
    (OpenSSH's accept-new); a changed key is always refused.
    """

    host: str
    user: str | None = None
    port: int | None = None
    key: str | None = None
    known_hosts: str | None = None
    accept_new_host_key: bool = False
    ssh_config: str | None = DEFAULT_SSH_CONFIG
    connect_timeout: float = 10.0


@dataclass(frozen=True)
class Hop:
    """Where one SSH hop goes, with ~/.ssh/config applied and explicit values winning over it."""

    alias: str
    hostname: str
    port: int
    user: str
    key_files: tuple[str, ...]
    known_hosts: str
    #: ``[user@]host[:port]`` hops, first hop first; empty for a direct connection.
    jumps: tuple[str, ...] = ()
    #: The ProxyCommand that carries the connection (tokens not yet expanded); None for a direct one.
    proxy_command: str | None = None
    #: CertificateFile entries that exist: certificates for the identity keys.
    certificate_files: tuple[str, ...] = ()
    #: IdentityAgent: the agent socket to use instead of $SSH_AUTH_SOCK, or "none" for no agent.
    identity_agent: str | None = None

    @property
    def name(self) -> str:
        """``user@hostname:port``, as messages name the host."""
        return f"{self.user}@{self.hostname}:{self.port}"

    @property
    def hostkey_name(self) -> str:
        """The name OpenSSH files this host's key under in known_hosts."""
        return self.hostname if self.port == 22 else f"[{self.hostname}]:{self.port}"


def load_ssh_config(path: str | None) -> paramiko.SSHConfig | None:
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


def resolve(
    config: paramiko.SSHConfig | None,
    host: str,
    *,
    user: str | None,
    port: int | None,
    key_filename: str | None,
    known_hosts: str | None,
) -> Hop:
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
    jumps = split_jumps(str(entry.get("proxyjump") or ""))
    proxy = str(entry.get("proxycommand") or "")
    return Hop(
        alias=host,
        hostname=hostname,
        port=resolved_port,
        user=user or str(entry.get("user") or getpass.getuser()),
        key_files=tuple(keys),
        known_hosts=os.path.expanduser(kh or DEFAULT_KNOWN_HOSTS),
        jumps=tuple(jumps),
        # paramiko's reader has already expanded the tokens; a literal % left must survive our expansion.
        proxy_command=None if jumps or proxy.lower() in ("", "none") else proxy.replace("%", "%%"),
    )


def split_jumps(text: str) -> list[str]:
    """The hops of a ProxyJump value (``none`` and empty: a direct connection)."""
    return [] if text.strip().lower() in ("", "none") else [j.strip() for j in text.split(",") if j.strip()]


def parse_hop(text: str) -> tuple[str | None, str, int | None]:
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
