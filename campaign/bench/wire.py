"""The bench's HTTP/1.1 client: one keep-alive connection per stream in flight, read straight off the socket.

A bench measures the server, so the client's own cost per streamed chunk must stay far below the server's token
interval even at hundreds of streams on a small machine. ``StreamTransport`` (plain http) is an
``httpx.AsyncBaseTransport`` that does what a bench needs and no more; ``Connections`` hands each stream a client of
its own. https goes through httpx's own transport.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import AsyncIterator

import httpx


class _Wire(asyncio.Protocol):
    """The receiving end of one TCP connection: bytes accumulate in a buffer and wake one waiting reader."""

    def __init__(self) -> None:
        self.buf = bytearray()
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.error: BaseException | None = None
        self._waiter: asyncio.Future[None] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.buf += data
        w = self._waiter
        if w is not None and not w.done():
            w.set_result(None)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.error = exc
        w = self._waiter
        if w is not None and not w.done():
            w.set_result(None)

    async def more(self) -> None:
        """Wait until more bytes arrive; raises ``httpx.RemoteProtocolError`` when the peer has closed."""
        if self.closed:
            raise httpx.RemoteProtocolError("the server closed the connection before the response ended")
        self._waiter = asyncio.get_running_loop().create_future()
        try:
            await self._waiter
        finally:
            self._waiter = None


class _Body(httpx.AsyncByteStream):
    """A response body read straight off a ``_Wire``: chunked, by Content-Length, or up to the close."""

    def __init__(self, owner: StreamTransport, wire: _Wire, length: int | None, chunked: bool, keep: bool) -> None:
        self._owner, self._wire, self._length, self._chunked, self._keep = owner, wire, length, chunked, keep
        self._complete = False

    async def __aiter__(self) -> AsyncIterator[bytes]:
        wire = self._wire
        if self._chunked:
            async for part in self._chunks():
                yield part
        elif self._length is not None:
            left = self._length
            while left > 0:
                if not wire.buf:
                    await wire.more()
                part = bytes(wire.buf[:left])
                del wire.buf[: len(part)]
                left -= len(part)
                yield part
        else:
            while True:
                if wire.buf:
                    part = bytes(wire.buf)
                    wire.buf.clear()
                    yield part
                if wire.closed:
                    break
                try:
                    await wire.more()
                except httpx.RemoteProtocolError:
                    break
            self._keep = False
        self._complete = True

    async def _chunks(self) -> AsyncIterator[bytes]:
        # Everything complete in the buffer is handed over at once: one wake-up, one piece, however many chunks.
        wire = self._wire
        buf = wire.buf
        while True:
            out: list[bytes] = []
            pos = 0
            end = False
            while True:
                nl = buf.find(b"\r\n", pos)
                if nl < 0:
                    break
                try:
                    size = int(bytes(buf[pos:nl]).split(b";", 1)[0], 16)
                except ValueError as e:
                    raise httpx.RemoteProtocolError("malformed chunk size in the response") from e
                if size == 0:
                    # The last chunk, then trailers (ours send none) up to an empty line.
                    if buf[nl + 2 : nl + 4] == b"\r\n" or buf.find(b"\r\n\r\n", nl) >= 0:
                        end = True
                        pos = len(buf)
                    break
                if len(buf) < nl + 2 + size + 2:
                    break
                out.append(bytes(buf[nl + 2 : nl + 2 + size]))
                pos = nl + 2 + size + 2
            if pos:
                del buf[:pos]
            if out:
                yield out[0] if len(out) == 1 else b"".join(out)
            if end:
                return
            await wire.more()

    async def aclose(self) -> None:
        self._owner._done(self._wire, reuse=self._complete and self._keep)


class StreamTransport(httpx.AsyncBaseTransport):
    """HTTP/1.1 over one keep-alive asyncio connection, for plain-http benches.

    httpcore and h11 cost about 60 µs per streamed chunk on this project's two-core machine (an event state
    machine, an anyio stream and a lock per read); at 256 streams that is more than a core, and the client's
    own queueing then shows up in TTFT and ITL. This transport does what a bench needs and no more: one
    request at a time per connection, Content-Length or chunked bodies, keep-alive.
    """

    def __init__(self) -> None:
        self._wire: _Wire | None = None

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        url = request.url
        wire = self._wire
        if wire is None or wire.closed:
            timeout = (request.extensions.get("timeout") or {}).get("connect") or 10.0
            loop = asyncio.get_running_loop()
            try:
                _, wire = await asyncio.wait_for(loop.create_connection(_Wire, url.host, url.port or 80), timeout)
            except TimeoutError as e:
                raise httpx.ConnectTimeout(f"connecting to {url.host}:{url.port} timed out") from e
            except OSError as e:
                raise httpx.ConnectError(f"{e.strerror or e} ({url.host}:{url.port})") from e
            self._wire = wire
        assert wire is not None
        body = request.read()
        head = [f"{request.method} {url.raw_path.decode('ascii')} HTTP/1.1", f"host: {url.netloc.decode('ascii')}"]
        head += [
            f"{k}: {v}" for k, v in request.headers.items() if k not in ("host", "content-length", "transfer-encoding")
        ]
        head.append(f"content-length: {len(body)}")
        assert wire.transport is not None
        wire.buf.clear()
        wire.transport.write(("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + body)
        while (end := wire.buf.find(b"\r\n\r\n")) < 0:
            try:
                await wire.more()
            except httpx.RemoteProtocolError:
                self._wire = None
                raise
        lines = bytes(wire.buf[:end]).decode("latin-1").split("\r\n")
        del wire.buf[: end + 4]
        try:
            version, status, *_ = lines[0].split(" ", 2)
            code = int(status)
        except ValueError as e:
            raise httpx.RemoteProtocolError(f"malformed status line {lines[0]!r}") from e
        headers = [tuple(ln.split(":", 1)) for ln in lines[1:] if ":" in ln]
        hmap = {k.strip().lower(): v.strip().lower() for k, v in headers}
        chunked = "chunked" in hmap.get("transfer-encoding", "")
        length = None if chunked or "content-length" not in hmap else int(hmap["content-length"])
        keep = version == "HTTP/1.1" and hmap.get("connection") != "close" and (chunked or length is not None)
        if request.method == "HEAD" or code in (204, 304):
            length, chunked = 0, False
        return httpx.Response(
            code,
            headers=[(k.strip(), v.strip()) for k, v in headers],
            stream=_Body(self, wire, length, chunked, keep),
            extensions={"http_version": version.encode()},
        )

    def _done(self, wire: _Wire, *, reuse: bool) -> None:
        if not reuse:
            if wire.transport is not None:
                wire.transport.close()
            if self._wire is wire:
                self._wire = None

    async def aclose(self) -> None:
        if self._wire is not None and self._wire.transport is not None:
            self._wire.transport.close()
        self._wire = None


class Connections:
    """A free list of single-connection httpx clients, one per request in flight.

    httpx's shared pool re-scans every connection on each request and each response close (quadratic in the
    number of streams: at 128 streams that alone delayed the first tokens by about a second), so each stream
    gets a client of its own with one keep-alive connection; all share one SSL context, built once.
    """

    def __init__(self, timeout: httpx.Timeout, *, plain_http: bool) -> None:
        self._timeout = timeout
        self._plain = plain_http
        self._ssl = ssl.create_default_context()
        self._free: list[httpx.AsyncClient] = []
        self._all: list[httpx.AsyncClient] = []

    def acquire(self) -> httpx.AsyncClient:
        if self._free:
            return self._free.pop()
        transport: httpx.AsyncBaseTransport
        if self._plain:
            transport = StreamTransport()
        else:
            transport = httpx.AsyncHTTPTransport(
                verify=self._ssl, limits=httpx.Limits(max_connections=1, keepalive_expiry=120.0)
            )
        # trust_env off: no proxy or netrc lookups per client; a bench talks to the server directly.
        client = httpx.AsyncClient(transport=transport, timeout=self._timeout, trust_env=False)
        self._all.append(client)
        return client

    def release(self, client: httpx.AsyncClient) -> None:
        self._free.append(client)

    async def aclose(self) -> None:
        await asyncio.gather(*(c.aclose() for c in self._all), return_exceptions=True)
