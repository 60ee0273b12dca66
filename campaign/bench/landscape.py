"""A server whose speed is a known function of its knobs, and which fails in a known region: the tune's ruler.

Run as a process (``python -m campaign.bench.landscape --port P --attention-backend mma --max-batch 32
--cuda-graph --stream-interval 4``), launched by the ``landscape`` recipe through the real loop. It prints
SGLang-shaped log lines, then serves the scheduled endpoint (``campaign.bench.testing``) with the inter-token
latency and TTFT that ``point`` computes from the knobs, and answers the smoke's arithmetic exactly (a non-streamed
chat completion). With ``--max-batch 64`` it logs a CUDA out-of-memory error while sizing its KV cache and exits 1,
as a real server does: that is the failing region (12 of the 48 points).

The space (``SPACE``): attention {torch, simt, mma} x max_batch {8, 16, 32, 64} x cuda_graph {off, on} x
stream_interval {1, 4} = 48 points. The optimum (``optimum()``) is mma, 32, on, 4. ``output_throughput`` at
concurrency c with n tokens a request is ``c * n / (ttft + n * itl)`` tokens per second.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import re
import sys

from campaign.bench import testing

SPACE: dict[str, list[str | int | bool]] = {
    "attention": ["torch", "simt", "mma"],
    "max_batch": [8, 16, 32, 64],
    "cuda_graph": [False, True],
    "stream_interval": [1, 4],
}
FAILING_BATCH = 64
_ATTENTION = {"torch": 1.0, "simt": 1.25, "mma": 1.5}
_BATCH = {8: 0.7, 16: 0.9, 32: 1.0, 64: 1.1}
_QUESTION = re.compile(r"What is (\d+)\s*([×x*+])\s*(\d+)\?")


def point(attention: str, max_batch: int, cuda_graph: bool, stream_interval: int) -> tuple[float, float] | None:
    """(TTFT ms, inter-token latency ms) of a configuration; None where it fails (max_batch 64)."""
    if max_batch >= FAILING_BATCH:
        return None
    speed = _ATTENTION[attention] * _BATCH.get(max_batch, 1.0)
    # Graphs pay off only with a fused kernel; the torch backend's many small launches lose a little to capture.
    speed *= (1.2 if attention != "torch" else 0.95) if cuda_graph else 1.0
    # A longer stream interval saves writes at large batches and costs a little latency at small ones.
    speed *= (1.08 if max_batch >= 32 else 0.97) if stream_interval > 1 else 1.0
    return 20.0 + 0.5 * max_batch, 12.0 / speed


def throughput(config: dict[str, str | int | bool | float | None], *, concurrency: int, tokens: int) -> float | None:
    """The output tokens per second the endpoint serves at ``concurrency`` (None where it fails)."""
    p = point(
        str(config["attention"]),
        int(config["max_batch"] or 0),
        bool(config["cuda_graph"]),
        int(config["stream_interval"] or 1),
    )
    if p is None:
        return None
    ttft, itl = p
    return concurrency * tokens * 1000.0 / (ttft + tokens * itl)


def optimum(*, concurrency: int = 32, tokens: int = 16) -> dict[str, str | int | bool | float | None]:
    """The configuration with the highest throughput in ``SPACE``."""
    best: tuple[float, dict[str, str | int | bool | float | None]] | None = None
    for combo in itertools.product(*SPACE.values()):
        cfg: dict[str, str | int | bool | float | None] = dict(zip(SPACE, combo, strict=True))
        t = throughput(cfg, concurrency=concurrency, tokens=tokens)
        if t is not None and (best is None or t > best[0]):
            best = (t, cfg)
    assert best is not None
    return best[1]


class _Landscape(testing._Server):
    """The scheduled endpoint, plus exact non-streamed answers to the smoke's arithmetic."""

    async def route(
        self, method: str, target: str, body: bytes, writer: asyncio.StreamWriter, headers: dict[str, str]
    ) -> bool:
        path = target.split("?", 1)[0]
        if method == "GET" and path == "/health_generate":
            path, target = "/health", "/health"
        if method == "POST" and path == "/v1/chat/completions" and not json.loads(body).get("stream"):
            req = json.loads(body)
            text = " ".join(str(m.get("content", "")) for m in req.get("messages", []) if m.get("role") == "user")
            m = _QUESTION.search(text)
            a, op, b = (int(m.group(1)), m.group(2), int(m.group(3))) if m else (0, "+", 0)
            answer = str(a + b if op == "+" else a * b)
            self.simple(
                writer,
                "200 OK",
                {
                    "id": "l",
                    "object": "chat.completion",
                    "model": testing.MODEL_ID,
                    "choices": [
                        {"index": 0, "message": {"role": "assistant", "content": answer}, "finish_reason": "stop"}
                    ],
                    "usage": {"prompt_tokens": len(text.split()), "completion_tokens": 1, "total_tokens": 1},
                },
            )
            await writer.drain()
            return True
        return await super().route(method, target, body, writer, headers)


async def _serve(args: argparse.Namespace) -> None:
    server = _Landscape(args)
    srv = await asyncio.start_server(server.handle, "127.0.0.1", args.port, backlog=1024)
    print(f"Uvicorn running on http://127.0.0.1:{args.port}", flush=True)
    print("The server is fired up and ready to roll!", flush=True)
    async with srv:
        await srv.serve_forever()


def main(argv: list[str] | None = None) -> None:
    """Parse the knobs, fail where the landscape fails, else serve until killed."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--attention-backend", choices=list(_ATTENTION), default="torch")
    p.add_argument("--max-batch", type=int, default=16)
    p.add_argument("--cuda-graph", action="store_true")
    p.add_argument("--stream-interval", type=int, default=1)
    args = p.parse_args(argv)
    print("Load weight begin. avail mem=79.10 GB", flush=True)
    where = point(args.attention_backend, args.max_batch, args.cuda_graph, args.stream_interval)
    if where is None:
        print(
            "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 4.00 GiB. GPU 0 has a total capacity "
            f"of 79.11 GiB of which 1.02 GiB is free. (KV cache for max_running_requests={args.max_batch})",
            flush=True,
        )
        sys.exit(1)
    ttft, itl = where
    print(f"KV Cache is allocated. max_running_requests={args.max_batch}", flush=True)
    print(
        f"landscape: attention_backend={args.attention_backend}, cuda_graph={args.cuda_graph}, "
        f"stream_interval={args.stream_interval}, ttft_ms={ttft:.2f}, itl_ms={itl:.3f}",
        flush=True,
    )
    ns = argparse.Namespace(
        ttft_ms=ttft,
        itl_ms=itl,
        tokens=None,
        fail_mode="none",
        fail_every=1,
        fail_after=2,
        ttft_per_inflight_ms=0.0,
        api_key=None,
        no_tokenize=False,
        port=args.port,
    )
    try:
        loop = testing._loop(False)
        try:
            loop.run_until_complete(_serve(ns))
        finally:
            loop.close()
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
