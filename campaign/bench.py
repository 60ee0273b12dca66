"""The load generator: streaming requests over /v1/chat/completions, measured the way vLLM and SGLang measure.

``run_bench(base_url, settings)`` drives one server through a list of load levels (fixed concurrency, or Poisson
arrivals at a request rate), each run ``repeats`` times after a few warm-up requests, and returns a ``BenchResult``.
It runs its own event loop and never prints; ``progress`` receives ``BenchEvent`` values so a console can draw a bar
per level.

Definitions (../shared/reference-servers.md, section 5), computed over successful requests only:

- TTFT: send to the first chunk whose ``delta.content`` is non-empty (SGLang's chat definition; vLLM's role-only
  first chunk does not count).
- ITL: every gap between consecutive content chunks, pooled over all requests of a level.
- TPOT: ``(e2e - ttft) / (output_tokens - 1)`` for requests with more than one output token.
- E2E: send to the end of the stream.
- Output tokens: ``usage.completion_tokens`` when the server sends it, otherwise the number of content chunks.
- Throughput: completed requests (and their output tokens) divided by the wall time of the repeat.

A request is *successful* when its stream ends with a ``finish_reason`` and no error; *failed* when it never
produced a valid stream (connection error, HTTP status other than 200, timeout) or when an error event arrived
mid-stream under HTTP 200; *incomplete* when the stream began but ended without a ``finish_reason``. Every
unsuccessful request is counted in ``errors`` under its type, and a level whose error rate exceeds
``max_error_rate`` fails the bench.
"""

from __future__ import annotations

import asyncio
import json
import math
import platform
import random
import ssl
import time
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal

import httpx
from pydantic import BaseModel, ConfigDict, Field, model_validator

from campaign.errors import BenchError
from campaign.gates import Gate

CHAT_PATH = "/v1/chat/completions"
RESULT_SCHEMA_VERSION = 1

#: Words used to build random prompts: short, common English words that nearly every tokenizer encodes as one
#: token each, so ``input_len`` words come close to ``input_len`` prompt tokens without needing a tokenizer here.
_WORD_TEXT = (
    "the of and to in is it you that he was for on are as with his they at be this have from or one had by "
    "word but not what all were we when your can said there use an each which she do how their if will up "
    "other about out many then them these so some her would make like him into time has look two more write "
    "go see number no way could people my than first water been call who oil its now find long down day did "
    "get come made may part"
)
_WORDS = tuple(_WORD_TEXT.split())


class BenchSettings(BaseModel):
    """How to load a server: the ``bench:`` section of an experiment file, and ``campaign bench`` options.

    Load shape: either ``concurrency`` levels (a sweep; the default is ``[1, 8, 32]``) or ``request_rate``
    (requests per second, Poisson arrivals; one level per rate, optionally capped by ``max_concurrency``).
    Each level sends ``warmup`` requests whose results are discarded, then ``requests`` measured requests,
    ``repeats`` times.
    """

    model_config = ConfigDict(extra="forbid")

    concurrency: list[int] | None = None
    request_rate: list[float] | None = None
    max_concurrency: int | None = Field(default=None, ge=1)
    requests: int = Field(default=64, ge=1)
    #: Concurrency levels only: stream k of c starts k·ramp_s/c seconds after the first, so a level does not
    #: open with every request sent at once (and, streams being alike, every later wave with them).
    ramp_s: float = Field(default=0.0, ge=0.0)
    warmup: int = Field(default=2, ge=0)
    repeats: int = Field(default=1, ge=1)
    #: ``arithmetic``: "What is A×B?"-style questions for the reference server; ``random``: ``input_len`` random
    #: words asking for ``output_len`` tokens, with ``ignore_eos`` so real servers produce exactly that many.
    prompts: Literal["arithmetic", "random"] = "arithmetic"
    seed: int = 0
    input_len: int = Field(default=128, ge=1)
    output_len: int = Field(default=128, ge=1)
    #: Default: on for random prompts, off for arithmetic ones.
    ignore_eos: bool | None = None
    #: Default: ``output_len`` for random prompts, 16 for arithmetic ones.
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float = Field(default=0.0, ge=0.0)
    #: Seconds one request may take from send to the end of its stream before it counts as failed (timeout).
    timeout_s: float = Field(default=60.0, gt=0)
    #: A level whose (failed + incomplete) / sent exceeds this fails the bench.
    max_error_rate: float = Field(default=0.01, ge=0.0, le=1.0)
    gates: list[Gate] = Field(default_factory=list)

    @model_validator(mode="before")
    @classmethod
    def _scalars_to_lists(cls, data: Any) -> Any:
        # YAML authors write `request_rate: 8` or `concurrency: 32` as often as a list.
        if isinstance(data, dict):
            data = dict(data)
            for key in ("concurrency", "request_rate"):
                if isinstance(data.get(key), int | float) and not isinstance(data.get(key), bool):
                    data[key] = [data[key]]
        return data

    @model_validator(mode="after")
    def _one_load_shape(self) -> BenchSettings:
        if self.concurrency is not None and self.request_rate is not None:
            raise ValueError("give either concurrency levels or a request_rate, not both")
        if self.concurrency is None and self.request_rate is None:
            self.concurrency = [1, 8, 32]
        if self.concurrency is not None:
            if not self.concurrency or any(c < 1 for c in self.concurrency):
                raise ValueError("concurrency levels must be a non-empty list of integers >= 1")
            if self.max_concurrency is not None:
                raise ValueError("max_concurrency caps a request_rate; with concurrency levels leave it out")
        if self.request_rate is not None and (not self.request_rate or any(r <= 0 for r in self.request_rate)):
            raise ValueError("request_rate must be a positive number of requests per second (or a list of them)")
        return self

    def loads(self) -> list[Load]:
        """The levels this bench runs, in order."""
        if self.request_rate is not None:
            return [Load(request_rate=r, max_concurrency=self.max_concurrency) for r in self.request_rate]
        return [Load(concurrency=c) for c in self.concurrency or []]

    def effective_ignore_eos(self) -> bool:
        """Whether requests carry ``ignore_eos`` (on by default for random prompts)."""
        return self.ignore_eos if self.ignore_eos is not None else self.prompts == "random"

    def effective_max_tokens(self) -> int:
        """The ``max_tokens`` each request asks for."""
        if self.max_tokens is not None:
            return self.max_tokens
        return self.output_len if self.prompts == "random" else 16


class Load(BaseModel):
    """One load level: a fixed number of requests in flight, or Poisson arrivals at a rate."""

    model_config = ConfigDict(extra="forbid")

    concurrency: int | None = None
    request_rate: float | None = None
    max_concurrency: int | None = None

    @property
    def label(self) -> str:
        """``c=32`` or ``rate=8/s`` (``rate=8/s,c<=16`` when capped)."""
        if self.concurrency is not None:
            return f"c={self.concurrency}"
        cap = f",c<={self.max_concurrency}" if self.max_concurrency else ""
        return f"rate={self.request_rate:g}/s{cap}"

    @property
    def x(self) -> float:
        """Where this level sits on a plot's x axis: its concurrency, or its request rate."""
        return float(self.concurrency if self.concurrency is not None else self.request_rate or 0.0)


class LatencyStats(BaseModel):
    """Summary of one latency metric over a level, in milliseconds (None when there were no samples)."""

    count: int = 0
    mean: float | None = None
    median: float | None = None
    p90: float | None = None
    p99: float | None = None
    std: float | None = None
    min: float | None = None
    max: float | None = None

    @classmethod
    def of(cls, samples_s: Sequence[float]) -> LatencyStats:
        """Summarise samples given in seconds."""
        if not samples_s:
            return cls()
        ms = sorted(s * 1000.0 for s in samples_s)
        mean = math.fsum(ms) / len(ms)
        var = math.fsum((v - mean) ** 2 for v in ms) / len(ms)
        return cls(
            count=len(ms),
            mean=mean,
            median=percentile(ms, 50),
            p90=percentile(ms, 90),
            p99=percentile(ms, 99),
            std=math.sqrt(var),
            min=ms[0],
            max=ms[-1],
        )


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile of already sorted values, linearly interpolated (numpy's default method)."""
    if not sorted_values:
        raise ValueError("percentile of no values")
    pos = (len(sorted_values) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


#: Metric names a gate or a comparison can ask a level for, and whether higher is better.
METRICS: dict[str, bool] = {
    "output_throughput": True,
    "request_throughput": True,
    "error_rate": False,
    **{f"{m}.{s}": False for m in ("ttft", "itl", "tpot", "e2e") for s in ("mean", "median", "p90", "p99")},
}


class RepeatSample(BaseModel):
    """The headline metrics of one repeat of one level: the samples a significance test compares."""

    repeat: int
    duration_s: float
    successful: int
    failed: int
    incomplete: int
    output_tokens: int
    metrics: dict[str, float | None] = Field(default_factory=dict)


class LevelResult(BaseModel):
    """Everything measured at one load level, pooled over its repeats."""

    load: Load
    label: str
    sent: int
    successful: int
    failed: int
    incomplete: int
    #: Unsuccessful requests by type, e.g. ``http_500``, ``timeout``, ``stream_error:internal_error``,
    #: ``incomplete:connection_closed``; the counts add up to failed + incomplete.
    errors: dict[str, int] = Field(default_factory=dict)
    #: One message per error type, as the server or the transport worded it.
    error_examples: dict[str, str] = Field(default_factory=dict)
    error_rate: float
    passed: bool
    duration_s: float
    input_tokens: int
    output_tokens: int
    request_throughput: float
    output_throughput: float
    ttft: LatencyStats
    itl: LatencyStats
    tpot: LatencyStats
    e2e: LatencyStats
    repeats: list[RepeatSample] = Field(default_factory=list)

    def metric(self, name: str) -> float | None:
        """The value of a metric named as in ``METRICS`` (``output_throughput``, ``ttft.p90``, ...)."""
        if name not in METRICS:
            raise KeyError(name)
        if "." in name:
            group, stat = name.split(".", 1)
            value: float | None = getattr(getattr(self, group), stat)
            return value
        return float(getattr(self, name))


class BenchResult(BaseModel):
    """A whole bench: what was asked, of whom, and every level's result. Stored as ``Attempt.bench``."""

    schema_version: int = RESULT_SCHEMA_VERSION
    base_url: str
    model: str
    started_at: str
    duration_s: float
    settings: BenchSettings
    levels: list[LevelResult] = Field(default_factory=list)
    passed: bool
    #: Client versions, so a comparison can tell a client change from a server change.
    client: dict[str, str] = Field(default_factory=dict)

    def level(self, *, concurrency: int | None = None, request_rate: float | None = None) -> LevelResult | None:
        """The level run at this concurrency or request rate, or None."""
        for lv in self.levels:
            if concurrency is not None and lv.load.concurrency == concurrency:
                return lv
            if request_rate is not None and lv.load.request_rate == request_rate:
                return lv
        return None

    @property
    def failed_levels(self) -> list[LevelResult]:
        """Levels whose error rate exceeded the threshold."""
        return [lv for lv in self.levels if not lv.passed]


@dataclass(frozen=True)
class BenchEvent:
    """Progress of a bench, for a console: ``level_start``, ``warmup``, ``repeat``, ``request``, ``level_end``.

    ``warmup`` comes before a level's warm-up requests, ``repeat`` before each measured repeat starts.

    ``done``/``total`` count measured requests of the level across its repeats; ``failed`` counts the
    unsuccessful ones among them.
    """

    kind: Literal["level_start", "warmup", "repeat", "request", "level_end"]
    level: str
    index: int
    levels: int
    done: int = 0
    total: int = 0
    failed: int = 0
    repeat: int = 0
    result: LevelResult | None = None


@dataclass
class RequestRecord:
    """What one request did, with times in seconds from its send."""

    ok: bool = False
    error: str | None = None
    message: str = ""
    ttft: float | None = None
    itls: list[float] = field(default_factory=list)
    e2e: float | None = None
    output_tokens: int = 0
    prompt_tokens: int = 0


@dataclass(frozen=True)
class Prompt:
    """One request's message and how many prompt tokens it is meant to have (0 when unknown)."""

    text: str
    input_len: int = 0


def make_prompts(settings: BenchSettings, count: int, *, offset: int = 0) -> list[Prompt]:
    """The fixed-seed prompts of a bench: ``count`` of them starting at ``offset`` in the seeded sequence."""
    out: list[Prompt] = []
    for i in range(offset, offset + count):
        # One generator per prompt index: any slice of the sequence costs only its own length.
        rng = random.Random(f"{settings.seed}/{i}")
        if settings.prompts == "arithmetic":
            a, b = rng.randint(0, 99), rng.randint(0, 99)
            op = rng.choice("×+-")
            text = f"What is {a}{op}{b}?"
            n = len(text)
        else:
            n = settings.input_len
            text = " ".join(rng.choice(_WORDS) for _ in range(n))
        out.append(Prompt(text, n))
    return out


def _payload(settings: BenchSettings, model: str, prompt: Prompt) -> bytes:
    body: dict[str, Any] = {
        "model": model,
        "messages": [{"role": "user", "content": prompt.text}],
        "max_tokens": settings.effective_max_tokens(),
        "temperature": settings.temperature,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if settings.effective_ignore_eos():
        body["ignore_eos"] = True
    return json.dumps(body, separators=(",", ":")).encode()


_HEADERS = {"content-type": "application/json", "accept": "text/event-stream"}


@asynccontextmanager
async def _streamed(client: httpx.AsyncClient, request: httpx.Request) -> AsyncIterator[httpx.Response]:
    resp = await client.send(request, stream=True)
    try:
        yield resp
    finally:
        await resp.aclose()


def _http_request(url: str, payload: bytes, timeout: httpx.Timeout) -> httpx.Request:
    # Built before a level's clock starts: building costs tens of microseconds, paid 256 times in a burst.
    return httpx.Request("POST", url, content=payload, headers=_HEADERS, extensions={"timeout": timeout.as_dict()})


async def _request(client: httpx.AsyncClient, request: httpx.Request, timeout_s: float) -> RequestRecord:
    """Send one streaming request and time its chunks; never raises for what the server or network did."""
    rec = RequestRecord()
    perf = time.perf_counter
    loads = json.loads
    sent = perf()
    last_token = sent
    finish: str | None = None
    started = False
    try:
        async with asyncio.timeout(timeout_s), _streamed(client, request) as resp:
            if resp.status_code != 200:
                body = (await resp.aread()).decode("utf-8", "replace")
                rec.error = f"http_{resp.status_code}"
                rec.message = _error_message(body) or resp.reason_phrase
                return rec
            buf = b""
            data: list[bytes] = []
            done = False
            chunks = resp.aiter_bytes()
            async for chunk in chunks:
                now = perf()
                started = True
                buf = buf + chunk if buf else chunk
                # SSE: lines end with \n (optionally \r\n); an event ends at a blank line; only `data:` matters.
                start = 0
                while (nl := buf.find(b"\n", start)) >= 0:
                    line = buf[start:nl]
                    start = nl + 1
                    if line.endswith(b"\r"):
                        line = line[:-1]
                    if line.startswith(b"data:"):
                        data.append(line[5:].lstrip())
                        continue
                    if line or not data:
                        continue  # a comment (`: ping`), an unused field, or a blank line between events
                    event = data[0] if len(data) == 1 else b"\n".join(data)
                    data = []
                    if event == b"[DONE]":
                        done = True
                        rec.e2e = now - sent
                        break
                    try:
                        obj = loads(event)
                    except ValueError:
                        rec.error, rec.message = "invalid_json", event[:200].decode("utf-8", "replace")
                        return rec
                    if not isinstance(obj, dict):
                        continue
                    err = obj.get("error")
                    if err is not None:
                        rec.error = f"stream_error:{_error_type(err)}"
                        rec.message = _error_message(err) or "error event in the stream"
                        return rec
                    choices = obj.get("choices")
                    if choices:
                        ch = choices[0]
                        delta = ch.get("delta") or {}
                        if delta.get("content"):
                            if rec.ttft is None:
                                rec.ttft = now - sent
                            else:
                                rec.itls.append(now - last_token)
                            last_token = now
                            rec.output_tokens += 1
                        if ch.get("finish_reason"):
                            finish = ch["finish_reason"]
                    usage = obj.get("usage")
                    if usage:
                        rec.output_tokens = int(usage.get("completion_tokens") or rec.output_tokens)
                        rec.prompt_tokens = int(usage.get("prompt_tokens") or 0)
                buf = buf[start:]
                if done:
                    # Read the rest of the body (the chunked terminator) so the connection goes back to the pool.
                    async for _ in chunks:
                        pass
                    break
            if rec.e2e is None:
                rec.e2e = perf() - sent
    except TimeoutError:
        rec.error, rec.message = "timeout", f"no complete response within {timeout_s:g} s"
        return rec
    except httpx.TimeoutException as e:
        rec.error, rec.message = "timeout", f"{type(e).__name__}: {e}"
        return rec
    except httpx.ConnectError as e:
        rec.error, rec.message = "connect_error", str(e) or type(e).__name__
        return rec
    except (httpx.RemoteProtocolError, httpx.ReadError) as e:
        if started:
            rec.error, rec.message = "incomplete:connection_closed", str(e) or type(e).__name__
        else:
            rec.error, rec.message = "connection_closed", str(e) or type(e).__name__
        return rec
    except httpx.HTTPError as e:
        rec.error, rec.message = f"transport:{type(e).__name__}", str(e)
        return rec
    if finish is None:
        rec.error = "incomplete:no_finish_reason"
        rec.message = "the stream ended without a finish_reason"
        return rec
    if rec.ttft is None:
        # A stream that finished without content (e.g. max_tokens=0): successful, but with no token timings.
        rec.output_tokens = rec.output_tokens or 0
    rec.ok = True
    return rec


def _error_type(err: Any) -> str:
    if isinstance(err, dict):
        for key in ("type", "code"):
            if err.get(key) not in (None, ""):
                return str(err[key])
    return "error"


def _error_message(err: Any) -> str:
    if isinstance(err, str):
        text = err
        try:
            err = json.loads(text)
        except ValueError:
            return text.strip()[:300]
    if isinstance(err, dict):
        inner = err.get("error", err)
        if isinstance(inner, dict):
            return str(inner.get("message") or inner.get("detail") or "")[:300]
        return str(inner)[:300]
    return str(err)[:300]


def _is_failed(rec: RequestRecord) -> bool:
    return not rec.ok and not (rec.error or "").startswith("incomplete:")


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

    def __init__(self, owner: _StreamTransport, wire: _Wire, length: int | None, chunked: bool, keep: bool) -> None:
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


class _StreamTransport(httpx.AsyncBaseTransport):
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


class _Connections:
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
            transport = _StreamTransport()
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


async def _run_load(
    conns: _Connections,
    url: str,
    payloads: list[bytes],
    load: Load,
    timeout_s: float,
    rng: random.Random,
    on_done: Callable[[RequestRecord], None],
    ramp_s: float = 0.0,
) -> tuple[list[RequestRecord], float]:
    """Send every payload under one load shape; returns the records (in payload order) and the wall time."""
    records: list[RequestRecord | None] = [None] * len(payloads)
    timeout = httpx.Timeout(timeout_s, connect=min(10.0, timeout_s))
    requests = [_http_request(url, p, timeout) for p in payloads]

    async def one(i: int, client: httpx.AsyncClient) -> None:
        rec = await _request(client, requests[i], timeout_s)
        records[i] = rec
        on_done(rec)

    # Clients are made before the clock starts: making 256 of them takes longer than a first token.
    clients = [conns.acquire() for _ in range(min(load.concurrency or 0, len(payloads)))]
    start = time.perf_counter()
    if load.concurrency is not None:
        next_i = 0

        async def worker(k: int, client: httpx.AsyncClient) -> None:
            nonlocal next_i
            if ramp_s > 0:
                await asyncio.sleep(start + ramp_s * k / len(clients) - time.perf_counter())
            try:
                while next_i < len(payloads):
                    i = next_i
                    next_i += 1
                    await one(i, client)
            finally:
                conns.release(client)

        await asyncio.gather(*(worker(k, c) for k, c in enumerate(clients)))
    else:
        rate = load.request_rate or 1.0
        sem = asyncio.Semaphore(load.max_concurrency) if load.max_concurrency else None

        async def capped(i: int) -> None:
            if sem is not None:
                await sem.acquire()
            client = conns.acquire()
            try:
                await one(i, client)
            finally:
                conns.release(client)
                if sem is not None:
                    sem.release()

        tasks: list[asyncio.Task[None]] = []
        due = start
        for i in range(len(payloads)):
            # Absolute arrival times, so a late wake-up does not push every later arrival back.
            due += rng.expovariate(rate)
            delay = due - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(capped(i)))
        await asyncio.gather(*tasks)
    wall = time.perf_counter() - start
    return [r for r in records if r is not None], wall


def _summarise(
    load: Load,
    runs: list[tuple[list[RequestRecord], float]],
    input_lens: int,
    max_error_rate: float,
) -> LevelResult:
    ttft: list[float] = []
    itl: list[float] = []
    tpot: list[float] = []
    e2e: list[float] = []
    errors: dict[str, int] = {}
    examples: dict[str, str] = {}
    samples: list[RepeatSample] = []
    total_ok = total_failed = total_incomplete = total_out = total_in = 0
    total_wall = 0.0
    for r, (records, wall) in enumerate(runs):
        ok = [rec for rec in records if rec.ok]
        failed = sum(1 for rec in records if _is_failed(rec))
        incomplete = len(records) - len(ok) - failed
        for rec in records:
            if not rec.ok:
                key = rec.error or "unknown"
                errors[key] = errors.get(key, 0) + 1
                examples.setdefault(key, rec.message)
        r_ttft = [rec.ttft for rec in ok if rec.ttft is not None]
        r_itl = [g for rec in ok for g in rec.itls]
        r_tpot = [
            (rec.e2e - rec.ttft) / (rec.output_tokens - 1)
            for rec in ok
            if rec.ttft is not None and rec.e2e is not None and rec.output_tokens > 1
        ]
        r_e2e = [rec.e2e for rec in ok if rec.e2e is not None]
        out_tokens = sum(rec.output_tokens for rec in ok)
        total_in += sum(rec.prompt_tokens for rec in ok) or input_lens * len(ok)
        ttft += r_ttft
        itl += r_itl
        tpot += r_tpot
        e2e += r_e2e
        stats = {
            "ttft": LatencyStats.of(r_ttft),
            "itl": LatencyStats.of(r_itl),
            "tpot": LatencyStats.of(r_tpot),
            "e2e": LatencyStats.of(r_e2e),
        }
        metrics: dict[str, float | None] = {
            "output_throughput": out_tokens / wall if wall > 0 else 0.0,
            "request_throughput": len(ok) / wall if wall > 0 else 0.0,
            "error_rate": (len(records) - len(ok)) / len(records) if records else 0.0,
        }
        for name in METRICS:
            if "." in name:
                group, stat = name.split(".", 1)
                metrics[name] = getattr(stats[group], stat)
        samples.append(
            RepeatSample(
                repeat=r,
                duration_s=wall,
                successful=len(ok),
                failed=failed,
                incomplete=incomplete,
                output_tokens=out_tokens,
                metrics=metrics,
            )
        )
        total_ok += len(ok)
        total_failed += failed
        total_incomplete += incomplete
        total_out += out_tokens
        total_wall += wall
    sent = total_ok + total_failed + total_incomplete
    error_rate = (total_failed + total_incomplete) / sent if sent else 0.0
    return LevelResult(
        load=load,
        label=load.label,
        sent=sent,
        successful=total_ok,
        failed=total_failed,
        incomplete=total_incomplete,
        errors=dict(sorted(errors.items(), key=lambda kv: -kv[1])),
        error_examples=examples,
        error_rate=error_rate,
        passed=error_rate <= max_error_rate and total_ok > 0,
        duration_s=total_wall,
        input_tokens=total_in,
        output_tokens=total_out,
        request_throughput=total_ok / total_wall if total_wall > 0 else 0.0,
        output_throughput=total_out / total_wall if total_wall > 0 else 0.0,
        ttft=LatencyStats.of(ttft),
        itl=LatencyStats.of(itl),
        tpot=LatencyStats.of(tpot),
        e2e=LatencyStats.of(e2e),
        repeats=samples,
    )


async def _fetch_model(client: httpx.AsyncClient, base_url: str) -> str:
    url = f"{base_url}/v1/models"
    try:
        resp = await client.get(url, timeout=10.0)
    except httpx.HTTPError as e:
        raise BenchError(
            f"cannot reach {url}: {type(e).__name__}: {e}", hint="is the server up? check the URL and port"
        ) from e
    if resp.status_code != 200:
        raise BenchError(f"{url} answered HTTP {resp.status_code}", hint="pass the model name with --model")
    try:
        data = resp.json()["data"]
        return str(data[0]["id"])
    except (ValueError, KeyError, IndexError, TypeError) as e:
        raise BenchError(f"{url} did not list a model", hint="pass the model name with --model") from e


async def _bench(
    base_url: str,
    settings: BenchSettings,
    model: str | None,
    progress: Callable[[BenchEvent], None] | None,
) -> BenchResult:
    emit = progress or (lambda _e: None)
    loads = settings.loads()
    timeout = httpx.Timeout(settings.timeout_s, connect=min(10.0, settings.timeout_s))
    started_at = datetime.now(UTC).isoformat(timespec="seconds")
    t0 = time.perf_counter()
    url = base_url + CHAT_PATH
    conns = _Connections(timeout, plain_http=base_url.startswith("http://"))
    try:
        probe = conns.acquire()
        model_name = model or await _fetch_model(probe, base_url)
        conns.release(probe)
        levels: list[LevelResult] = []
        for li, load in enumerate(loads):
            label = load.label
            total = settings.requests * settings.repeats
            emit(BenchEvent("level_start", label, li, len(loads), 0, total))
            if settings.warmup:
                emit(BenchEvent("warmup", label, li, len(loads), 0, total))
                warm = make_prompts(settings, settings.warmup, offset=10_000_000)
                warm_load = Load(concurrency=min(settings.warmup, load.concurrency or load.max_concurrency or 8))
                await _run_load(
                    conns,
                    url,
                    [_payload(settings, model_name, p) for p in warm],
                    warm_load,
                    settings.timeout_s,
                    random.Random(settings.seed),
                    lambda _r: None,
                )
            runs: list[tuple[list[RequestRecord], float]] = []
            done = failed = 0
            input_lens = 0
            for rep in range(settings.repeats):
                emit(BenchEvent("repeat", label, li, len(loads), done, total, failed, rep))
                prompts = make_prompts(settings, settings.requests, offset=rep * settings.requests)
                input_lens = sum(p.input_len for p in prompts) // max(1, len(prompts))
                payloads = [_payload(settings, model_name, p) for p in prompts]

                def on_done(
                    rec: RequestRecord, _rep: int = rep, _label: str = label, _li: int = li, _total: int = total
                ) -> None:
                    nonlocal done, failed
                    done += 1
                    failed += 0 if rec.ok else 1
                    emit(BenchEvent("request", _label, _li, len(loads), done, _total, failed, _rep))

                runs.append(
                    await _run_load(
                        conns,
                        url,
                        payloads,
                        load,
                        settings.timeout_s,
                        random.Random(settings.seed * 1_000_003 + li * 1009 + rep),
                        on_done,
                        settings.ramp_s,
                    )
                )
            result = _summarise(load, runs, input_lens, settings.max_error_rate)
            levels.append(result)
            emit(BenchEvent("level_end", label, li, len(loads), done, total, failed, settings.repeats - 1, result))
    finally:
        await conns.aclose()
    return BenchResult(
        base_url=base_url,
        model=model_name,
        started_at=started_at,
        duration_s=time.perf_counter() - t0,
        settings=settings,
        levels=levels,
        passed=all(lv.passed for lv in levels),
        client={
            "campaign.bench": str(RESULT_SCHEMA_VERSION),
            "httpx": httpx.__version__,
            "python": platform.python_version(),
        },
    )


def run_bench(
    base_url: str,
    settings: BenchSettings,
    *,
    model: str | None = None,
    progress: Callable[[BenchEvent], None] | None = None,
) -> BenchResult:
    """Load the server at ``base_url`` level by level and return what was measured.

    Runs its own event loop (call it from synchronous code). When ``model`` is None the first model listed by
    ``/v1/models`` is used. Raises ``BenchError`` only when the bench cannot run at all (the server is
    unreachable, no model is listed); failed requests are counted in the result, and ``result.passed`` is False
    when any level's error rate exceeds ``settings.max_error_rate``.
    """
    base = base_url.rstrip("/")
    if base.endswith(CHAT_PATH):
        base = base[: -len(CHAT_PATH)]
    if base.endswith("/v1"):
        base = base[:-3]
    if not base.startswith(("http://", "https://")):
        raise BenchError(f"not an http(s) URL: {base_url!r}", hint="for example http://127.0.0.1:30000")
    return asyncio.run(_bench(base, settings, model, progress))
