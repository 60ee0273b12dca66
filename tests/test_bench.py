"""The load generator against real HTTP servers on loopback: the scheduled endpoint, its faults, and bad input."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import httpx
import pytest
from pydantic import ValidationError

from campaign.bench import make_prompts, run_bench
from campaign.bench.testing import ScheduledServer
from campaign.errors import BenchError
from campaign.records import TABLE, BenchEvent, BenchResult, BenchSettings, LatencyStats, percentile

TTFT_MS = 40.0
ITL_MS = 10.0
TOKENS = 8


@pytest.fixture(scope="module")
def scheduled() -> Iterator[ScheduledServer]:
    with ScheduledServer(ttft_ms=TTFT_MS, itl_ms=ITL_MS, tokens=TOKENS) as srv:
        yield srv


def test_sweep_measures_every_metric_against_the_schedule(scheduled: ScheduledServer) -> None:
    events: list[BenchEvent] = []
    settings = BenchSettings(concurrency=[1, 4], requests=12, warmup=2, repeats=2)
    result = run_bench(scheduled.url, settings, progress=events.append)

    assert result.model == "scheduled"  # asked of /v1/models
    assert result.passed
    assert [lv.label for lv in result.levels] == ["c=1", "c=4"]
    for lv in result.levels:
        assert (lv.sent, lv.successful, lv.failed, lv.incomplete, lv.errors) == (24, 24, 0, 0, {})
        assert lv.output_tokens == 24 * TOKENS
        # Generous bounds: CI shares two cores; scripts/bench_client.py measures the tight figures.
        assert TTFT_MS <= lv.ttft.median < TTFT_MS + 25  # type: ignore[operator]
        assert ITL_MS - 3 < lv.itl.median < ITL_MS + 5  # type: ignore[operator]
        assert lv.itl.count == 24 * (TOKENS - 1)
        assert ITL_MS - 3 < lv.tpot.mean < ITL_MS + 5  # type: ignore[operator]
        expected_e2e = TTFT_MS + (TOKENS - 1) * ITL_MS
        assert expected_e2e <= lv.e2e.median < expected_e2e + 30  # type: ignore[operator]
        for stats in (lv.ttft, lv.itl, lv.tpot, lv.e2e):
            assert stats.min <= stats.median <= stats.p90 <= stats.p99 <= stats.max  # type: ignore[operator]
        assert len(lv.repeats) == 2
        assert lv.output_throughput == pytest.approx(lv.output_tokens / lv.duration_s)
        assert lv.request_throughput == pytest.approx(lv.successful / lv.duration_s)
    one, four = result.levels
    # Four streams in flight deliver about four times the tokens per second of one.
    assert 2.5 < four.output_throughput / one.output_throughput < 4.5
    kinds = [e.kind for e in events]
    assert kinds.count("level_start") == 2 and kinds.count("level_end") == 2 and kinds.count("repeat") == 4
    assert [e.done for e in events if e.kind == "request" and e.level == "c=4"] == list(range(1, 25))


def test_result_round_trips_through_its_stored_form(scheduled: ScheduledServer) -> None:
    result = run_bench(scheduled.url, BenchSettings(concurrency=[2], requests=4, warmup=0))
    again = BenchResult.model_validate(result.model_dump())
    assert again == result
    assert BenchResult.model_validate_json(result.model_dump_json()) == result


def test_every_metric_of_the_table_is_measured_in_its_unit(scheduled: ScheduledServer) -> None:
    """Each row of the metrics table is a value a level measures, pooled and per repeat, in the row's unit."""
    result = run_bench(scheduled.url, BenchSettings(concurrency=[2], requests=6, warmup=0, repeats=2))
    (lv,) = result.levels
    per_s = {"tok/s": lv.output_tokens / lv.duration_s, "req/s": lv.successful / lv.duration_s}
    for m in TABLE:
        value = lv.metric(m.name)
        assert value is not None, m.name
        for rep in lv.repeats:
            assert rep.metrics[m.name] is not None, (m.name, rep.repeat)
        if m.unit == "ms":  # the schedule's own timing: tens of milliseconds, never seconds
            assert ITL_MS / 2 < value < 2000, m.name
        elif m.unit == "fraction":
            assert value == 0.0
        elif m.name in ("output_throughput", "request_throughput"):
            assert value == pytest.approx(per_s[m.unit]), m.name
        else:
            assert m.unit == "tok/s" and value > 0, m.name
    assert {name for rep in lv.repeats for name in rep.metrics} == {m.name for m in TABLE}


def test_poisson_rate_level(scheduled: ScheduledServer) -> None:
    settings = BenchSettings(request_rate=50, requests=20, warmup=0, max_concurrency=8)
    result = run_bench(scheduled.url, settings)
    (lv,) = result.levels
    assert lv.label == "rate=50/s,c<=8"
    assert lv.successful == 20 and result.passed
    assert lv.request_throughput < 50 * 1.8  # arrivals are spread out, not sent at once


def test_spinning_endpoint_keeps_the_same_schedule() -> None:
    # The benchmark's ruler (--spin: busy-polling epoll) must serve exactly what the sleeping endpoint serves.
    with ScheduledServer(ttft_ms=TTFT_MS, itl_ms=ITL_MS, tokens=TOKENS, spin=True) as srv:
        result = run_bench(srv.url, BenchSettings(concurrency=[4], requests=8, warmup=0))
        stats = httpx.get(srv.url + "/stats").json()
    (lv,) = result.levels
    assert result.passed and (lv.successful, lv.output_tokens) == (8, 8 * TOKENS)
    assert TTFT_MS <= lv.ttft.median < TTFT_MS + 25  # type: ignore[operator]
    assert ITL_MS - 3 < lv.itl.median < ITL_MS + 5  # type: ignore[operator]
    # The 8 measured requests and the bench's first test request.
    assert stats["requests"] == 9 and stats["chunk_late"]["count"] == 9 * TOKENS


def test_error_event_mid_stream_under_http_200_fails_the_level() -> None:
    with ScheduledServer(ttft_ms=5, itl_ms=2, tokens=6, fail_mode="error_event", fail_every=2, fail_after=3) as srv:
        result = run_bench(srv.url, BenchSettings(concurrency=[4], requests=8, warmup=0))
    (lv,) = result.levels
    assert not result.passed and not lv.passed
    assert (lv.successful, lv.failed, lv.incomplete) == (4, 4, 0)
    assert lv.errors == {"stream_error:internal_error": 4}
    assert "mid-stream" in lv.error_examples["stream_error:internal_error"]
    assert lv.ttft.count == 4


@pytest.mark.parametrize(
    ("mode", "error", "message"),
    [
        ("error_event", "stream_error:internal_error", "scheduled failure mid-stream"),
        ("http_500", "http_500", "scheduled failure"),
        ("no_finish", "incomplete:no_finish_reason", "the stream ended without a finish_reason"),
    ],
)
def test_a_server_that_cannot_serve_is_sent_one_request(mode: str, error: str, message: str) -> None:
    # Every request fails: the bench stops after its first test request, naming the server's own message.
    with ScheduledServer(ttft_ms=2, itl_ms=1, tokens=4, fail_mode=mode) as srv:
        with pytest.raises(BenchError, match=f"first request .*failed \\({error}\\): {message}") as info:
            run_bench(srv.url, BenchSettings(concurrency=[8, 32], requests=400, warmup=2))
        assert httpx.get(srv.url + "/stats").json()["requests"] == 1
    assert "no load was sent" in info.value.message


def test_some_errors_are_counted_and_judged_by_the_threshold() -> None:
    with ScheduledServer(ttft_ms=5, itl_ms=2, tokens=4, fail_mode="error_event", fail_every=4) as srv:
        lenient = run_bench(srv.url, BenchSettings(concurrency=[1], requests=16, warmup=0, max_error_rate=0.3))
        strict = run_bench(srv.url, BenchSettings(concurrency=[1], requests=16, warmup=0, max_error_rate=0.1))
    for result in (lenient, strict):
        (lv,) = result.levels
        assert (lv.successful, lv.failed) == (12, 4)
        assert lv.error_rate == pytest.approx(0.25)
        # Failed requests are not in the averages: every measured TTFT is a successful one.
        assert lv.ttft.count == 12
    assert lenient.passed and not strict.passed


@pytest.mark.parametrize(
    ("mode", "key", "failed", "incomplete"),
    [
        ("http_500", "http_500", 6, 0),
        ("drop", "incomplete:connection_closed", 0, 6),
        ("no_finish", "incomplete:no_finish_reason", 0, 6),
    ],
)
def test_fault_kinds_are_grouped_by_type(mode: str, key: str, failed: int, incomplete: int) -> None:
    # Every other request fails (the first test request, request 1, passes).
    with ScheduledServer(ttft_ms=2, itl_ms=1, tokens=5, fail_mode=mode, fail_every=2) as srv:
        result = run_bench(srv.url, BenchSettings(concurrency=[3], requests=12, warmup=0))
    (lv,) = result.levels
    assert (lv.failed, lv.incomplete, lv.successful) == (failed, incomplete, 6)
    assert lv.errors == {key: 6}
    assert not result.passed


def test_timeout_of_the_first_request_stops_the_bench() -> None:
    with (
        ScheduledServer(ttft_ms=2000, itl_ms=1, tokens=2) as srv,
        pytest.raises(BenchError, match=r"\(timeout\): no complete response within 0.3 s") as info,
    ):
        run_bench(srv.url, BenchSettings(concurrency=[2], requests=2, warmup=0, timeout_s=0.3))
    assert "timeout_s" in (info.value.hint or "")


def test_unreachable_server_is_a_bench_error() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(BenchError, match="cannot reach"):
        run_bench(f"http://127.0.0.1:{port}", BenchSettings(concurrency=[1], requests=1))
    with pytest.raises(BenchError, match="not an http"):
        run_bench("127.0.0.1:1", BenchSettings())


def test_settings_reject_typos_and_contradictions() -> None:
    with pytest.raises(ValidationError, match="concurency"):
        BenchSettings.model_validate({"concurency": [1, 8]})
    with pytest.raises(ValidationError, match="not both"):
        BenchSettings(concurrency=[1], request_rate=[2.0])
    with pytest.raises(ValidationError, match="unknown gate metric"):
        BenchSettings.model_validate({"gates": [{"metric": "tokens_per_s", "min": 1}]})
    s = BenchSettings.model_validate({"concurrency": 32})
    assert s.concurrency == [32]
    assert BenchSettings().concurrency == [1, 8, 32]
    random_prompts = BenchSettings(prompts="random", output_len=64)
    assert random_prompts.effective_ignore_eos() and random_prompts.effective_max_tokens() == 64
    assert not BenchSettings().effective_ignore_eos()


def test_prompts_are_fixed_by_the_seed() -> None:
    s = BenchSettings(prompts="random", input_len=16, seed=7)
    assert make_prompts(s, 5) == make_prompts(s, 5)
    assert make_prompts(s, 3, offset=2) == make_prompts(s, 5)[2:]
    assert make_prompts(s, 1) != make_prompts(s.model_copy(update={"seed": 8}), 1)
    assert all(len(p.text.split()) == 16 for p in make_prompts(s, 5))
    arith = make_prompts(BenchSettings(), 20)
    assert all(p.text.startswith("What is ") and p.text.endswith("?") for p in arith)


def test_percentiles_interpolate_like_numpy() -> None:
    values = [1.0, 2.0, 3.0, 4.0, 10.0]
    assert percentile(values, 50) == 3.0
    assert percentile(values, 90) == pytest.approx(7.6)
    assert percentile([5.0], 99) == 5.0
    stats = LatencyStats.of([0.001, 0.002, 0.003])
    assert (stats.count, stats.mean, stats.median, stats.min, stats.max) == (3, pytest.approx(2.0), 2.0, 1.0, 3.0)
    assert LatencyStats.of([]).median is None


def test_a_level_with_fewer_requests_than_its_concurrency_is_refused() -> None:
    """c=256 with 64 requests never has 256 in flight: the plan is refused with what to set, not run mislabelled."""
    plan = {"plan": True}
    with pytest.raises(ValueError, match="concurrency 256 with requests 64 never has more than 64 in flight"):
        BenchSettings.model_validate({"concurrency": [4, 256], "requests": 64}, context=plan)
    sla = {"requests": 32, "sla": {"slo": {"ttft.p90": 50}, "low": 1, "high": 128}}
    with pytest.raises(ValueError, match="set requests to at least 128"):
        BenchSettings.model_validate(sla, context=plan)
    assert BenchSettings.model_validate({"concurrency": [4, 64], "requests": 64}, context=plan).concurrency == [4, 64]
    # A stored result is read back whatever its plan was: no data is lost to a newer rule.
    assert BenchSettings.model_validate(sla).requests == 32


def _events(*texts: str) -> bytes:
    """SSE bytes of completion chunks, one token each, as a server writes what it has queued at once."""
    return b"".join(f'data: {{"choices": [{{"text": "{t}"}}]}}\n\n'.encode() for t in texts)


def test_tokens_that_arrive_together_share_the_gap_since_the_last_arrival() -> None:
    from campaign.bench.sse import ChatStream, RequestRecord

    rec = RequestRecord()
    stream = ChatStream(rec, sent=0.0)
    assert not stream.feed(_events("1", "2"), now=0.5)  # the first token, and one more in the same write
    assert not stream.feed(_events("3"), now=0.6)
    assert not stream.feed(_events("4", "5", "6", "7"), now=1.0)  # behind the engine: four at once
    assert stream.feed(b"data: [DONE]\n\n", now=1.0)
    assert rec.ttft == 0.5 and rec.e2e == 1.0 and rec.output_tokens == 7
    # Not [0.1, 0.4, 0, 0, 0]: the 0.4 s since the last arrival is spread over the four tokens that came in it; the
    # token that came with the first one dates no gap.
    assert rec.itls == pytest.approx([0.1, 0.1, 0.1, 0.1, 0.1])
