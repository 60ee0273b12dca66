"""Port forwarding: a local listener on 127.0.0.1 per remote port, each connection a direct-tcpip channel."""

from __future__ import annotations

import contextlib
import select
import socket
import struct
import threading

import paramiko

_READ_CHUNK = 1 << 16


class Forwarder:
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
