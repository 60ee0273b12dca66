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

from campaign.bench import BenchResult, BenchSettings, run_bench
from campaign.gates import Gate, check_gates

ROOT = Path(__file__).resolve().parents[1]

if importlib.util.find_spec("torch") is None or importlib.util.find_spec("campaign.refserver.app") is None:
    pytest.skip("the reference server (and torch) are not installed here", allow_module_level=True)


@pytest.fixture(scope="module")
def refserver(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
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


def test_requests_the_server_refuses_are_counted_and_fail_the_level(refserver: str) -> None:
    # Random prompts of 200 words are far past the reference model's context: each gets an HTTP 400.
    settings = BenchSettings(concurrency=[2], requests=4, warmup=0, prompts="random", input_len=200, output_len=8)
    result = run_bench(refserver, settings)
    (lv,) = result.levels
    assert not result.passed
    assert lv.errors == {"http_400": 4} and lv.successful == 0
    assert lv.error_examples["http_400"]  # the server's own message is kept
