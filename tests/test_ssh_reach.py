"""Reaching every box `ssh HOST` reaches: ProxyCommand, ProxyJump via a ProxyCommand, Match and Include, certificates.

One real sshd on 127.0.0.1 for the module (it trusts a throwaway user CA), and an ssh_config that names it the ways
engineers' configs do: behind `ProxyCommand ssh -W` (the bastion form; the target's HostName does not resolve here,
so only the proxy can reach it), behind a ProxyJump host that is itself reached by a ProxyCommand, through a
`Match host` block in an `Include`d file, and with a key that only its CA-signed certificate lets in. Each
host runs the loop's host calls (run, upload, a forwarded port) and comes back after the sshd restarts.
"""

from __future__ import annotations

import http.server
import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml

from campaign.errors import HostError
from campaign.hosts.ssh import SSHHost
from campaign.hosts.ssh.target import SSHTarget
from campaign.hosts.ssh.testing import SSHServer, find_tool, restart_test_sshd, start_test_sshd
from tests.helpers import run_cli


class Box:
    """The module's sshd, the process running it (replaced by a restart) and the ssh_config that names it."""

    def __init__(self, server: SSHServer, proc: subprocess.Popen[bytes], config: Path, user_key: Path) -> None:
        self.server = server
        self.proc = proc
        self.config = config
        self.user_key = user_key

    def restart(self) -> None:
        self.proc = restart_test_sshd(self.server, self.proc)

    def target(self, alias: str) -> SSHTarget:
        return SSHTarget(alias, ssh_config=str(self.config), connect_timeout=10)


def _keygen(*args: str) -> None:
    subprocess.run([find_tool("ssh-keygen"), "-q", *args], check=True, capture_output=True, timeout=30)


@pytest.fixture(scope="module")
def box(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Box]:
    root = tmp_path_factory.mktemp("reach")
    ca = root / "user_ca"
    _keygen("-t", "ed25519", "-N", "", "-C", "campaign-test-ca", "-f", str(ca))
    server, proc = start_test_sshd(root, extra_config=f"TrustedUserCAKeys {ca}.pub\n")
    # A key the sshd does not list in authorized_keys: only its certificate, signed by the CA, lets it in. The
    # certificate lives apart from the key (paramiko would pick up KEY-cert.pub by itself): CertificateFile names it.
    user_key = root / "cert_user_ed25519"
    _keygen("-t", "ed25519", "-N", "", "-C", "campaign-cert-user", "-f", str(user_key))
    _keygen("-s", str(ca), "-I", "campaign-test", "-n", server.user, "-V", "-5m:+1h", f"{user_key}.pub")
    certs = root / "certs"
    certs.mkdir()
    cert = certs / "signed.pub"
    Path(f"{user_key}-cert.pub").rename(cert)

    known = root / "known_hosts_reach"
    host_key = server.host_public_key
    known.write_text(
        "".join(f"[{name}]:{server.port} {host_key}\n" for name in ("127.0.0.1", "box.internal", "jump.internal"))
    )
    config = root / "ssh_config_reach"
    common = (
        f"    Port {server.port}\n    User {server.user}\n    UserKnownHostsFile {known}\n"
        "    BatchMode yes\n    StrictHostKeyChecking yes\n"
    )
    bastion = f"ssh -F {config} -W 127.0.0.1:%p bastion"
    (root / "match.conf").write_text(
        f"Match host gpu-*\n    HostName 127.0.0.1\n{common}    IdentityFile {server.client_key}\n"
    )
    config.write_text(
        f"Include {root}/match.conf\n\n"
        f"Host bastion\n    HostName 127.0.0.1\n{common}    IdentityFile {server.client_key}\n\n"
        f"Host via-proxy\n    HostName box.internal\n{common}    IdentityFile {server.client_key}\n"
        f"    ProxyCommand {bastion}\n\n"
        f"Host jumpbox\n    HostName jump.internal\n{common}    IdentityFile {server.client_key}\n"
        f"    ProxyCommand {bastion}\n\n"
        f"Host behind-jump\n    HostName 127.0.0.1\n{common}    IdentityFile {server.client_key}\n"
        "    ProxyJump jumpbox\n\n"
        f"Host certbox\n    HostName 127.0.0.1\n{common}    IdentityFile {user_key}\n    CertificateFile {cert}\n"
        "    IdentitiesOnly yes\n\n"
        f"Host uncertified\n    HostName 127.0.0.1\n{common}    IdentityFile {user_key}\n    IdentitiesOnly yes\n\n"
        "Host broken\n    HostName box.internal\n"
        f"{common}    IdentityFile {server.client_key}\n"
        "    ProxyCommand sh -c 'echo \"bastion.corp: connect to host %h port %p: No route to host\" >&2; exit 255'\n"
    )
    b = Box(server, proc, config, user_key)
    try:
        yield b
    finally:
        b.proc.terminate()
        b.proc.wait(timeout=10)


@pytest.fixture(scope="module")
def web() -> Iterator[int]:
    """An HTTP server on this machine (the "remote" one): what a forwarded port must reach."""

    class Hello(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = f"hello {self.path}".encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Hello)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield int(server.server_address[1])
    server.shutdown()
    server.server_close()


def _host_calls(host: SSHHost, tmp: Path, web_port: int, tag: str) -> None:
    """The loop's host calls: a command, an upload read back, a forwarded port carrying HTTP."""
    assert host.run(f"echo {tag}").stdout == f"{tag}\n"
    path = tmp / f"{tag}.sh"
    host.write_file(str(path), b"#!/bin/sh\necho uploaded\n", mode=0o700)
    assert path.read_bytes() == b"#!/bin/sh\necho uploaded\n"
    assert host.read_file(str(path), offset=10) == b"echo uploaded\n"
    assert host.run(f"{path}").stdout == "uploaded\n"
    reply = httpx.get(host.url(web_port) + f"/{tag}", timeout=10)
    assert reply.text == f"hello /{tag}"


def _survives_a_restart(box: Box, host: SSHHost, tmp: Path, web_port: int) -> None:
    """The sshd restarts mid-run; the next calls reconnect through the same route (host key verified again)."""
    logins = len(box.server.accepted_logins())
    box.restart()
    _host_calls(host, tmp, web_port, "after-restart")
    assert len(box.server.accepted_logins()) > logins


def test_a_box_reached_only_through_a_proxy_command(box: Box, tmp_path: Path, web: int) -> None:
    with pytest.raises(OSError):
        socket.getaddrinfo("box.internal", box.server.port)  # no direct route: only the ProxyCommand gets there
    logins = len(box.server.accepted_logins())
    host = SSHHost.open(box.target("via-proxy"))
    try:
        # Two logins: the bastion's (made by `ssh -W` in the ProxyCommand), then ours through it.
        assert len(box.server.accepted_logins()) == logins + 2
        assert host.link.proxy is not None and host.link.proxy.process.poll() is None
        _host_calls(host, tmp_path, web, "via-proxy")
        first_proxy = host.link.proxy.process
        _survives_a_restart(box, host, tmp_path, web)
        assert host.link.proxy is not None and host.link.proxy.process is not first_proxy
    finally:
        host.close()
    # Closing the host ends the ProxyCommand we started.
    assert first_proxy.wait(timeout=10) is not None


def test_proxy_jump_through_a_jump_host_reached_by_proxy_command(box: Box, tmp_path: Path, web: int) -> None:
    logins = len(box.server.accepted_logins())
    host = SSHHost.open(box.target("behind-jump"))
    try:
        # The bastion (inside the jump's ProxyCommand), the jump host, then the target through the jump.
        assert len(box.server.accepted_logins()) == logins + 3
        assert host.via is not None and host.via.link.proxy is not None
        _host_calls(host, tmp_path, web, "behind-jump")
        _survives_a_restart(box, host, tmp_path, web)
    finally:
        host.close()


def test_a_host_chosen_by_a_match_block_in_an_included_file(box: Box, tmp_path: Path, web: int) -> None:
    host = SSHHost.open(box.target("gpu-7"))
    try:
        assert host.link.hop.hostname == "127.0.0.1" and host.link.hop.port == box.server.port
        _host_calls(host, tmp_path, web, "match")
        _survives_a_restart(box, host, tmp_path, web)
    finally:
        host.close()


def test_a_key_that_only_its_certificate_lets_in(box: Box, tmp_path: Path, web: int) -> None:
    with pytest.raises(HostError, match="authentication failed"):
        SSHHost.open(box.target("uncertified"))
    host = SSHHost.open(box.target("certbox"))
    try:
        assert any("CERT" in line or "certificate" in line.lower() for line in box.server.accepted_logins()[-1:])
        _host_calls(host, tmp_path, web, "cert")
        _survives_a_restart(box, host, tmp_path, web)
    finally:
        host.close()


def test_a_failing_proxy_command_prints_its_own_stderr_and_exits_2_before_anything_is_touched(
    box: Box, tmp_path: Path
) -> None:
    workdir = tmp_path / "box"
    doc = {
        "name": "behind-a-dead-bastion",
        "host": {"kind": "ssh", "host": "broken", "ssh_config": str(box.config), "workdir": str(workdir)},
        "recipe": "refserver",
        "vars": {"python": sys.executable},
        "baseline": {"knobs": {"device": "cpu", "attention": "torch", "cuda_graph": False}},
        "variants": [],
    }
    path = tmp_path / "exp.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    runs = tmp_path / "runs"
    res = run_cli("run", str(path), "--json", runs=runs, timeout=120)
    assert res.returncode == 2, res.stderr
    assert "No route to host" in res.stderr, res.stderr
    assert "bastion.corp: connect to host box.internal port" in res.stderr  # its tokens expanded as OpenSSH does
    assert "Traceback" not in res.stderr
    assert json.loads(res.stdout)["kind"] == "HostError"
    assert not workdir.exists(), "the box was touched before the connection was made"
    assert not any(runs.glob("*/*/report.json")) if runs.exists() else True


def test_identity_agent_names_the_agent_to_ask(box: Box, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """IdentityAgent wins over $SSH_AUTH_SOCK: the key lives only in the agent the config names."""
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    sock = tmp_path / "agent.sock"
    agent = subprocess.Popen([find_tool("ssh-agent"), "-D", "-a", str(sock)], stdout=subprocess.DEVNULL)
    try:
        for _ in range(100):
            if sock.exists():
                break
            time.sleep(0.05)
        env = {**os.environ, "SSH_AUTH_SOCK": str(sock)}
        subprocess.run(
            [find_tool("ssh-add"), "-q", str(box.server.client_key)], env=env, check=True, capture_output=True
        )
        config = tmp_path / "ssh_config"
        config.write_text(
            f"Host agentbox\n    HostName 127.0.0.1\n    Port {box.server.port}\n    User {box.server.user}\n"
            f"    UserKnownHostsFile {box.server.known_hosts}\n    IdentityFile {tmp_path}/no-such-key\n"
            f"    IdentityAgent {sock}\n"
        )
        host = SSHHost.open(SSHTarget("agentbox", ssh_config=str(config)))
        try:
            assert host.run("echo via-named-agent").stdout == "via-named-agent\n"
        finally:
            host.close()
    finally:
        agent.terminate()
        agent.wait(timeout=5)


def test_the_loop_runs_on_a_box_behind_a_proxy_command(box: Box, tmp_path: Path) -> None:
    """`campaign run` through the bastion: launch, readiness and smoke over the forwarded port, then stop."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    doc = {
        "name": "behind-a-bastion",
        "host": {"kind": "ssh", "host": "via-proxy", "ssh_config": str(box.config), "workdir": str(tmp_path / "box")},
        "recipe": "refserver",
        "vars": {"python": sys.executable},
        "baseline": {"knobs": {"device": "cpu", "attention": "torch", "cuda_graph": False, "port": port}},
        "variants": [],
        "smoke": {"questions": 4, "seed": 3},
        "timeouts": {"ready_s": 90, "stop_grace_s": 5},
        "at_end": "stop",
    }
    path = tmp_path / "exp.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    res = run_cli("run", str(path), "--json", runs=tmp_path / "runs", timeout=300)
    assert res.returncode == 0, res.stderr
    (baseline,) = json.loads(res.stdout)["attempts"]
    assert baseline["outcome"] == "passed"
    assert baseline["smoke"]["passed"] == baseline["smoke"]["total"] > 0
