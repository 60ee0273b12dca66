"""The load generator against the real reference server (CPU): a sweep yields every metric; refusals are counted."""

from __future__ import annotations

import importlib.util
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from campaign.bench import run_bench
from campaign.errors import BenchError
from campaign.gates import check_gates
from campaign.records import BenchResult, BenchSettings, Gate, RequestRow

ROOT = Path(__file__).resolve().parents[1]

if importlib.util.find_spec("torch") is None or importlib.util.find_spec("campaign.refserver.app") is None:
    pytest.skip("the reference server (and torch) are not installed here", allow_module_level=True)


def _serve(tmp_path_factory: pytest.TempPathFactory, *extra: str) -> Iterator[str]:
    """A reference server on CPU (``extra`` flags added) until the generator is closed; yields its URL."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = tmp_path_factory.mktemp("refserver") / "server.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "campaign.refserver",
                "--device",
                "cpu",
                "--disable-cuda-graph",
                "--port",
                str(port),
                *extra,
            ],
            cwd=ROOT,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            if proc.poll() is not None:
                pytest.fail(f"the reference server exited ({proc.returncode}):\n{log.read_text()[-2000:]}")
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"the reference server was not healthy in 120 s:\n{log.read_text()[-2000:]}")
            time.sleep(0.2)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture(scope="module")
def refserver(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    yield from _serve(tmp_path_factory)


@pytest.fixture(scope="module")
def refserver_grouped(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A reference server whose streams write their tokens four at a time (``--stream-interval 4``)."""
    yield from _serve(tmp_path_factory, "--stream-interval", "4")


def test_sweep_against_the_reference_server_yields_every_metric(refserver: str) -> None:
    settings = BenchSettings(
        concurrency=[1, 4], requests=8, warmup=1, repeats=2, gates=[Gate(metric="error_rate", max=0)]
    )
    result = run_bench(refserver, settings)
    assert result.passed
    models = httpx.get(refserver + "/v1/models").json()["data"]
    assert result.model == models[0]["id"]
    for lv in result.levels:
        assert (lv.sent, lv.successful, lv.errors) == (16, 16, {})
        assert lv.output_tokens >= 16  # an answer is at least one token
        for stats in (lv.ttft, lv.itl, lv.tpot, lv.e2e):
            assert stats.count > 0 and stats.median is not None and stats.median > 0
        assert lv.ttft.median <= lv.e2e.median  # type: ignore[operator]
        assert lv.output_throughput > 0 and lv.request_throughput > 0
    assert all(g.passed for g in check_gates(result, None, settings.gates))
    assert BenchResult.model_validate(result.model_dump()) == result


def test_a_server_that_refuses_every_request_is_sent_one(refserver: str) -> None:
    # Random prompts of 200 tokens are far past the reference model's context: it answers HTTP 400, and the bench
    # stops after its first test request with the server's own words instead of sending all 400 requests.
    settings = BenchSettings(concurrency=[2], requests=400, warmup=0, prompts="random", input_len=200, output_len=8)
    with pytest.raises(BenchError, match=r"first request .* failed \(http_400\): .*context") as info:
        run_bench(refserver, settings)
    assert "no load was sent" in info.value.message and "--max-tokens" in (info.value.hint or "")


def test_completions_with_token_exact_prompts_and_ignore_eos(refserver: str) -> None:
    rows: list[RequestRow] = []
    settings = BenchSettings(
        concurrency=[2], requests=4, warmup=0, endpoint="completions", prompts="random", input_len=30, output_len=6
    )
    result = run_bench(refserver, settings, on_request=rows.append)
    (lv,) = result.levels
    assert result.passed and result.input_lengths == "tokenize"
    # The server's own usage counts exactly input_len prompt tokens, and ignore_eos gives exactly output_len.
    assert [(r.prompt_tokens, r.output_tokens) for r in rows] == [(30, 6)] * 4
    assert lv.input_tokens == 4 * 30 and lv.output_tokens == 4 * 6
    assert lv.total_throughput == pytest.approx(lv.input_throughput + lv.output_throughput)


@pytest.mark.parametrize("server", ["refserver", "refserver_grouped"])
def test_every_token_after_the_first_gets_its_gap(server: str, request: pytest.FixtureRequest) -> None:
    # With ignore_eos the arithmetic model writes its answer, then eos and other tokens that make no text, which
    # no server streams; with a stream interval a write carries several tokens. Usage in every chunk tells the
    # bench how many tokens each event stands for, so each token after the first has an ITL entry and the entries
    # add up to the time from the first token to the last.
    url = request.getfixturevalue(server)
    rows: list[RequestRow] = []
    settings = BenchSettings(concurrency=[2], requests=4, warmup=0, prompts="random", input_len=12, output_len=48)
    result = run_bench(url, settings, on_request=rows.append)
    assert result.passed
    for row in rows:
        assert row.output_tokens == 48
        assert row.ttft_ms is not None and row.e2e_ms is not None
        # The first token goes out alone, even with a stream interval (it dates TTFT); tokens read in the same
        # piece as it would date no gap, hence the small allowance.
        assert 48 - 3 <= len(row.itl_ms) + 1 <= 48, (server, len(row.itl_ms))
        assert sum(row.itl_ms) <= row.e2e_ms - row.ttft_ms + 1e-6
        assert sum(row.itl_ms) >= 0.8 * (row.e2e_ms - row.ttft_ms) - 5.0
