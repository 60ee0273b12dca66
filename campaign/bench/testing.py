"""A streaming chat endpoint that emits tokens on a known schedule: the ruler the load generator is measured with.

Run as a process (``python -m campaign.bench.testing --port 0 --ttft-ms 50 --itl-ms 20``); it prints
``LISTENING <port>`` once it accepts connections. It speaks just enough HTTP/1.1 (keep-alive, chunked responses)
for an OpenAI client: ``GET /v1/models``, ``GET /health``, ``POST /v1/chat/completions`` and
``POST /v1/completions`` (streaming; without ``stream`` the whole reply at once, the exact number when the prompt
asks ``What is A×B?``, so a smoke check passes against it), ``POST /tokenize`` (one token per whitespace-separated
word, answered as SGLang and vLLM answer: ``{"tokens", "count"}``) and ``GET /stats`` (how late the server itself
sent its chunks, so a client's error can be told from the server's).

Schedule of one request, from the moment its body has been read: a role-only chunk at once, then content token
``i`` (0-based) at ``ttft + i * itl``, then the finish chunk, the usage chunk and ``[DONE]`` right after the last
token. Deadlines are absolute, so a late wake-up does not shift the tokens after it. The number of tokens is the
request's ``max_tokens`` unless ``--tokens`` fixes it. Its ``usage.prompt_tokens`` counts words, like /tokenize.

Load-dependent latency, for the SLA search's tests: with ``--ttft-per-inflight-ms k`` a request's TTFT is
``ttft + k * n``, where ``n`` counts the generation requests in flight when it was read (itself included), so the
highest concurrency that meets a TTFT bound is known in advance. ``--api-key`` makes generation routes answer 401
to a request without ``Authorization: Bearer KEY``.

Punctuality. By default the endpoint sleeps between events in ``select()``, so each wake-up (to read a request, or
to send a token that falls due) costs the host's wake-up latency: about 0.2-0.5 ms on a virtual machine whose idle
vCPUs halt. ``--spin`` makes it a ruler that does not wobble: it busy-polls epoll with a zero timeout, so it reads a
request as soon as the bytes land and sends each token at its deadline, at the cost of one whole core. Benchmarks
use it; tests do not (they assert counts and coarse timings, and CI's two cores are better spent on the tests).

Faults, for the tests of failure accounting (every ``--fail-every``-th request: the first request is spared unless
``--fail-every`` is 1, so a bench's first test request passes and the faults land among the measured ones):
``error_event`` (an OpenAI error event mid-stream under HTTP 200, then ``[DONE]``), ``http_500``, ``drop`` (the
connection is cut mid-stream) and ``no_finish`` (``[DONE]`` without a ``finish_reason``).

``ScheduledServer`` starts one as a subprocess for tests and benchmark scripts; ``measured_level`` runs one level
against it and reads the endpoint's own lateness for the measured part (``endpoint_stats``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import re
import selectors
import subprocess
import sys
import time
from pathlib import Path
from types import TracebackType
from typing import Any

import httpx

from campaign.bench import run_bench
from campaign.records import BenchEvent, BenchSettings, LevelResult

MODEL_ID = "scheduled"
FAULTS = ("none", "error_event", "http_500", "drop", "no_finish")


class _Stats:
    """Server-side lateness of first tokens and of every content chunk, in seconds."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.first: list[float] = []
        self.chunk: list[float] = []
        self.requests = 0

    def summary(self) -> dict[str, Any]:
        def stats(xs: list[float]) -> dict[str, float | int]:
            if not xs:
                return {"count": 0}
            s = sorted(xs)
            return {
                "count": len(s),
                "mean_ms": 1000 * math.fsum(s) / len(s),
                "median_ms": 1000 * s[len(s) // 2],
                "p99_ms": 1000 * s[min(len(s) - 1, int(len(s) * 0.99))],
                "max_ms": 1000 * s[-1],
            }

        return {"requests": self.requests, "first_token_late": stats(self.first), "chunk_late": stats(self.chunk)}


class _Server:
    def __init__(self, args: argparse.Namespace) -> None:
        self.ttft = args.ttft_ms / 1000.0
        self.itl = args.itl_ms / 1000.0
        self.tokens: int | None = args.tokens
        self.fault: str = args.fail_mode
        self.fail_every: int = args.fail_every
        self.fail_after: int = args.fail_after
        self.per_inflight = args.ttft_per_inflight_ms / 1000.0
        self.api_key: str | None = args.api_key
        self.tokenize: bool = not args.no_tokenize
        self.count = 0
        self.inflight = 0
        self.stats = _Stats()

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                method, target, _ = lines[0].split(" ", 2)
                headers = {k.strip().lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:] if ln)}
                length = int(headers.get("content-length", "0"))
                body = await reader.readexactly(length) if length else b""
                if not await self.route(method, target, body, writer, headers):
                    return
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    def simple(self, writer: asyncio.StreamWriter, status: str, obj: Any) -> None:
        data = json.dumps(obj).encode()
        writer.write(
            f"HTTP/1.1 {status}\r\ncontent-type: application/json\r\ncontent-length: {len(data)}\r\n\r\n".encode()
            + data
        )

    async def route(
        self, method: str, target: str, body: bytes, writer: asyncio.StreamWriter, headers: dict[str, str]
    ) -> bool:
        path = target.split("?", 1)[0]
        if (
            self.api_key is not None
            and path.startswith(("/v1/chat", "/v1/completions"))
            and headers.get("authorization") != f"Bearer {self.api_key}"
        ):
            self.simple(writer, "401 Unauthorized", {"error": {"message": "invalid API key", "code": 401}})
            await writer.drain()
            return True
        if method == "GET" and path == "/v1/models":
            self.simple(writer, "200 OK", {"object": "list", "data": [{"id": MODEL_ID, "object": "model"}]})
        elif method == "GET" and path == "/health":
            self.simple(writer, "200 OK", {"ok": True})
        elif method == "GET" and path == "/stats":
            self.simple(writer, "200 OK", self.stats.summary())
        elif method == "POST" and path == "/stats/reset":
            self.stats.reset()
            self.simple(writer, "200 OK", {"ok": True})
        elif method == "POST" and path == "/tokenize" and self.tokenize:
            words = str(json.loads(body).get("prompt", "")).split()
            self.simple(writer, "200 OK", {"tokens": list(range(len(words))), "count": len(words)})
        elif method == "POST" and path in ("/v1/chat/completions", "/v1/completions"):
            self.inflight += 1
            try:
                return await self.chat(body, writer, chat=path == "/v1/chat/completions")
            finally:
                self.inflight -= 1
        else:
            self.simple(writer, "404 Not Found", {"error": {"message": f"no route {method} {path}"}})
        await writer.drain()
        return True

    async def chat(self, body: bytes, writer: asyncio.StreamWriter, *, chat: bool) -> bool:
        loop = asyncio.get_running_loop()
        lt0 = loop.time()
        ttft = self.ttft + self.per_inflight * self.inflight
        req = json.loads(body)
        if not req.get("stream", False):
            await asyncio.sleep(ttft)
            self.simple(writer, "200 OK", _whole_reply(req, chat=chat))
            await writer.drain()
            return True
        n = (
            self.tokens
            if self.tokens is not None
            else int(req.get("max_tokens") or req.get("max_completion_tokens") or 16)
        )
        self.count += 1
        self.stats.requests += 1
        fault = self.fault if self.fault != "none" and self.count % self.fail_every == 0 else "none"
        if fault == "http_500":
            self.simple(writer, "500 Internal Server Error", {"error": {"message": "scheduled failure", "code": 500}})
            await writer.drain()
            return True
        writer.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncache-control: no-cache\r\n"
            b"transfer-encoding: chunked\r\n\r\n"
        )
        if chat:
            head = (
                '{"id":"r","object":"chat.completion.chunk","model":"' + MODEL_ID + '","choices":[{"index":0,"delta":'
            )
            opening, token, closing = '{"role":"assistant","content":""}', '{"content":"t"}', "{}"
        else:
            head = '{"id":"r","object":"text_completion","model":"' + MODEL_ID + '","choices":[{"index":0,"text":'
            opening, token, closing = '""', '"t"', '""'

        def event(s: str) -> None:
            data = b"data: " + s.encode() + b"\n\n"
            writer.write(b"%x\r\n%s\r\n" % (len(data), data))

        # The role chunk carries the moment the request was read (CLOCK_MONOTONIC, which time.perf_counter()
        # also reads on Linux), so a benchmark can split a client's TTFT into send, schedule and receive.
        event(head + opening + ',"finish_reason":null}],"received_at":' + f"{lt0:.9f}}}")
        await writer.drain()
        for i in range(n):
            due = lt0 + ttft + i * self.itl
            delay = due - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            if fault in ("error_event", "drop") and i == self.fail_after:
                if fault == "drop":
                    writer.transport.abort()
                    return False
                event('{"error":{"message":"scheduled failure mid-stream","type":"internal_error","code":500}}')
                event("[DONE]")
                writer.write(b"0\r\n\r\n")
                await writer.drain()
                return True
            event(head + token + ',"finish_reason":null}]}')
            late = loop.time() - due
            if i == 0:
                self.stats.first.append(late)
            self.stats.chunk.append(late)
            if writer.transport.get_write_buffer_size() > 65536:
                await writer.drain()
        if fault != "no_finish":
            event(head + closing + ',"finish_reason":"length"}]}')
        texts = [str(m.get("content", "")) for m in req.get("messages", [])] if chat else [str(req.get("prompt", ""))]
        prompt = sum(len(t.split()) for t in texts)
        event(
            '{"id":"r","object":"chat.completion.chunk","model":"' + MODEL_ID + '","choices":[],'
            f'"usage":{{"prompt_tokens":{prompt},"completion_tokens":{n},"total_tokens":{prompt + n}}}}}'
        )
        event("[DONE]")
        writer.write(b"0\r\n\r\n")
        await writer.drain()
        return True


_QUESTION = re.compile(r"What is (\d+)\s*([×*x+-])\s*(\d+)\?")


def _whole_reply(req: dict[str, Any], *, chat: bool) -> dict[str, Any]:
    """A request without streaming: its answer at once, the exact number when the prompt asks ``What is A×B?`` (so
    a smoke check passes against the endpoint), else one ``t`` per token."""
    texts = [str(m.get("content", "")) for m in req.get("messages", [])] if chat else [str(req.get("prompt", ""))]
    m = _QUESTION.search(" ".join(texts))
    if m is not None:
        a, op, b = int(m.group(1)), m.group(2), int(m.group(3))
        text = str(a + b if op == "+" else a - b if op == "-" else a * b)
    else:
        text = "t" * int(req.get("max_tokens") or 16)
    prompt = sum(len(t.split()) for t in texts)
    usage = {"prompt_tokens": prompt, "completion_tokens": 1, "total_tokens": prompt + 1}
    if chat:
        message = {"role": "assistant", "content": text}
        choice: dict[str, Any] = {"index": 0, "message": message, "finish_reason": "stop"}
        return {"id": "r", "object": "chat.completion", "model": MODEL_ID, "choices": [choice], "usage": usage}
    choice = {"index": 0, "text": text, "finish_reason": "stop"}
    return {"id": "r", "object": "text_completion", "model": MODEL_ID, "choices": [choice], "usage": usage}


async def _main(args: argparse.Namespace) -> None:
    server = _Server(args)
    srv = await asyncio.start_server(server.handle, "127.0.0.1", args.port, backlog=1024)
    port = srv.sockets[0].getsockname()[1]
    print(f"LISTENING {port}", flush=True)
    async with srv:
        await srv.serve_forever()


class _SpinSelector(selectors.EpollSelector):
    """An epoll selector that never sleeps: it polls with a zero timeout until an event arrives or the timeout ends.

    Zero-timeout polls sidestep both epoll's rounding of timeouts up to whole milliseconds and the wake-up latency
    of a sleeping process; epoll (unlike select) has no 1024-descriptor limit.
    """

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        end = None if timeout is None else time.monotonic() + timeout
        while True:
            ready = super().select(0)
            if ready or (end is not None and time.monotonic() >= end):
                return ready


def _loop(spin: bool) -> asyncio.AbstractEventLoop:
    if spin:
        return asyncio.SelectorEventLoop(_SpinSelector())
    # epoll rounds every timeout up to a whole millisecond, so each token would be sent up to 1 ms late;
    # select() takes microseconds. It handles at most 1024 descriptors: keep a bench below ~1000 connections.
    return asyncio.SelectorEventLoop(selectors.SelectSelector())


def main(argv: list[str] | None = None) -> None:
    """Parse flags and serve until killed."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--ttft-ms", type=float, default=50.0)
    p.add_argument("--itl-ms", type=float, default=20.0)
    p.add_argument("--tokens", type=int, default=None)
    p.add_argument("--fail-mode", choices=FAULTS, default="none")
    p.add_argument("--fail-every", type=int, default=1)
    p.add_argument("--fail-after", type=int, default=2, help="content tokens sent before a mid-stream fault")
    p.add_argument("--ttft-per-inflight-ms", type=float, default=0.0, help="TTFT grows by this per request in flight")
    p.add_argument("--api-key", default=None, help="answer 401 without Authorization: Bearer KEY")
    p.add_argument("--no-tokenize", action="store_true", help="answer 404 to /tokenize, as a server without one")
    p.add_argument("--spin", action="store_true", help="busy-poll instead of sleeping (punctual; takes a core)")
    args = p.parse_args(argv)
    try:
        loop = _loop(args.spin)
        try:
            loop.run_until_complete(_main(args))
        finally:
            loop.close()
    except KeyboardInterrupt:
        pass


class ScheduledServer:
    """The scheduled endpoint in its own process, for a ``with`` block: ``url`` is its base URL."""

    def __init__(
        self,
        *,
        ttft_ms: float = 50.0,
        itl_ms: float = 20.0,
        tokens: int | None = None,
        fail_mode: str = "none",
        fail_every: int = 1,
        fail_after: int = 2,
        spin: bool = False,
        ttft_per_inflight_ms: float = 0.0,
        api_key: str | None = None,
        tokenize: bool = True,
    ) -> None:
        self.argv = [
            sys.executable,
            "-m",
            "campaign.bench.testing",
            "--ttft-ms",
            str(ttft_ms),
            "--itl-ms",
            str(itl_ms),
            "--fail-mode",
            fail_mode,
            "--fail-every",
            str(fail_every),
            "--fail-after",
            str(fail_after),
            "--ttft-per-inflight-ms",
            str(ttft_per_inflight_ms),
        ]
        if api_key is not None:
            self.argv += ["--api-key", api_key]
        if not tokenize:
            self.argv.append("--no-tokenize")
        if tokens is not None:
            self.argv += ["--tokens", str(tokens)]
        if spin:
            self.argv.append("--spin")
        self.proc: subprocess.Popen[str] | None = None
        self.url = ""

    def __enter__(self) -> ScheduledServer:
        root = Path(__file__).resolve().parents[2]
        env = {**os.environ, "PYTHONPATH": str(root)}
        self.proc = subprocess.Popen(
            self.argv, stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True, cwd=root, env=env
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line.startswith("LISTENING "):
            self.proc.kill()
            self.proc.wait()
            self.proc.stdout.close()
            raise RuntimeError(f"scheduled server did not start: {line!r}")
        self.url = f"http://127.0.0.1:{int(line.split()[1])}"
        return self

    def __exit__(self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        if self.proc is not None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
            if self.proc.stdout is not None:
                self.proc.stdout.close()  # its pipe, or a ResourceWarning when it is collected


def endpoint_stats(url: str, reset: bool = False) -> dict[str, Any]:
    """The endpoint's /stats (its own lateness); with ``reset``, zero them instead."""
    if reset:
        httpx.post(url + "/stats/reset")
        return {}
    stats: dict[str, Any] = httpx.get(url + "/stats").json()
    return stats


def measured_level(url: str, settings: BenchSettings, model: str) -> tuple[LevelResult, float, float, dict[str, Any]]:
    """Run one level; returns it with the client's CPU and wall seconds and the endpoint's /stats of its measured part.

    The warm-up (one request per stream) opens every connection the level uses; the progress events tell when the
    measured part begins, so the endpoint's counters and the CPU clock start there.
    """
    marks: dict[str, float] = {}

    def progress(ev: BenchEvent) -> None:
        if ev.kind == "repeat":
            endpoint_stats(url, reset=True)
            marks["cpu"], marks["wall"] = time.process_time(), time.perf_counter()
        elif ev.kind == "level_end":
            marks["cpu"], marks["wall"] = time.process_time() - marks["cpu"], time.perf_counter() - marks["wall"]

    result = run_bench(url, settings, model=model, progress=progress)
    return result.levels[0], marks["cpu"], marks["wall"], endpoint_stats(url)


if __name__ == "__main__":
    main()
