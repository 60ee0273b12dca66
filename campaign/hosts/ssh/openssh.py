"""What OpenSSH's own client makes of a host: ``ssh -G`` read into a ``Hop``.

Reading ``~/.ssh/config`` the way ``ssh`` does (``Include``, ``Match`` with every criterion, ``%`` tokens,
``/etc/ssh/ssh_config``, first value wins) is OpenSSH's job, so campaign asks it: ``ssh -G HOST`` prints the
configuration it would use, without connecting. The rule users rely on follows from it: if ``ssh -G HOST``
resolves a host and ``ssh HOST true`` works, campaign reaches it, or says which directive it cannot honour.

Where no OpenSSH client is installed, ``target.resolve`` (paramiko's reader) is the fallback.
"""

from __future__ import annotations

import getpass
import os
import shutil
import socket
import subprocess

from campaign.errors import HostError
from campaign.hosts.ssh.target import DEFAULT_KNOWN_HOSTS, DEFAULT_SSH_CONFIG, Hop, split_jumps

#: Seconds ``ssh -G`` may take (a ``Match exec`` in the config runs commands).
RESOLVE_TIMEOUT_S = 20.0

#: Directives that change how the connection is made and that campaign cannot honour, with what to write instead.
UNSUPPORTED = {
    "proxyusefdpass": ("yes", "remove ProxyUseFdpass (campaign speaks to the ProxyCommand over its stdin/stdout)"),
}


def ssh_client() -> str | None:
    """The OpenSSH client's path, or None."""
    return shutil.which("ssh")


def openssh_config(
    ssh: str,
    config_path: str,
    host: str,
    *,
    user: str | None,
    port: int | None,
) -> dict[str, list[str]]:
    """``ssh -G`` for ``host``: each keyword (lower case) with its values, in the order ssh printed them."""
    argv = [ssh, "-G"]
    if config_path != DEFAULT_SSH_CONFIG:
        # ssh -F reads only that file, as `ssh -F FILE HOST` would; the default reads ~/.ssh/config and the
        # system file, as plain `ssh HOST` does.
        argv += ["-F", os.path.expanduser(config_path)]
    if user:
        argv += ["-l", user]
    if port is not None:
        argv += ["-p", str(port)]
    argv += ["--", host]
    try:
        done = subprocess.run(
            argv, capture_output=True, text=True, timeout=RESOLVE_TIMEOUT_S, stdin=subprocess.DEVNULL, check=False
        )
    except subprocess.TimeoutExpired as exc:
        raise HostError(
            f"`ssh -G {host}` did not answer within {RESOLVE_TIMEOUT_S:g} s",
            hint="a Match exec in the ssh_config may hang; run `ssh -G` yourself to see",
        ) from exc
    except OSError as exc:
        raise HostError(f"cannot run {ssh}: {exc.strerror or exc}", hint="check the OpenSSH client") from exc
    if done.returncode != 0:
        detail = " ".join(done.stderr.split())[:500] or f"exit status {done.returncode}"
        raise HostError(
            f"OpenSSH cannot read the ssh_config for {host}: {detail}",
            hint="fix the file as `ssh -G HOST` reports it (see `man ssh_config`)",
        )
    values: dict[str, list[str]] = {}
    for line in done.stdout.splitlines():
        key, _, value = line.partition(" ")
        if key:
            values.setdefault(key.lower(), []).append(value.strip())
    return values


def _first(values: dict[str, list[str]], key: str) -> str | None:
    found = values.get(key)
    return found[0] if found else None


def _expand_path(path: str, *, host: str, user: str, alias: str) -> str:
    """A file name from the config with ``~`` and the tokens OpenSSH allows in file names expanded."""
    return os.path.expanduser(
        expand_tokens(path, hostname=host, port=0, user=user, alias=alias, what="a file name in the ssh_config")
    )


def expand_tokens(text: str, *, hostname: str, port: int, user: str, alias: str, what: str) -> str:
    """OpenSSH's ``%`` tokens in ``text``: %% %h %p %r %n %u %d %l %L; any other is refused with what to write."""
    local_host = socket.gethostname()
    table = {
        "%": "%",
        "h": hostname,
        "p": str(port),
        "r": user,
        "n": alias,
        "u": getpass.getuser(),
        "d": os.path.expanduser("~"),
        "l": local_host,
        "L": local_host.split(".")[0],
    }
    out: list[str] = []
    i = 0
    while i < len(text):
        ch = text[i]
        if ch != "%":
            out.append(ch)
            i += 1
            continue
        token = text[i + 1 : i + 2]
        if token not in table:
            raise HostError(
                f"{what} uses the token %{token}, which campaign does not expand: {text}",
                hint="write the value itself instead of the token (campaign expands %% %h %p %r %n %u %d %l %L)",
            )
        out.append(table[token])
        i += 2
    return "".join(out)


def resolve_openssh(
    ssh: str,
    config_path: str,
    host: str,
    *,
    user: str | None,
    port: int | None,
    key_filename: str | None,
    known_hosts: str | None,
) -> Hop:
    """The hop ``ssh HOST`` would connect to, from ``ssh -G``; explicit values win, as on ssh's command line."""
    values = openssh_config(ssh, config_path, host, user=user, port=port)
    for key, (bad, instead) in UNSUPPORTED.items():
        if (_first(values, key) or "").lower() == bad:
            raise HostError(f"host {host}: the ssh_config sets {key} {bad}, which campaign cannot honour", hint=instead)
    hostname = _first(values, "hostname") or host
    raw_port = _first(values, "port") or "22"
    if not raw_port.isdigit():
        raise HostError(f"bad Port {raw_port!r} for host {host}", hint="Port must be a number")
    the_user = _first(values, "user") or user or getpass.getuser()
    if key_filename:
        keys = [os.path.expanduser(key_filename)]
        if not os.path.exists(keys[0]):
            raise HostError(f"key file {key_filename} does not exist", hint="fix the key path")
    else:
        # ssh -G lists the default keys too; OpenSSH skips the files that do not exist, and so do we.
        named = (_expand_path(k, host=hostname, user=the_user, alias=host) for k in values.get("identityfile", []))
        keys = [k for k in named if os.path.exists(k)]
    certificates = [
        path
        for path in (
            _expand_path(c, host=hostname, user=the_user, alias=host) for c in values.get("certificatefile", [])
        )
        if os.path.exists(path)
    ]
    kh = known_hosts
    if kh is None and values.get("userknownhostsfile"):
        kh = values["userknownhostsfile"][0].split()[0]
    jumps = split_jumps(_first(values, "proxyjump") or "")
    proxy = _first(values, "proxycommand")
    agent = _first(values, "identityagent")
    return Hop(
        alias=host,
        hostname=hostname,
        port=int(raw_port),
        user=the_user,
        key_files=tuple(keys),
        known_hosts=os.path.expanduser(kh or DEFAULT_KNOWN_HOSTS),
        jumps=tuple(jumps),
        proxy_command=None if jumps or not proxy or proxy.lower() == "none" else proxy,
        certificate_files=tuple(certificates),
        identity_agent=None
        if agent is None or agent.upper() == "SSH_AUTH_SOCK"
        else _expand_path(agent, host=hostname, user=the_user, alias=host),
    )
