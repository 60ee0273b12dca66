"""The long-context workload on CPU: the long-context model over real HTTP, its indexer knob, and the bench prompts.

The server runs the committed long-context model with mla_kernels' indexer under Triton's CPU interpreter, keeping
the top 64 of each request's cached tokens (2048 on the GPU), so every answer below comes through the sparse path.
The questions are 160 tokens long, the length the CPU model was trained to (exact on 16 of 16 there); it is not exact
at longer contexts (1 of 16 at 320 tokens, 0 of 16 at 640: docs/performance.md).
"""

from __future__ import annotations

import importlib.util
import json
import random
import re
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from campaign.bench.prompts import Prompt, make_prompts
from campaign.records import BenchSettings
from tests.fixtures.refserver import CPU_ARGS, REPO, free_port, start_refserver, stop_refserver, wait_ready

if importlib.util.find_spec("torch") is None or importlib.util.find_spec("triton") is None:
    pytest.skip("the reference server (torch and triton) is not installed here", allow_module_level=True)

MODEL = REPO / "campaign" / "refserver" / "weights" / "longctx.safetensors"
TOPK = 64
#: Prompt tokens of the long-context questions: the longest the CPU model was trained on (160 filler characters).
CONTEXT = 160
#: The interpreter is what lets the Triton indexer run on a CPU.
ENV = {"TRITON_INTERPRET": "1"}


def _server(tmp: Path, *extra: str) -> tuple[subprocess.Popen[bytes], str, Path]:
    port = free_port()
    log = tmp / "refserver.log"
    args = [*CPU_ARGS, "--model-path", str(MODEL), "--index-topk", str(TOPK), *extra]
    proc = start_refserver(args, port=port, log_path=log, env=ENV)
    url = f"http://127.0.0.1:{port}"
    wait_ready(proc, url, log, timeout=180)
    return proc, url, log


@pytest.fixture(scope="module")
def aware(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    proc, url, log = _server(tmp_path_factory.mktemp("aware"), "--context-length", "2048")
    try:
        yield url, log
    finally:
        stop_refserver(proc)


def _ask(url: str, prompt: Prompt) -> str:
    body = {"messages": [{"role": "user", "content": prompt.text}], "max_tokens": 8, "temperature": 0}
    reply = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=120)
    reply.raise_for_status()
    content: str = reply.json()["choices"][0]["message"]["content"]
    return content


def _indexer_logits(url: str) -> int:
    text = httpx.get(f"{url}/metrics", timeout=10).text
    match = re.search(r"^refserver:indexer_logits_total (\d+)$", text, re.M)
    assert match, text
    return int(match.group(1))


def test_long_context_questions_are_answered_exactly_through_the_indexer(aware: tuple[str, Path]) -> None:
    url, log = aware
    prompts = make_prompts(BenchSettings(prompts="long-context", input_len=CONTEXT, seed=3), 4)
    assert all(len(p.text) + 2 == CONTEXT and p.answer is not None for p in prompts)
    before = _indexer_logits(url)
    with ThreadPoolExecutor(len(prompts)) as pool:
        replies = list(pool.map(lambda p: _ask(url, p), prompts))
    assert replies == [str(p.answer) for p in prompts]
    # The engine says what it runs, and decode did go through the indexer (160 cached tokens > the top 64).
    assert re.search(r"context_len=2048, .*indexer=aware, index_topk=64", log.read_text())
    assert _indexer_logits(url) > before


def test_the_naive_indexer_is_another_decode_path_with_the_same_answers(
    aware: tuple[str, Path], tmp_path: Path
) -> None:
    url, _ = aware
    prompt = make_prompts(BenchSettings(prompts="long-context", input_len=CONTEXT, seed=5), 1)[0]
    before = _indexer_logits(url)
    assert _ask(url, prompt) == str(prompt.answer)
    aware_work = _indexer_logits(url) - before

    proc, naive_url, log = _server(tmp_path, "--context-length", "1024", "--indexer", "naive")
    try:
        before = _indexer_logits(naive_url)
        assert _ask(naive_url, prompt) == str(prompt.answer)
        naive_work = _indexer_logits(naive_url) - before
    finally:
        stop_refserver(proc)
    assert re.search(r"context_len=1024, .*indexer=naive, index_topk=64", log.read_text())
    # Per decode step and layer the aware form scores the row's own length (about 160), the naive one all 1024
    # positions of the page table: the same answer, a different amount of work.
    # The first token comes from prefill, the digits after it and eos from decode; with the engine's overlap one more
    # step was already running when eos came back (its token is dropped, its work was done).
    steps = len(str(prompt.answer)) + 1
    assert naive_work == steps * 1024 * 4
    assert aware_work < naive_work


def test_bench_long_context_prompts_run_against_the_server(aware: tuple[str, Path], tmp_path: Path) -> None:
    url, _ = aware
    out = tmp_path / "bench.json"
    args = ["--prompts", "long-context", "--input-len", "512", "--output-len", "4", "-c", "2", "-n", "2"]
    done = subprocess.run(
        [sys.executable, "-m", "campaign.cli", "bench", url, *args, "--warmup", "1", "--output", str(out)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    result = json.loads(out.read_text())
    # Fitted with the server's own /tokenize: 512 prompt tokens exactly, 4 output tokens each (ignore_eos).
    assert result["input_lengths"] == "tokenize"
    (level,) = result["levels"]
    assert (level["successful"], level["failed"], level["input_tokens"]) == (2, 0, 2 * 512)


def test_long_context_prompts_fit_a_counter_exactly() -> None:
    import asyncio

    from campaign.bench.prompts import fit_prompts

    settings = BenchSettings(prompts="long-context", input_len=3000, seed=1)

    async def words_and_digits(text: str) -> int:  # a tokenizer unlike the server's: about one token per word
        return len(re.findall(r"\w+|[^\w\s]", text)) + 1

    (fitted,) = asyncio.run(fit_prompts(settings, 1, 0, words_and_digits))
    assert asyncio.run(words_and_digits(fitted.text)) == fitted.input_len == 3000
    plain = make_prompts(settings, 1)[0]  # sized for the server's tokenizer: one token a character
    assert fitted.text.rsplit(". ", 1)[1] == plain.text.rsplit(". ", 1)[1] and fitted.answer == plain.answer
    assert len(fitted.text) != len(plain.text)


def test_widening_keeps_the_answers() -> None:
    import torch

    from campaign.refserver.model import load_model
    from campaign.refserver.questions import question_table
    from campaign.refserver.train import filler_items, question_tensors
    from campaign.refserver.widening import widen

    model, _ = load_model(MODEL, "cpu")
    wide = widen(model, n_heads=8, d_latent=128, d_rope=32, index_heads=8, index_dim=32)
    assert (wide.cfg.d_qk, wide.cfg.n_heads) == (160, 8)
    inputs, _, _ = question_tensors(filler_items(random.Random(0), question_table(), 4, 300), "cpu")
    with torch.no_grad():
        assert torch.equal(model(inputs).argmax(-1), wide(inputs).argmax(-1))
