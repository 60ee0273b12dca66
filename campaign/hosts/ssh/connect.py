"""Connecting: one authenticated, host-key-verified SSH connection per hop, the ProxyJump chain first.

``Connector(target).open()`` returns a ``Link``; calling it again opens the same target again (a reconnect, which may
pass a shorter ``timeout`` than the target's connect timeout: the time left of its budget). Every
paramiko and socket failure is mapped here to ``HostError`` / ``HostKeyError`` / ``HostTimeout`` with a hint that
says what to do, and so are failures to open a channel on a link (``open_channel``).
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import hashlib
import os
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass

import paramiko

from campaign.errors import HostError, HostKeyError, HostTimeout
from campaign.hosts.ssh.openssh import expand_tokens, resolve_openssh, ssh_client
from campaign.hosts.ssh.proxy import Proxy
from campaign.hosts.ssh.target import DEFAULT_SSH_CONFIG, Hop, SSHTarget, load_ssh_config, parse_hop, resolve

SYSTEM_KNOWN_HOSTS = "/etc/ssh/ssh_known_hosts"
#: Seconds between keepalive messages on the transport: a NAT or firewall does not drop an idle campaign.
KEEPALIVE_S = 15
#: A ProxyJump chain longer than this is taken for a loop in the config.
MAX_JUMPS = 8


class Link:
    """One open SSH connection (client and transport) to one hop, and the jump host's link or proxy it goes through."""

    def __init__(self, hop: Hop, client: paramiko.SSHClient, via: Link | None, proxy: Proxy | None = None) -> None:
        self.hop = hop
        self.client = client
        self.via = via
        self.proxy = proxy
        self.name = hop.name
        transport = client.get_transport()
        if transport is None:  # connect() returned, so this is a paramiko invariant, not a user error
            raise HostError(f"{self.name}: the SSH transport vanished right after connecting")
        transport.set_keepalive(KEEPALIVE_S)
        self.transport = transport

    def open_direct(self, hostname: str, port: int, timeout: float) -> paramiko.Channel:
        """A direct-tcpip channel to ``hostname:port`` as seen from this host (the next ProxyJump hop)."""
        return open_channel(
            self.name,
            lambda t: self.transport.open_channel("direct-tcpip", (hostname, port), ("127.0.0.1", 0), timeout=t),
            timeout,
            f"open a tunnel to {hostname}:{port}",
            refused_hint="check the HostName and Port of the target as the jump host sees them, and AllowTcpForwarding",
        )

    def close(self) -> None:
        """Close this connection, then the jump host's or the ProxyCommand."""
        self.client.close()
        if self.proxy is not None:
            self.proxy.close()
        if self.via is not None:
            self.via.close()


@dataclass(frozen=True)
class _Request:
    """One hop as asked for: what resolving it through the ssh_config starts from."""

    host: str
    user: str | None
    port: int | None
    key_filename: str | None
    #: The target's key, tried on a jump host whose config names none.
    fallback_key: str | None
    #: None: the hop's own ProxyJump applies; otherwise the rest of a chain named further out.
    jumps: tuple[str, ...] | None
    depth: int


class Connector:
    """Opens ``target`` (its ProxyJump hosts or ProxyCommand first); ``open`` again to reconnect the same way.

    Each hop is resolved as OpenSSH resolves it (``ssh -G``: Include, Match, tokens) when an OpenSSH client is
    installed, else with paramiko's reader (read once here); ``ssh_config: null`` reads no config at all.
    """

    def __init__(self, target: SSHTarget) -> None:
        self.target = target
        # A file named on purpose must exist; paramiko's reader also checks it can be parsed.
        self._config = load_ssh_config(target.ssh_config)
        self._ssh = ssh_client() if target.ssh_config is not None else None

    def _resolve(self, req: _Request) -> Hop:
        t = self.target
        if (
            self._ssh is not None
            and t.ssh_config is not None
            and (self._config is not None or t.ssh_config == DEFAULT_SSH_CONFIG)
        ):
            return resolve_openssh(
                self._ssh,
                t.ssh_config,
                req.host,
                user=req.user,
                port=req.port,
                key_filename=req.key_filename,
                known_hosts=t.known_hosts,
            )
        return resolve(
            self._config,
            req.host,
            user=req.user,
            port=req.port,
            key_filename=req.key_filename,
            known_hosts=t.known_hosts,
        )

    def open(self, timeout: float | None = None) -> Link:
        """Resolve, connect, verify the host key and authenticate, hop by hop.

        Each network wait (TCP connect, banner, authentication, a ProxyJump tunnel) is bounded by ``timeout``, the
        target's ``connect_timeout`` when None.
        """
        t = self.target
        wait = t.connect_timeout if timeout is None else timeout
        return self._open(_Request(t.host, t.user, t.port, t.key, None, None, 0), wait)

    def _open(self, req: _Request, timeout: float) -> Link:
        t = self.target
        if req.depth > MAX_JUMPS:
            raise HostError(
                f"ProxyJump chain to {req.host} is longer than {MAX_JUMPS} hops",
                hint="check the ssh_config for a ProxyJump loop",
            )
        hop = self._resolve(req)
        if not hop.key_files and req.fallback_key:
            hop = dataclasses.replace(hop, key_files=(os.path.expanduser(req.fallback_key),))
        chain = hop.jumps if req.jumps is None else req.jumps
        via: Link | None = None
        proxy: Proxy | None = None
        sock: paramiko.Channel | socket.socket | None = None
        if chain:
            hop_user, hop_host, hop_port = parse_hop(chain[-1])
            # One hop: the jump host's own config applies (its ProxyJump too). More: the rest of the chain.
            via = self._open(
                _Request(
                    hop_host,
                    hop_user,
                    hop_port,
                    None,
                    req.key_filename or req.fallback_key,
                    chain[:-1] or None,
                    req.depth + 1,
                ),
                timeout,
            )
            try:
                sock = via.open_direct(hop.hostname, hop.port, timeout)
            except BaseException:
                via.close()
                raise
        elif hop.proxy_command and req.jumps is None:
            command = expand_tokens(
                hop.proxy_command,
                hostname=hop.hostname,
                port=hop.port,
                user=hop.user,
                alias=hop.alias,
                what=f"the ProxyCommand of {hop.alias}",
            )
            proxy = Proxy(command, hop.alias)
            sock = proxy.sock
        try:
            client = handshake(hop, sock, t.accept_new_host_key, timeout, agent=not req.key_filename)
            return Link(hop, client, via, proxy)
        except HostKeyError:
            _close(via, proxy)
            raise
        except HostError as exc:
            _close(via, proxy)
            if proxy is None:
                raise
            # The proxy's own words say why the box could not be reached (no route, expired login, ...); when it
            # ended, what paramiko saw (an EOF) is only the consequence.
            said = proxy.diagnosis()
            message = f"{hop.name}: cannot connect: {said}" if proxy.process.poll() is not None else f"{exc}; {said}"
            raise type(exc)(
                message,
                hint="run the ProxyCommand (or `ssh " + hop.alias + " true`) yourself to see it fail, then fix it",
            ) from exc
        except BaseException:
            _close(via, proxy)
            raise


def _close(via: Link | None, proxy: Proxy | None) -> None:
    if proxy is not None:
        proxy.close()
    if via is not None:
        via.close()


def open_channel(
    name: str,
    opener: Callable[[float], paramiko.Channel],
    timeout: float,
    doing: str,
    refused_hint: str = "sshd may limit sessions per connection (MaxSessions)",
) -> paramiko.Channel:
    """Open a channel with ``opener(timeout)``, mapping paramiko's failures to our errors."""
    try:
        return opener(timeout)
    except TimeoutError as exc:
        raise HostTimeout(f"{name}: could not {doing} within {timeout:g} s") from exc
    except paramiko.ChannelException as exc:
        raise HostError(f"{name}: the server refused to {doing}: {exc}", hint=refused_hint) from exc
    except (paramiko.SSHException, EOFError, OSError) as exc:
        if "Timeout" in str(exc):  # paramiko reports a slow channel open as a plain SSHException
            raise HostTimeout(f"{name}: could not {doing} within {timeout:g} s") from exc
        raise lost(name, exc, doing) from exc


def lost(name: str, exc: BaseException, doing: str) -> HostError:
    """The error for a call whose connection or channel broke under it."""
    return HostError(
        f"{name}: could not {doing}: {exc or type(exc).__name__}",
        hint="the SSH connection may have dropped; check the host, then connect again",
    )


def fingerprint(key: paramiko.PKey) -> str:
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
                f"the host key of {hostname} is not known ({fingerprint(key)}); campaign does not trust it blindly",
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


def handshake(
    hop: Hop,
    sock: paramiko.Channel | socket.socket | None,
    accept_new: bool,
    timeout: float,
    *,
    agent: bool,
) -> paramiko.SSHClient:
    """Open, verify and authenticate one SSH connection; every failure becomes a HostError that says what to do."""
    where = hop.name
    client = paramiko.SSHClient()
    try:
        if os.path.exists(SYSTEM_KNOWN_HOSTS):
            client.load_system_host_keys(SYSTEM_KNOWN_HOSTS)
        if os.path.exists(hop.known_hosts):
            client.load_host_keys(hop.known_hosts)
    except OSError as exc:
        raise HostKeyError(
            f"cannot read known_hosts {hop.known_hosts}: {exc.strerror or exc}", hint="fix its permissions"
        ) from exc
    client.set_missing_host_key_policy(_KnownHostsPolicy(hop.known_hosts, accept_new))
    # A key named with a CertificateFile is offered with its certificate (paramiko loads KEY-cert.pub by itself).
    pkey = certified_key(hop)
    named_agent: _SocketAgent | None = None
    if agent and hop.identity_agent is not None:
        # IdentityAgent names another agent than $SSH_AUTH_SOCK ("none": no agent): its first key is offered.
        agent = False
        if pkey is None and hop.identity_agent.lower() != "none":
            named_agent = open_agent(hop.identity_agent, where)
            pkey = named_agent.get_keys()[0]
    started = time.monotonic()
    try:
        client.connect(
            hop.hostname,
            port=hop.port,
            username=hop.user,
            pkey=pkey,
            # paramiko documents a list of key files here; types-paramiko only knows a single str.
            key_filename=list(hop.key_files) or None,  # type: ignore[arg-type]
            # An explicit key is the one to use; otherwise the agent and the default keys, as ssh does.
            allow_agent=agent,
            look_for_keys=not hop.key_files and pkey is None,
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
        raise _connect_error(exc, hop, where, timeout, time.monotonic() - started) from exc
    finally:
        # The agent signs only during authentication; its connection is not kept.
        if named_agent is not None:
            named_agent.close()
    transport = client.get_transport()
    if transport is not None and isinstance(transport.sock, socket.socket):
        with contextlib.suppress(OSError):
            transport.sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
            # Small messages (a channel open, a short request) must not wait out Nagle + delayed ACK (~40 ms).
            transport.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return client


def certified_key(hop: Hop) -> paramiko.PKey | None:
    """The first identity key that one of the hop's CertificateFile certificates certifies, with it loaded."""
    for cert in hop.certificate_files:
        for key_file in hop.key_files:
            try:
                key = paramiko.PKey.from_path(key_file)
                key.load_certificate(cert)
            except (paramiko.SSHException, OSError, ValueError):
                continue  # encrypted, unreadable, or not this certificate's key
            return key
    return None


class _SocketAgent(paramiko.agent.AgentSSH):
    """An ssh-agent reached at a named socket (IdentityAgent), not through $SSH_AUTH_SOCK."""

    def __init__(self, path: str) -> None:
        super().__init__()
        self.conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self.conn.settimeout(10)
            self.conn.connect(path)
            self._connect(self.conn)  # type: ignore[attr-defined]  # AgentSSH's own way in; not in types-paramiko
        except BaseException:
            self.conn.close()
            raise

    def close(self) -> None:
        """Close the connection to the agent."""
        self.conn.close()


def open_agent(path: str, where: str) -> _SocketAgent:
    """The agent at ``path``, connected, holding at least one key (the caller closes it)."""
    try:
        found = _SocketAgent(path)
    except (OSError, paramiko.SSHException) as exc:
        raise HostError(
            f"{where}: cannot reach the IdentityAgent {path}: {exc}",
            hint="start the agent or fix IdentityAgent in the ssh_config",
        ) from exc
    if not found.get_keys():
        found.close()
        raise HostError(f"{where}: the IdentityAgent {path} holds no key", hint="add the key with `ssh-add`")
    return found


def _connect_error(exc: Exception, hop: Hop, where: str, timeout: float, elapsed: float) -> HostError:
    """The HostError for a failed connect, with the next step in its hint."""
    if isinstance(exc, paramiko.BadHostKeyException):
        return HostKeyError(
            f"the host key of {hop.hostkey_name} CHANGED: known_hosts has {fingerprint(exc.expected_key)}, "
            f"the host offered {fingerprint(exc.key)}. This can be a reinstalled host or an attack; refusing.",
            hint=(
                "if the change is expected, remove the old key with "
                f"`ssh-keygen -R '{hop.hostkey_name}' -f {hop.known_hosts}` and connect again"
            ),
        )
    if isinstance(exc, paramiko.PasswordRequiredException):
        return HostError(
            f"{where}: the private key is protected by a passphrase",
            hint="load it into the ssh-agent with `ssh-add`, and leave the key unset",
        )
    if isinstance(exc, paramiko.AuthenticationException):
        keys = ", ".join(hop.key_files) or "the ssh-agent and ~/.ssh/id_*"
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
            f"cannot resolve host name {hop.hostname}: {exc.strerror}",
            hint="check the name, or the HostName of the Host block in the ssh_config",
        )
    if isinstance(exc, ConnectionRefusedError | paramiko.ssh_exception.NoValidConnectionsError):
        return HostError(
            f"{where}: connection refused", hint="is sshd running there, and is the port right (Port / port:)?"
        )
    if isinstance(exc, OSError):
        return HostError(f"{where}: cannot connect: {exc.strerror or exc}", hint="check the network path to the host")
    return HostError(f"{where}: cannot connect: {type(exc).__name__}: {exc}")
