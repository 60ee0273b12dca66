"""The reference server's sleep mode over HTTP (vLLM's routes): parked, it refuses work with 503; woken, it answers as
before, to the log-probability."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from campaign.refserver.engine import Engine, EngineArgs
from campaign.refserver.profiler import ProfileError
from campaign.refserver.request import Request
from campaign.refserver.sleeper import Sleeper
from campaign.refserver.tokenizer import encode_prompt
from tests.fixtures.refserver import CPU_ARGS, free_port, start_refserver, stop_refserver, wait_ready

QUESTION = {
    "messages": [{"role": "user", "content": "What is 63+58?"}],
    "max_tokens": 8,
    "temperature": 0,
    "logprobs": True,
    "top_logprobs": 3,
}


def answer(url: str) -> list[tuple[str, float, list[tuple[str, float]]]]:
    """The reply's tokens with their log-probabilities and the top alternatives'."""
    reply = httpx.post(f"{url}/v1/chat/completions", json=QUESTION, timeout=30)
    assert reply.status_code == 200, reply.text
    content = reply.json()["choices"][0]["logprobs"]["content"]
    return [(c["token"], c["logprob"], [(t["token"], t["logprob"]) for t in c["top_logprobs"]]) for c in content]


def test_sleep_parks_refuses_work_and_wake_answers_the_same(tmp_path: Path) -> None:
    log = tmp_path / "refserver.log"
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = start_refserver([*CPU_ARGS, "--enable-torch-compile", "--cuda-graph-max-bs", "2"], port=port, log_path=log)
    try:
        wait_ready(proc, url, log, timeout=300)
        before = answer(url)
        assert "".join(t for t, _, _ in before) == "121"
        assert httpx.get(f"{url}/is_sleeping", timeout=5).json() == {"is_sleeping": False}

        slept = httpx.post(f"{url}/sleep", params={"level": 1}, timeout=30)
        assert slept.status_code == 200, slept.text
        assert slept.json()["weights_bytes"] > 0
        assert httpx.get(f"{url}/is_sleeping", timeout=5).json() == {"is_sleeping": True}
        health = httpx.get(f"{url}/health", timeout=5)
        assert health.status_code == 503 and "parked" in health.text
        refused = httpx.post(f"{url}/v1/chat/completions", json=QUESTION, timeout=30)
        assert refused.status_code == 503 and "parked" in refused.json()["error"]["message"]
        # A second sleep is no error, and the process is alive throughout.
        assert httpx.post(f"{url}/sleep", timeout=30).json()["is_sleeping"] is True
        assert proc.poll() is None

        woke = httpx.post(f"{url}/wake_up", timeout=60)
        assert woke.status_code == 200 and woke.json()["is_sleeping"] is False
        assert woke.json()["retraced"] == 0  # the compiled decode step was kept
        assert httpx.get(f"{url}/health_generate", timeout=30).status_code == 200
        assert answer(url) == before  # the same tokens, log-probabilities and alternatives, exactly
        text = log.read_text()
        assert "Sleep level 1 done" in text and "Wake up done" in text
    finally:
        stop_refserver(proc)


def test_an_engine_sleeps_only_when_idle_and_wakes_to_the_same_outputs() -> None:
    engine = Engine(EngineArgs(device="cpu", disable_cuda_graph=True, max_total_tokens=4096))
    sleeper = Sleeper(engine)
    prompts = [encode_prompt("What is 17×23?"), encode_prompt("What is 5-77?")]
    before = engine.generate(prompts, 8)
    with pytest.raises(ProfileError, match="only level 1"):
        sleeper.sleep(2)
    engine.submit(Request(prompts[0], 8))
    engine.step()  # admitted: it holds slots of the pool a sleep would drop
    with pytest.raises(ProfileError, match="busy") as busy:
        sleeper.sleep()
    assert busy.value.status == 409 and not sleeper.asleep
    while not engine.idle:
        engine.step()
    weights = sum(p.numel() * p.element_size() for p in engine.model.parameters())
    slept = sleeper.sleep()
    assert slept["weights_bytes"] >= weights > 0
    assert all(p.numel() == 0 for p in engine.model.parameters()) and engine.pool.rows.numel() == 0
    woke = sleeper.wake()
    assert woke["retraced"] == 0 and engine.pool.rows.numel() > 0
    assert engine.generate(prompts, 8) == before


@pytest.mark.parametrize("path", ["/sleep", "/wake_up"])
def test_disable_sleep_mode_leaves_the_routes_out(tmp_path: Path, path: str) -> None:
    log = tmp_path / "refserver.log"
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = start_refserver([*CPU_ARGS, "--disable-sleep-mode"], port=port, log_path=log)
    try:
        wait_ready(proc, url, log)
        assert httpx.post(f"{url}{path}", timeout=10).status_code == 404
        assert httpx.get(f"{url}/is_sleeping", timeout=10).status_code == 404
    finally:
        stop_refserver(proc)
