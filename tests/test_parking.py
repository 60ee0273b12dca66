"""Parking a live reference server through its recipe's ``park:`` block (campaign.parking), on this machine."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from campaign.config import Parking, load_recipe
from campaign.errors import ParkError
from campaign.hosts.local import LocalHost
from campaign.parking import is_parked, memory, park, wake
from tests.fixtures.refserver import CPU_ARGS, free_port, start_refserver, stop_refserver, wait_ready

QUESTION = {
    "messages": [{"role": "user", "content": "What is 99*99?"}],
    "max_tokens": 8,
    "temperature": 0,
    "logprobs": True,
    "top_logprobs": 2,
}


def logprobs(url: str) -> list[object]:
    reply = httpx.post(f"{url}/v1/chat/completions", json=QUESTION, timeout=30)
    assert reply.status_code == 200, reply.text
    return list(reply.json()["choices"][0]["logprobs"]["content"])


def test_the_refserver_recipe_parks_and_wakes_its_server(tmp_path: Path) -> None:
    spec = load_recipe("refserver").park
    assert spec is not None and spec.via == "endpoints"
    host = LocalHost()
    port = free_port()
    url = host.url(port)
    log = tmp_path / "refserver.log"
    proc = start_refserver(CPU_ARGS, port=port, log_path=log)
    try:
        wait_ready(proc, url, log)
        proven = logprobs(url)
        pids = [proc.pid]
        assert memory(host, pids).rss_bytes  # measured on any Linux box; GPU memory only where nvidia-smi is
        assert is_parked(host, port, spec) is False
        parked = park(host, port, spec, pids)
        assert parked.action == "park" and parked.seconds > 0 and parked.before.rss_bytes and parked.after.rss_bytes
        assert parked.answer is not None and parked.answer["is_sleeping"] is True
        assert is_parked(host, port, spec) is True
        assert httpx.get(f"{url}/health", timeout=5).status_code == 503
        woke = wake(host, port, spec, pids)
        assert woke.action == "wake" and is_parked(host, port, spec) is False
        assert logprobs(url) == proven
    finally:
        stop_refserver(proc)


def test_a_server_without_the_routes_is_a_park_error_naming_the_call(tmp_path: Path) -> None:
    spec = load_recipe("refserver").park
    assert spec is not None
    host = LocalHost()
    port = free_port()
    log = tmp_path / "refserver.log"
    proc = start_refserver([*CPU_ARGS, "--disable-sleep-mode"], port=port, log_path=log)
    try:
        wait_ready(proc, host.url(port), log)
        with pytest.raises(ParkError, match=r"park: POST /sleep\?level=1 answered 404"):
            park(host, port, spec, [proc.pid])
        assert is_parked(host, port, spec) is None
    finally:
        stop_refserver(proc)
    # Nothing answers at all: a wake is refused with the transport's words, never a traceback.
    with pytest.raises(ParkError, match="got no answer"):
        wake(host, port, spec, [])


def test_cuda_checkpoint_without_the_tool_or_a_gpu_process_is_a_park_error() -> None:
    spec = Parking(via="cuda_checkpoint")
    host = LocalHost()
    with pytest.raises(ParkError, match="no process of the server holds GPU memory"):
        park(host, free_port(), spec, [], gpu_pids=[])
    if host.run("command -v cuda-checkpoint").ok:
        pytest.skip("this machine has cuda-checkpoint; the refusal below is for one without it")
    with pytest.raises(ParkError, match="cuda-checkpoint --toggle --pid 1 failed"):
        park(host, free_port(), spec, [], gpu_pids=[1])


def test_a_park_block_via_endpoints_needs_both_calls() -> None:
    with pytest.raises(ValueError, match="needs both sleep and wake"):
        Parking(via="endpoints", sleep={"path": "/sleep"})
