"""One streaming chat request: sent over a client, timed chunk by chunk, never raising for what the server did."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager

import httpx

from campaign.bench.sse import ChatStream, RequestRecord, error_message

_HEADERS = {"content-type": "application/json", "accept": "text/event-stream"}


@asynccontextmanager
async def _streamed(client: httpx.AsyncClient, request: httpx.Request) -> AsyncIterator[httpx.Response]:
    resp = await client.send(request, stream=True)
    try:
        yield resp
    finally:
        await resp.aclose()


def http_request(
    url: str, payload: bytes, timeout: httpx.Timeout, headers: Mapping[str, str] | None = None
) -> httpx.Request:
    """The POST of one streaming request, with the bench's own headers (an API key) beside the JSON ones."""
    # Built before a level's clock starts: building costs tens of microseconds, paid 256 times in a burst.
    head = {**_HEADERS, **headers} if headers else _HEADERS
    return httpx.Request("POST", url, content=payload, headers=head, extensions={"timeout": timeout.as_dict()})


async def send(client: httpx.AsyncClient, request: httpx.Request, timeout_s: float) -> RequestRecord:
    """Send one streaming request and time its chunks; never raises for what the server or network did."""
    rec = RequestRecord()
    perf = time.perf_counter
    sent = perf()
    rec.start = sent
    finish: str | None = None
    started = False
    try:
        async with asyncio.timeout(timeout_s), _streamed(client, request) as resp:
            if resp.status_code != 200:
                body = (await resp.aread()).decode("utf-8", "replace")
                rec.error = f"http_{resp.status_code}"
                rec.message = error_message(body) or resp.reason_phrase
                return rec
            stream = ChatStream(rec, sent)
            chunks = resp.aiter_bytes()
            async for chunk in chunks:
                started = True
                if stream.feed(chunk, perf()):
                    if rec.error is not None:
                        return rec
                    # Read the rest of the body (the chunked terminator) so the connection goes back to the pool.
                    async for _ in chunks:
                        pass
                    break
            finish = stream.finish
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
