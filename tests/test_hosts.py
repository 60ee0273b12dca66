"""The hosts, against the real thing: LocalHost on this machine, SSHHost against a real OpenSSH sshd on loopback.

The SSH "remote" is this machine, so a test checks what a user would check on the box: a file's mode with
os.stat, a process with os.kill, a marker file that a hostile value must not create.
"""

from __future__ import annotations

import asyncio
import os
import shlex
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest

from campaign.config import SSHHostConfig
from campaign.errors import HostError, HostKeyError, HostLost, HostTimeout
from campaign.hosts import open_host
from campaign.hosts.base import Host, Result
from campaign.hosts.local import LocalHost
from campaign.hosts.slurm import SlurmHost
from campaign.hosts.ssh import SSHHost, SSHTarget
from campaign.hosts.ssh.reconnect import reopen
from campaign.hosts.ssh.testing import SSHServer, cut_connections, start_test_sshd
from tests.fixtures.sshd import tool

pytestmark = pytest.mark.timeout(120)

HOSTILE = [
    "$(touch pwned)",
    "`touch pwned`",
    "; touch pwned",
    "a\nb; touch pwned\n",
    "it's \"quoted\" 'twice'",
    "&& touch pwned || touch pwned",
    "| touch pwned",
    "${HOME}$((1+1)) \\ * ?",
]


@pytest.fixture(params=["local", "ssh", "slurm"])
def host(request: pytest.FixtureRequest) -> Iterator[Host]:
    """Each behaviour test runs on every kind (slurm: its login node is this machine, as is the job's node)."""
    if request.param in {"local", "slurm"}:
        local: Host = LocalHost()
        if request.param == "slurm":
            local = SlurmHost(local)
            local.use_node("127.0.0.1")
        yield local
        local.close()
    else:
        yield request.getfixturevalue("ssh_host")


@pytest.fixture(params=["local", "ssh", "ssh-exec"])
def cmd_host(request: pytest.FixtureRequest) -> Iterator[Host]:
    """Command tests also run over SSH without persistent shells: one exec channel per command."""
    if request.param == "local":
        local = LocalHost()
        yield local
        local.close()
        return
    ssh: SSHHost = request.getfixturevalue("ssh_host")
    ssh.persistent_shells = request.param == "ssh"
    yield ssh


def _wait_until(check: object, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():  # type: ignore[operator]
            return True
        time.sleep(0.05)
    return False


def _pids_running(pattern: str) -> list[int]:
    out = subprocess.run(["pgrep", "-f", pattern], capture_output=True, text=True).stdout
    return [int(p) for p in out.split()]


# -- commands -------------------------------------------------------------------------------------------------------


def test_exit_code_and_both_streams(cmd_host: Host) -> None:
    assert isinstance(cmd_host, Host)
    res = cmd_host.run("echo out; echo err >&2; exit 7")
    assert (res.exit_code, res.stdout, res.stderr, res.ok) == (7, "out\n", "err\n", False)
    ok = cmd_host.run("printf 'no newline'")
    assert ok.ok and ok.stdout == "no newline" and ok.stderr == ""


def test_runs_under_sh_with_stdin_closed(cmd_host: Host) -> None:
    res = cmd_host.run('cat; echo "rc=$?"; readlink /proc/$$/exe')
    assert res.stdout.splitlines()[0] == "rc=0"  # cat read EOF at once: stdin is /dev/null
    assert os.path.realpath(res.stdout.splitlines()[1]) == os.path.realpath("/bin/sh")


def test_death_by_signal_reads_as_128_plus_n(cmd_host: Host) -> None:
    assert cmd_host.run("kill -9 $$").exit_code == 128 + 9


@pytest.mark.parametrize("value", HOSTILE)
def test_hostile_values_arrive_literally(cmd_host: Host, value: str, tmp_path: Path) -> None:
    res = cmd_host.run(f"cd {shlex.quote(str(tmp_path))} && printf %s {shlex.quote(value)}")
    assert res.ok, res.stderr
    assert res.stdout == value
    assert list(tmp_path.iterdir()) == []  # nothing else ran


def test_big_interleaved_outputs_do_not_deadlock(cmd_host: Host) -> None:
    # 10 MB on each stream, alternating: reading one stream only would stall the other's flow control.
    cmd = (
        "i=0; while [ $i -lt 40 ]; do head -c 262144 /dev/zero | tr '\\0' a; "
        "head -c 262144 /dev/zero | tr '\\0' b >&2; i=$((i+1)); done"
    )
    res = cmd_host.run(cmd, timeout=60)
    assert res.ok
    assert len(res.stdout) == len(res.stderr) == 40 * 262144
    assert set(res.stdout) == {"a"} and set(res.stderr) == {"b"}


def test_timeout_raises_and_kills_the_command_group(cmd_host: Host) -> None:
    marker = f"{61 + (os.getpid() % 1000) / 1000:.3f}"  # a sleep length no one else uses
    started = time.monotonic()
    with pytest.raises(HostTimeout) as caught:
        cmd_host.run(f"sleep {marker} & sleep {marker}; wait", timeout=1.0)
    assert 0.9 < time.monotonic() - started < 3.0
    assert "timeout" in str(caught.value)
    # The command and its background child are killed (over SSH by the remote kill, a moment later).
    assert _wait_until(lambda: not _pids_running(f"sleep {marker}"), 5.0), _pids_running(f"sleep {marker}")
    assert cmd_host.run("echo still usable").stdout == "still usable\n"


def test_timeout_message_masks_secrets(host: Host) -> None:
    with pytest.raises(HostTimeout) as caught:
        host.run("HF_TOKEN=hunter2 API_KEY=swordfish DB_PASSWD=opensesame sleep 5", timeout=0.3)
    text = f"{caught.value} {caught.value.hint}"
    # The one secret rule of reports and logs: DB_PASSWD is as secret in a host error as in a report.
    assert "hunter2" not in text and "swordfish" not in text and "opensesame" not in text
    assert "HF_TOKEN=***" in text and "DB_PASSWD=***" in text


def test_detached_server_returns_at_once(cmd_host: Host, tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    cmd = f"setsid /bin/sh -c 'echo up; exec sleep 30' </dev/null >{shlex.quote(str(log))} 2>&1 & echo $!"
    started = time.monotonic()
    res = cmd_host.run(cmd, timeout=20)
    elapsed = time.monotonic() - started
    pid = int(res.stdout.strip())
    try:
        assert elapsed < 5.0, f"run() waited {elapsed:.2f} s on a detached server"  # not its 30 s
        os.kill(pid, 0)  # the server lives on after the command returned
        assert _wait_until(lambda: os.getpgid(pid) == pid, 5.0)  # in its own group once setsid ran
        assert _wait_until(lambda: log.exists() and log.read_text() == "up\n", 5.0)
    finally:
        os.kill(pid, signal.SIGKILL)


def test_many_commands_are_cheap(host: Host) -> None:
    host.run("true")
    started = time.monotonic()
    for _ in range(20):
        assert host.run("kill -0 $$").ok
    per_call = (time.monotonic() - started) / 20
    # The readiness loop polls liveness several times a second; each poll must be a small part of that.
    assert per_call < 0.1, f"run() took {per_call * 1000:.0f} ms per call"


def test_concurrent_commands_from_threads(cmd_host: Host) -> None:
    def one(i: int) -> Result:
        return cmd_host.run(f"head -c 200000 /dev/zero | tr '\\0' x; echo {i} >&2; exit {i % 5}", timeout=30)

    with ThreadPoolExecutor(max_workers=10) as pool:
        results = list(pool.map(one, range(18)))
    for i, res in enumerate(results):
        assert (res.exit_code, len(res.stdout), res.stderr) == (i % 5, 200000, f"{i}\n")


# -- files ----------------------------------------------------------------------------------------------------------


def test_write_then_read_with_offsets_and_modes(host: Host, tmp_path: Path) -> None:
    path = tmp_path / "data.bin"
    payload = bytes(range(256)) * 4
    host.write_file(str(path), payload, mode=0o640)
    assert path.read_bytes() == payload
    assert path.stat().st_mode & 0o7777 == 0o640
    assert host.read_file(str(path)) == payload
    assert host.read_file(str(path), offset=1000) == payload[1000:]
    assert host.read_file(str(path), offset=10, limit=5) == payload[10:15]
    assert host.read_file(str(path), offset=len(payload)) == b""
    assert host.read_file(str(path), offset=len(payload) + 100, limit=3) == b""
    # Replacing keeps no trace of the old content or mode.
    host.write_file(str(path), b"#!/bin/sh\necho hi\n", mode=0o700)
    assert path.read_bytes() == b"#!/bin/sh\necho hi\n"
    assert path.stat().st_mode & 0o7777 == 0o700
    assert host.run(shlex.quote(str(path))).stdout == "hi\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data.bin"]  # no temp file left behind


def test_big_file_and_a_window_of_it(host: Host, tmp_path: Path) -> None:
    path = tmp_path / "big.log"
    payload = os.urandom(3 * 1024 * 1024 + 17)
    host.write_file(str(path), payload)
    assert host.read_file(str(path)) == payload
    assert host.read_file(str(path), offset=1_000_003, limit=1_500_000) == payload[1_000_003:2_500_003]


def test_follow_a_growing_log_by_offset(host: Host, tmp_path: Path) -> None:
    log = tmp_path / "grow.log"
    seen = b""
    for i in range(5):
        host.run(f"echo line{i} >> {shlex.quote(str(log))}")
        seen += host.read_file(str(log), offset=len(seen))
    assert seen == b"".join(f"line{i}\n".encode() for i in range(5))


def test_missing_file_reads_empty_and_bad_paths_are_clear(host: Host, tmp_path: Path) -> None:
    assert host.read_file(str(tmp_path / "nope.log")) == b""
    assert host.read_file(str(tmp_path / "nope.log"), offset=5, limit=1) == b""
    with pytest.raises(HostError, match="cannot write"):
        host.write_file(str(tmp_path / "no-such-dir" / "f"), b"x")
    with pytest.raises(HostError, match="cannot read"):
        host.read_file(str(tmp_path))  # a directory


# -- url ------------------------------------------------------------------------------------------------------------


class _StreamingHandler(BaseHTTPRequestHandler):
    """Streams four chunks with pauses, like a token stream; the body names the request path."""

    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        for i in range(4):
            chunk = f"{self.path}:{i}\n".encode()
            self.wfile.write(f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n")
            self.wfile.flush()
            time.sleep(0.05)
        self.wfile.write(b"0\r\n\r\n")

    def log_message(self, format: str, *args: object) -> None:  # keep the test output clean
        pass


class _Server(ThreadingHTTPServer):
    request_queue_size = 512
    daemon_threads = True


@pytest.fixture
def http_port() -> Iterator[int]:
    server = _Server(("127.0.0.1", 0), _StreamingHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield int(server.server_address[1])
    server.shutdown()
    server.server_close()


async def _stream_all(base: str, n: int) -> list[str]:
    limits = httpx.Limits(max_connections=n, max_keepalive_connections=n)
    async with httpx.AsyncClient(base_url=base, limits=limits, timeout=30) as client:

        async def one(i: int) -> str:
            parts = []
            async with client.stream("GET", f"/req{i}") as resp:
                assert resp.status_code == 200
                async for text in resp.aiter_text():
                    parts.append(text)
            return "".join(parts)

        return list(await asyncio.gather(*(one(i) for i in range(n))))


def test_url_carries_128_concurrent_streams(host: Host, http_port: int) -> None:
    base = host.url(http_port)
    assert host.url(http_port) == base  # one listener per remote port, reused
    assert base.startswith("http://127.0.0.1:")
    started = time.monotonic()
    bodies = asyncio.run(_stream_all(base, 160))
    elapsed = time.monotonic() - started
    assert bodies == ["".join(f"/req{i}:{k}\n" for k in range(4)) for i in range(160)]
    # Each stream takes 0.2 s; 160 of them one after another would take 32 s.
    assert elapsed < 10, f"{elapsed:.1f} s: the streams did not run concurrently"


def test_closed_remote_port_fails_fast(host: Host) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed_port = s.getsockname()[1]
    base = host.url(closed_port)
    for _ in range(3):  # the readiness loop asks again and again
        started = time.monotonic()
        with pytest.raises(httpx.TransportError):
            httpx.get(f"{base}/health", timeout=10)
        assert time.monotonic() - started < 1.0


def test_commands_run_while_the_forwarder_carries_traffic(host: Host, http_port: int) -> None:
    base = host.url(http_port)
    outcome: dict[str, object] = {}

    def traffic() -> None:
        outcome["bodies"] = asyncio.run(_stream_all(base, 64))

    worker = threading.Thread(target=traffic)
    worker.start()
    codes = [host.run(f"exit {i % 3}").exit_code for i in range(20)]
    worker.join(timeout=60)
    assert codes == [i % 3 for i in range(20)]
    assert len(outcome["bodies"]) == 64  # type: ignore[arg-type]


# -- lifecycle ------------------------------------------------------------------------------------------------------


def test_close_is_idempotent_and_final(host: Host) -> None:
    host.close()
    host.close()
    with pytest.raises(HostError, match="closed"):
        host.run("true")
    with pytest.raises(HostError):
        host.read_file("/etc/hostname")


def test_ssh_close_stops_forwarders(sshd: SSHServer, http_port: int) -> None:
    before = threading.active_count()
    host = sshd.connect()
    base = host.url(http_port)
    assert httpx.get(f"{base}/x", timeout=10).status_code == 200
    local_port = int(base.rsplit(":", 1)[1])
    host.close()
    with pytest.raises(ConnectionRefusedError), socket.create_connection(("127.0.0.1", local_port), timeout=2):
        pass
    assert _wait_until(lambda: threading.active_count() <= before, 5.0), threading.enumerate()


# -- SSH: a lost connection ------------------------------------------------------------------------------------------


@pytest.fixture
def own_sshd(tmp_path: Path) -> Iterator[tuple[SSHServer, subprocess.Popen[bytes]]]:
    """An sshd of this test's own, so cutting its connections touches no other test."""
    server, proc = start_test_sshd(tmp_path)
    try:
        yield server, proc
    finally:
        proc.terminate()
        proc.wait(timeout=5)


def test_lost_connection_comes_back_at_the_next_call(
    own_sshd: tuple[SSHServer, subprocess.Popen[bytes]], http_port: int, tmp_path: Path
) -> None:
    server, proc = own_sshd
    host = server.connect()
    try:
        base = host.url(http_port)
        assert host.run("echo one").stdout == "one\n"
        cut_connections(proc.pid)
        assert _wait_until(lambda: not host.connected, 5.0)
        assert host.run("echo two").stdout == "two\n"
        assert host.connected and host.reconnects == 1
        assert len(server.accepted_logins()) == 2  # a new, verified, authenticated connection
        # Files and the forwarded URL handed out before the drop work on the new connection.
        host.write_file(str(tmp_path / "after"), b"back")
        assert host.read_file(str(tmp_path / "after")) == b"back"
        assert httpx.get(f"{base}/x", timeout=10).status_code == 200
    finally:
        host.close()


def test_a_host_that_stays_down_is_a_clear_error(own_sshd: tuple[SSHServer, subprocess.Popen[bytes]]) -> None:
    server, proc = own_sshd
    host = server.connect()
    try:
        host.reconnect_s = 1.0
        cut_connections(proc.pid)  # before the master goes: its children are found by their parent
        proc.terminate()
        proc.wait(timeout=5)
        assert _wait_until(lambda: not host.connected, 5.0)
        started = time.monotonic()
        with pytest.raises(HostError, match=r"could not be re-established within 1 s"):
            host.run("true")
        assert time.monotonic() - started < 5.0
    finally:
        host.close()


def test_the_reconnect_budget_is_a_hard_deadline_and_is_used_to_its_end() -> None:
    """A host that drops packets gives up at the budget, not a connect timeout later; one back in time is caught."""
    timeouts: list[float] = []

    def silent(timeout: float) -> Any:
        timeouts.append(timeout)
        time.sleep(timeout)  # what a connect to a host that drops packets does
        raise HostTimeout("no answer")

    started = time.monotonic()
    with pytest.raises(HostLost, match=r"within 1 s \(\d+ attempts over 1\.\d s\): no answer"):
        reopen(silent, 1.0, "box", attempt_s=10.0)
    took = time.monotonic() - started
    assert 1.0 <= took < 1.9, took  # the budget, give or take a busy box's late wake-ups; never 10 s
    assert all(t <= 1.0 for t in timeouts)  # never the whole 10 s connect timeout

    # Refused until 0.9 s, then up: the last attempt lands on the deadline, inside the budget.
    back_at = time.monotonic() + 0.9
    link = object()

    def refused_then_up(timeout: float) -> Any:
        if time.monotonic() < back_at:
            raise HostError("connection refused")
        return link

    assert reopen(refused_then_up, 1.0, "box", attempt_s=10.0) is link


# -- SSH: host keys -------------------------------------------------------------------------------------------------


def test_unknown_host_key_is_refused(sshd: SSHServer, tmp_path: Path) -> None:
    known = tmp_path / "known_hosts"
    known.write_text("")
    with pytest.raises(HostKeyError) as caught:
        sshd.connect(known_hosts=str(known))
    assert "not known" in str(caught.value) and "SHA256:" in str(caught.value)
    assert "accept_new_host_key" in (caught.value.hint or "")
    assert known.read_text() == ""  # nothing recorded without consent


def test_accept_new_records_the_key_then_verifies_it(sshd: SSHServer, tmp_path: Path) -> None:
    known = tmp_path / "fresh" / "known_hosts"  # neither the folder nor the file exists yet
    host = sshd.connect(known_hosts=str(known), accept_new_host_key=True)
    host.close()
    assert known.read_text() == sshd.known_hosts_line + "\n"
    assert known.stat().st_mode & 0o777 == 0o600
    again = sshd.connect(known_hosts=str(known))  # known now: no accept_new needed
    assert again.run("echo ok").stdout == "ok\n"
    again.close()
    assert known.read_text() == sshd.known_hosts_line + "\n"  # recorded once


def test_changed_host_key_is_always_refused(sshd: SSHServer, tmp_path: Path) -> None:
    other = tmp_path / "other_key"
    subprocess.run([tool("ssh-keygen"), "-q", "-t", "ed25519", "-N", "", "-f", str(other)], check=True)
    kind, blob = Path(f"{other}.pub").read_text().split()[:2]
    known = tmp_path / "known_hosts"
    known.write_text(f"[127.0.0.1]:{sshd.port} {kind} {blob}\n")
    for accept_new in (False, True):
        with pytest.raises(HostKeyError) as caught:
            sshd.connect(known_hosts=str(known), accept_new_host_key=accept_new)
        assert "CHANGED" in str(caught.value) and "ssh-keygen -R" in (caught.value.hint or "")
    assert known.read_text() == f"[127.0.0.1]:{sshd.port} {kind} {blob}\n"


def test_a_key_of_another_type_counts_as_changed(sshd: SSHServer, tmp_path: Path) -> None:
    other = tmp_path / "rsa_key"
    subprocess.run([tool("ssh-keygen"), "-q", "-t", "rsa", "-b", "2048", "-N", "", "-f", str(other)], check=True)
    kind, blob = Path(f"{other}.pub").read_text().split()[:2]
    known = tmp_path / "known_hosts"
    known.write_text(f"[127.0.0.1]:{sshd.port} {kind} {blob}\n")
    with pytest.raises(HostKeyError):
        sshd.connect(known_hosts=str(known), accept_new_host_key=True)


# -- SSH: ssh_config, agent, ProxyJump ------------------------------------------------------------------------------


def test_alias_and_identity_file_from_ssh_config(sshd: SSHServer) -> None:
    host = SSHHost.open(SSHTarget(sshd.alias, ssh_config=str(sshd.ssh_config)))
    try:
        assert host.name == f"{sshd.user}@127.0.0.1:{sshd.port}"
        assert host.run("id -un").stdout.strip() == sshd.user
    finally:
        host.close()


def test_explicit_arguments_win_over_ssh_config(sshd: SSHServer, tmp_path: Path) -> None:
    config = tmp_path / "ssh_config"
    config.write_text(
        "Host box\n    HostName 127.0.0.1\n    Port 1\n    User nobody-here\n    IdentityFile /nonexistent\n"
    )
    host = SSHHost.open(
        SSHTarget(
            "box",
            ssh_config=str(config),
            port=sshd.port,
            user=sshd.user,
            key=str(sshd.client_key),
            known_hosts=str(sshd.known_hosts),
        )
    )
    assert host.run("echo ok").stdout == "ok\n"
    host.close()


def test_ssh_agent_is_used_when_no_key_is_given(
    sshd: SSHServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sock = tmp_path / "agent.sock"
    agent = subprocess.Popen([tool("ssh-agent"), "-D", "-a", str(sock)], stdout=subprocess.DEVNULL)
    try:
        assert _wait_until(sock.exists, 5.0)
        env = {**os.environ, "SSH_AUTH_SOCK": str(sock)}
        subprocess.run([tool("ssh-add"), "-q", str(sshd.client_key)], env=env, check=True, capture_output=True)
        monkeypatch.setenv("SSH_AUTH_SOCK", str(sock))
        host = SSHHost.open(
            SSHTarget(sshd.host, port=sshd.port, user=sshd.user, known_hosts=str(sshd.known_hosts), ssh_config=None)
        )
        assert host.run("echo via-agent").stdout == "via-agent\n"
        host.close()
    finally:
        agent.terminate()
        agent.wait(timeout=5)


def _source_port(host: SSHHost) -> int:
    return int(host.run("echo $SSH_CONNECTION").stdout.split()[1])


def test_proxy_jump_through_the_same_sshd(sshd: SSHServer) -> None:
    logins = len(sshd.accepted_logins())
    host = SSHHost.open(SSHTarget(sshd.jump_alias, ssh_config=str(sshd.jump_ssh_config)))
    try:
        assert host.via is not None
        assert len(sshd.accepted_logins()) == logins + 2  # the jump, then the target through it
        # The target's connection comes from the jump host's sshd, not from this process's socket.
        assert _source_port(host) != _source_port(host.via)
        assert host.run("echo through").stdout == "through\n"
        assert host.read_file("/proc/self/status")[:5] == b"Name:"
    finally:
        host.close()
    with pytest.raises(HostError, match="closed"):
        host.via.run("true")  # closing the target closed the jump host too


def test_proxy_jump_chain(sshd: SSHServer, tmp_path: Path) -> None:
    config = tmp_path / "ssh_config"
    # OpenSSH refuses a chain whose last hop is the target itself ("jumphost loop"), so the second hop is the same
    # sshd under another name; its own Host block says which key and known_hosts it uses.
    known_hosts = tmp_path / "known_hosts"
    known_hosts.write_text(
        sshd.known_hosts_line + "\n" + sshd.known_hosts_line.replace("127.0.0.1", "localhost") + "\n"
    )
    config.write_text(
        sshd.ssh_config.read_text()
        + f"\nHost chained\n    HostName 127.0.0.1\n    Port {sshd.port}\n    User {sshd.user}\n"
        f"    IdentityFile {sshd.client_key}\n    UserKnownHostsFile {sshd.known_hosts}\n"
        f"    ProxyJump {sshd.alias},{sshd.user}@localhost:{sshd.port}\n"
        f"\nHost localhost\n    IdentityFile {sshd.client_key}\n    UserKnownHostsFile {known_hosts}\n"
    )
    logins = len(sshd.accepted_logins())
    host = SSHHost.open(SSHTarget("chained", ssh_config=str(config)))
    try:
        assert host.via is not None and host.via.via is not None
        assert len(sshd.accepted_logins()) == logins + 3
        assert host.run("echo two-hops").stdout == "two-hops\n"
    finally:
        host.close()


# -- SSH: connection errors -----------------------------------------------------------------------------------------


def test_connection_refused_is_a_clear_host_error(sshd: SSHServer) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed_port = s.getsockname()[1]
    started = time.monotonic()
    with pytest.raises(HostError, match="connection refused") as caught:
        sshd.connect(port=closed_port)
    assert time.monotonic() - started < 2.0
    assert caught.value.hint


def test_silent_server_times_out(sshd: SSHServer) -> None:
    with socket.socket() as mute:
        mute.bind(("127.0.0.1", 0))
        mute.listen(1)  # accepts the TCP handshake, never says a word
        started = time.monotonic()
        with pytest.raises(HostTimeout):
            sshd.connect(port=mute.getsockname()[1], connect_timeout=1.0)
        assert time.monotonic() - started < 3.0


def test_wrong_key_is_an_authentication_error(sshd: SSHServer, tmp_path: Path) -> None:
    stranger = tmp_path / "stranger"
    subprocess.run([tool("ssh-keygen"), "-q", "-t", "ed25519", "-N", "", "-f", str(stranger)], check=True)
    with pytest.raises(HostError, match="authentication failed"):
        sshd.connect(key=str(stranger))


def test_bad_arguments_are_clear(sshd: SSHServer, tmp_path: Path) -> None:
    with pytest.raises(HostError, match="does not exist"):
        sshd.connect(key=str(tmp_path / "missing_key"))
    with pytest.raises(HostError, match="ssh_config"):
        SSHHost.open(SSHTarget("x", ssh_config=str(tmp_path / "missing_config")))
    with pytest.raises(HostError, match="cannot resolve"):
        SSHHost.open(SSHTarget("no-such-host.invalid", ssh_config=None, connect_timeout=2))


def test_missing_openssh_tool_fails_with_the_fix() -> None:
    with pytest.raises(pytest.fail.Exception, match="make sshd-deps"):
        tool("sshd-that-is-not-installed")


def test_the_documented_host_section_reaches_the_test_sshd(sshd: SSHServer) -> None:
    host = open_host(SSHHostConfig(**sshd.host_config()))
    try:
        assert isinstance(host, SSHHost)
        assert host.run("id -un").stdout.strip() == sshd.user
    finally:
        host.close()
