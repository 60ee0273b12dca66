"""The load generator: streaming requests over /v1/chat/completions or /v1/completions, measured as vLLM and SGLang do.

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
- Throughput: completed requests (and their output tokens; input tokens; both) divided by the wall time of the repeat.
- Input lengths: with random prompts and a server that has a tokenize endpoint, each prompt is fitted to exactly
  ``input_len`` tokens of the served model (``BenchResult.input_lengths == "tokenize"``; the chat template adds its
  own tokens, so use ``endpoint: completions`` for exact totals); otherwise ``input_len`` words, approximate.

Before any level, one test request: when it fails the bench stops there with a ``BenchError`` that carries the
server's message (a server that cannot serve is not sent hundreds of requests). With ``settings.sla`` the levels
are an SLA search's trials (``campaign.bench.sla``) and the result carries its answer (``BenchResult.sla``).

A request is *successful* when its stream ends with a ``finish_reason`` and no error; *failed* when it never
produced a valid stream (connection error, HTTP status other than 200, timeout) or when an error event arrived
mid-stream under HTTP 200; *incomplete* when the stream began but ended without a ``finish_reason``. Every
unsuccessful request is counted in ``errors`` under its type, and a level whose error rate exceeds
``max_error_rate`` fails the bench.

Rooms: ``prompts`` (the fixed-seed requests), ``wire`` (the HTTP/1.1 client), ``sse`` (the stream parser, pure),
``request`` (one timed request), ``load`` (load shapes and the summary of a level), ``sla`` (the search's
bisection), this module (the driver), and
``testing`` (the scheduled endpoint the bench itself is measured against). The records it returns live in
``campaign.records``.
"""

from __future__ import annotations

import asyncio
import platform
import random
import time
from collections.abc import Awaitable, Callable, Mapping
from datetime import UTC, datetime

import httpx

from campaign.bench.load import run_load, summarise
from campaign.bench.prompts import PROMPT_WORDS, Prompt, fit_prompts, make_prompts, payload
from campaign.bench.request import http_request, send
from campaign.bench.sla import Bisection
from campaign.bench.sse import RequestRecord
from campaign.bench.wire import Connections
from campaign.errors import BenchError
from campaign.interruption import interruptible
from campaign.records import (
    RESULT_SCHEMA_VERSION,
    BenchEvent,
    BenchResult,
    BenchSettings,
    LevelResult,
    Load,
    RequestRow,
    SlaResult,
)
from campaign.redaction import MASK, bench_secrets, mask_bench

__all__ = ["CHAT_PATH", "COMPLETIONS_PATH", "PROMPT_WORDS", "Prompt", "make_prompts", "run_bench"]

CHAT_PATH = "/v1/chat/completions"
COMPLETIONS_PATH = "/v1/completions"
#: Where vLLM and SGLang count a prompt's tokens with the served model's tokenizer (asked in this order).
TOKENIZE_PATHS = ("/tokenize", "/v1/tokenize")
#: Warm-up prompts come from far along the seeded sequence, so they never repeat a measured one.
WARMUP_OFFSET = 10_000_000


async def _fetch_model(client: httpx.AsyncClient, base_url: str, headers: Mapping[str, str]) -> str:
    url = f"{base_url}/v1/models"
    try:
        resp = await client.get(url, timeout=10.0, headers=headers)
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


async def _token_counter(
    client: httpx.AsyncClient, base_url: str, model: str, headers: Mapping[str, str]
) -> Callable[[str], Awaitable[int]] | None:
    """The server's own tokenizer as a counter (vLLM's and SGLang's /tokenize), or None when it has none."""

    async def count_at(url: str, text: str) -> int | None:
        try:
            resp = await client.post(url, json={"model": model, "prompt": text}, headers=headers, timeout=10.0)
            body = resp.json() if resp.status_code == 200 else None
        except (httpx.HTTPError, ValueError):
            return None
        if not isinstance(body, dict):
            return None
        if isinstance(body.get("count"), int):
            return int(body["count"])
        return len(body["tokens"]) if isinstance(body.get("tokens"), list) else None

    for path in TOKENIZE_PATHS:
        url = base_url + path
        if await count_at(url, "hello world") is not None:

            async def count(text: str, _url: str = url) -> int:
                n = await count_at(_url, text)
                if n is None:
                    raise BenchError(f"{_url} stopped answering while prompts were fitted to input_len")
                return n

            return count
    return None


def _first_request_hint(error: str, path: str) -> str:
    if error in ("http_401", "http_403"):
        return "the server wants credentials: pass --api-key KEY or --header 'Name: value'"
    if error == "http_404":
        other = "chat" if path == COMPLETIONS_PATH else "completions"
        return f"does the server serve {path}? try --endpoint {other}, and check --model"
    if error.startswith("http_4"):
        return "the server refused the request: check --model, --max-tokens and the prompt length against its limits"
    if error == "timeout":
        return "no answer in time: raise timeout_s, or check that the server is not stuck (its log)"
    return "check the server's log; the bench sent nothing more"


class _Prompts:
    """The prompts of one bench, fitted to ``input_len`` tokens when a counter is known; each fitted once."""

    def __init__(self, settings: BenchSettings, counter: Callable[[str], Awaitable[int]] | None) -> None:
        self.settings = settings
        self.counter = counter
        self._fitted: dict[int, Prompt] = {}

    async def get(self, count: int, offset: int) -> list[Prompt]:
        if self.counter is None:
            return make_prompts(self.settings, count, offset=offset)
        for i in range(offset, offset + count):
            if i not in self._fitted:
                (self._fitted[i],) = await fit_prompts(self.settings, 1, i, self.counter)
        return [self._fitted[i] for i in range(offset, offset + count)]


async def _bench(
    base_url: str,
    settings: BenchSettings,
    model: str | None,
    progress: Callable[[BenchEvent], None] | None,
    on_request: Callable[[RequestRow], None] | None,
) -> BenchResult:
    emit = progress or (lambda _e: None)
    headers = settings.request_headers()
    secrets = bench_secrets(settings)

    def redact(text: str) -> str:
        for value in secrets:
            text = text.replace(value, MASK)
        return text

    timeout = httpx.Timeout(settings.timeout_s, connect=min(10.0, settings.timeout_s))
    started_at = datetime.now(UTC).isoformat(timespec="seconds")
    t0 = time.perf_counter()
    path = COMPLETIONS_PATH if settings.endpoint == "completions" else CHAT_PATH
    url = base_url + path
    conns = Connections(timeout, plain_http=base_url.startswith("http://"))
    sla: SlaResult | None = None
    levels: list[LevelResult] = []
    try:
        probe = conns.acquire()
        try:
            model_name = model or await _fetch_model(probe, base_url, headers)
            counter = (
                await _token_counter(probe, base_url, model_name, headers) if settings.prompts != "arithmetic" else None
            )
        finally:
            conns.release(probe)
        prompts = _Prompts(settings, counter)
        warm = await prompts.get(max(1, settings.warmup), WARMUP_OFFSET)

        # One request before any level: a server that cannot serve is told after one request, not after all.
        client = conns.acquire()
        try:
            first = await send(
                client, http_request(url, payload(settings, model_name, warm[0]), timeout, headers), settings.timeout_s
            )
        finally:
            conns.release(client)
        if not first.ok:
            raise BenchError(
                f"the first request to {url} failed ({first.error}): "
                f"{redact(first.message).rstrip('. ') or 'no message'}; no load was sent",
                hint=_first_request_hint(first.error or "", path),
            )

        async def measure(li: int, load: Load, count: int) -> LevelResult:
            label = load.label
            total = settings.requests * settings.repeats
            emit(BenchEvent("level_start", label, li, count, 0, total))
            if settings.warmup:
                emit(BenchEvent("warmup", label, li, count, 0, total))
                warm_load = Load(concurrency=min(settings.warmup, load.concurrency or load.max_concurrency or 8))
                await run_load(
                    conns,
                    url,
                    [payload(settings, model_name, p) for p in warm[: settings.warmup]],
                    warm_load,
                    settings.timeout_s,
                    random.Random(settings.seed),
                    lambda _r: None,
                    headers=headers,
                )
            runs: list[tuple[list[RequestRecord], float]] = []
            done = failed = 0
            input_lens = 0
            for rep in range(settings.repeats):
                emit(BenchEvent("repeat", label, li, count, done, total, failed, rep))
                batch = await prompts.get(settings.requests, rep * settings.requests)
                input_lens = sum(p.input_len for p in batch) // max(1, len(batch))
                payloads = [payload(settings, model_name, p) for p in batch]

                def on_done(rec: RequestRecord, _rep: int = rep) -> None:
                    nonlocal done, failed
                    done += 1
                    failed += 0 if rec.ok else 1
                    if on_request is not None:
                        on_request(_row(label, _rep, done - 1, rec, t0, redact))
                    emit(BenchEvent("request", label, li, count, done, total, failed, _rep))

                runs.append(
                    await run_load(
                        conns,
                        url,
                        payloads,
                        load,
                        settings.timeout_s,
                        random.Random(settings.seed * 1_000_003 + li * 1009 + rep),
                        on_done,
                        settings.ramp_s,
                        headers,
                    )
                )
            result = summarise(load, runs, input_lens, settings.max_error_rate)
            result.error_examples = {k: redact(v) for k, v in result.error_examples.items()}
            emit(BenchEvent("level_end", label, li, count, done, total, failed, settings.repeats - 1, result))
            return result

        if settings.sla is None:
            loads = settings.loads()
            for li, load in enumerate(loads):
                levels.append(await measure(li, load, len(loads)))
        else:
            search = Bisection(settings.sla)
            while (value := search.next()) is not None:
                level = await measure(len(levels), settings.sla.load(value, settings.max_concurrency), search.bound)
                levels.append(level)
                search.record(value, level)
            sla = search.result()
    finally:
        await conns.aclose()
    return BenchResult(
        base_url=base_url,
        model=model_name,
        started_at=started_at,
        duration_s=time.perf_counter() - t0,
        settings=mask_bench(settings),
        levels=levels,
        passed=sla.max is not None if sla is not None else all(lv.passed for lv in levels),
        client={
            "campaign.bench": str(RESULT_SCHEMA_VERSION),
            "httpx": httpx.__version__,
            "python": platform.python_version(),
        },
        input_lengths="tokenize" if counter is not None else "approximate",
        sla=sla,
    )


def _row(
    label: str, repeat: int, index: int, rec: RequestRecord, t0: float, redact: Callable[[str], str]
) -> RequestRow:
    def ms(s: float | None) -> float | None:
        return None if s is None else s * 1000.0

    return RequestRow(
        level=label,
        repeat=repeat,
        index=index,
        start_s=rec.start - t0,
        ok=rec.ok,
        error=rec.error,
        message=redact(rec.message),
        ttft_ms=ms(rec.ttft),
        e2e_ms=ms(rec.e2e),
        itl_ms=[g * 1000.0 for g in rec.itls],
        prompt_tokens=rec.prompt_tokens,
        output_tokens=rec.output_tokens,
    )


def run_bench(
    base_url: str,
    settings: BenchSettings,
    *,
    model: str | None = None,
    progress: Callable[[BenchEvent], None] | None = None,
    on_request: Callable[[RequestRow], None] | None = None,
) -> BenchResult:
    """Load the server at ``base_url`` level by level and return what was measured.

    Runs its own event loop (call it from synchronous code). When ``model`` is None the first model listed by
    ``/v1/models`` is used. Raises ``BenchError`` when the bench cannot run at all (the server is unreachable, no
    model is listed, the first test request fails: then nothing more is sent); later failed requests are counted
    in the result, and ``result.passed`` is False when any level's error rate exceeds ``settings.max_error_rate``
    (for an SLA search: when not even its lowest load met the SLOs). ``on_request`` receives every measured
    request as a ``RequestRow``. A signal that arrives while the bench runs cancels it, whatever it awaits, and its
    ``Interrupted`` is raised from here (``campaign.interruption.interruptible``).
    """
    base = base_url.rstrip("/")
    for path in (CHAT_PATH, COMPLETIONS_PATH):
        if base.endswith(path):
            base = base[: -len(path)]
    if base.endswith("/v1"):
        base = base[:-3]
    if not base.startswith(("http://", "https://")):
        raise BenchError(f"not an http(s) URL: {base_url!r}", hint="for example http://127.0.0.1:30000")
    try:
        port = httpx.URL(base).port
    except httpx.InvalidURL as e:
        raise BenchError(f"not a valid URL: {base_url!r} ({e})", hint="for example http://127.0.0.1:30000") from e
    if port is not None and not 0 < port < 65536:
        raise BenchError(f"port {port} of {base_url!r} is out of range", hint="a TCP port is 1 to 65535")
    return asyncio.run(interruptible(_bench(base, settings, model, progress, on_request)))
