"""The reference server on a CUDA GPU with its default variant (CUDA graphs on) and each attention backend."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
import torch

from tests.fixtures.refserver import free_port, start_refserver, stop_refserver, wait_ready

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


@pytest.mark.parametrize("backend", ["torch", "simt", "mma"])
def test_cuda_graph_server_answers(tmp_path: Path, backend: str) -> None:
    log = tmp_path / "refserver.log"
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = start_refserver(
        ["--device", "cuda", "--attention-backend", backend, "--max-total-tokens", "65536"], port=port, log_path=log
    )
    try:
        wait_ready(proc, url, log)
        text = log.read_text()
        assert "Capture cuda graph end" in text
        reply = httpx.post(
            f"{url}/v1/chat/completions",
            timeout=30,
            json={"messages": [{"role": "user", "content": "What is 17×23?"}], "temperature": 0},
        )
        assert reply.json()["choices"][0]["message"]["content"] == "391"
    finally:
        stop_refserver(proc)
