"""Load shaping: a level's requests sent at a fixed concurrency or as Poisson arrivals, then summarised."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable, Mapping

import httpx

from campaign.bench.request import http_request, send
from campaign.bench.sse import RequestRecord
from campaign.bench.wire import Connections
from campaign.interruption import checkpoint
from campaign.records import METRICS, LatencyStats, LevelResult, Load, RepeatSample


async def run_load(
    conns: Connections,
    url: str,
    payloads: list[bytes],
    load: Load,
    timeout_s: float,
    rng: random.Random,
    on_done: Callable[[RequestRecord], None],
    ramp_s: float = 0.0,
    headers: Mapping[str, str] | None = None,
) -> tuple[list[RequestRecord], float]:
    """Send every payload under one load shape; returns the records (in payload order) and the wall time."""
    records: list[RequestRecord | None] = [None] * len(payloads)
    timeout = httpx.Timeout(timeout_s, connect=min(10.0, timeout_s))
    requests = [http_request(url, p, timeout, headers) for p in payloads]

    async def one(i: int, client: httpx.AsyncClient) -> None:
        checkpoint()  # a signal ends the bench at its next request, not at its last
        rec = await send(client, requests[i], timeout_s)
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


def summarise(
    load: Load,
    runs: list[tuple[list[RequestRecord], float]],
    input_lens: int,
    max_error_rate: float,
) -> LevelResult:
    """Pool the repeats of one level into its result; each repeat also kept as a sample for significance tests."""
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
        failed = sum(1 for rec in records if rec.failed)
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
        in_tokens = sum(rec.prompt_tokens for rec in ok) or input_lens * len(ok)
        total_in += in_tokens
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
            "input_throughput": in_tokens / wall if wall > 0 else 0.0,
            "total_throughput": (in_tokens + out_tokens) / wall if wall > 0 else 0.0,
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
        input_throughput=total_in / total_wall if total_wall > 0 else 0.0,
        total_throughput=(total_in + total_out) / total_wall if total_wall > 0 else 0.0,
        ttft=LatencyStats.of(ttft),
        itl=LatencyStats.of(itl),
        tpot=LatencyStats.of(tpot),
        e2e=LatencyStats.of(e2e),
        repeats=samples,
    )
