"""The server process: parse flags, start the engine process, serve HTTP, warm up, then announce readiness.

Order as in SGLang: weights, KV pool, compile and CUDA-graph capture all happen (in the engine process,
``engine_process``) before uvicorn binds the port;
then uvicorn starts (``Uvicorn running on ...``); then one real chat completion is sent to the server itself, and
only when it succeeds is ``The server is fired up and ready to roll!`` logged and /health turned to 200. A failure
anywhere is logged with its real cause and the process exits non-zero.
"""

from __future__ import annotations

import argparse
import os
import threading
import time
import traceback
from pathlib import Path
from typing import TYPE_CHECKING

import httpx
import uvicorn

from campaign.refserver.fault import FAULTS
from campaign.refserver.log import configure_logging, logger, uvicorn_log_config

if TYPE_CHECKING:
    from campaign.refserver.app import ServerState

WARMUP_TIMEOUT_S = 600.0


def _fraction(text: str) -> float:
    value = float(text)
    if not 0.0 < value <= 1.0:
        raise argparse.ArgumentTypeError(f"must be in (0, 1], got {text}")
    return value


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {text}")
    return value


def parser() -> argparse.ArgumentParser:
    """The command line, with SGLang's flag names where one exists."""
    p = argparse.ArgumentParser(prog="python -m campaign.refserver", description=__doc__.splitlines()[0])
    # Defaults that need torch or the weights are filled in by main(), so `--help` answers without importing torch.
    p.add_argument(
        "--model-path",
        type=Path,
        default=None,
        help="a .safetensors file, or the name of one in the packaged weights folder (default: arith.safetensors)",
    )
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=30000)
    p.add_argument("--device", choices=["cpu", "cuda"], default=None, help="default: cuda where torch sees one")
    p.add_argument("--attention-backend", choices=["torch", "simt", "mma"], default="torch")
    p.add_argument("--enable-torch-compile", action="store_true", help="wrap the decode step in torch.compile")
    p.add_argument("--disable-cuda-graph", action="store_true", help="run decode without CUDA graphs")
    p.add_argument("--cuda-graph-max-bs", type=_positive, default=64, help="largest batch captured as a graph")
    p.add_argument(
        "--cuda-graph-fallback",
        action="store_true",
        help="where CUDA graphs cannot be captured, decode eagerly (logged) instead of failing",
    )
    p.add_argument("--mem-fraction-static", type=_fraction, default=None, help="memory share for weights + KV pool")
    p.add_argument("--max-total-tokens", type=_positive, default=None, help="KV pool size in tokens")
    p.add_argument("--max-running-requests", type=_positive, default=128, help="largest decode batch")
    p.add_argument("--decode-log-interval", type=_positive, default=40, help="decode steps between Decode lines")
    p.add_argument(
        "--stream-interval",
        type=_positive,
        default=1,
        help="tokens a stream buffers before a write (as SGLang's flag): fewer, larger writes at high concurrency",
    )
    p.add_argument(
        "--context-length",
        type=_positive,
        default=None,
        help="longest request in tokens (default: the model's, capped by the KV pool)",
    )
    p.add_argument(
        "--indexer",
        choices=["aware", "naive"],
        default="aware",
        help="long-context models: the lightning indexer's O(context) form (aware) or its O(max_context) one (naive)",
    )
    p.add_argument("--index-topk", type=_positive, default=None, help="tokens the indexer keeps (default: the model's)")
    p.add_argument(
        "--index-topk-method",
        choices=["auto", "single", "split"],
        default="auto",
        help="the O(context) indexer's top-k kernel: one program a row (single), several (split), or by shape (auto)",
    )
    p.add_argument(
        "--dtype",
        choices=["auto", "float32", "bfloat16"],
        default="auto",
        help="weights and KV pool (auto: the weights file's, fp32); the MMA kernel needs bfloat16 for tensor cores",
    )
    p.add_argument(
        "--disable-sleep-mode",
        action="store_true",
        help="leave out POST /sleep, /wake_up and GET /is_sleeping (a server only a process checkpoint can park)",
    )
    p.add_argument(
        "--kv-cache-dtype",
        choices=["auto", "fp8_e4m3"],
        default="auto",
        help="KV pool rows (as SGLang's flag): auto keeps --dtype; fp8_e4m3 stores DeepSeek-V3.2's FP8 layout (latent "
        "e4m3 with one fp32 scale per 128 values, rope kept 16-bit) and decodes with backend torch or mma",
    )
    p.add_argument(
        "--inject-fault",
        choices=FAULTS,
        default=None,
        help="compute wrong on purpose, to test that checks catch it: attention-x0.7 scales the decode attention "
        "output by 0.7; attention-batched swaps requests' attention outputs at batch > 1 (see refserver/fault.py)",
    )
    return p


def _warmup(server: uvicorn.Server, state: ServerState, host: str, port: int, failed: threading.Event) -> None:
    """Wait for uvicorn, send one real chat completion, then mark the server ready (or take it down)."""
    while not server.started:
        if server.should_exit:
            return
        time.sleep(0.02)
    target = "127.0.0.1" if host in ("0.0.0.0", "") else ("[::1]" if host == "::" else host)
    try:
        reply = httpx.post(
            f"http://{target}:{port}/v1/chat/completions",
            json={"messages": [{"role": "user", "content": "What is 17×23?"}], "max_tokens": 8, "temperature": 0},
            timeout=WARMUP_TIMEOUT_S,
        )
        reply.raise_for_status()
        answer = reply.json()["choices"][0]["message"]["content"]
    except Exception:
        logger.error(f"Initialization failed. warmup error: {traceback.format_exc()}")
        failed.set()
        server.should_exit = True
        return
    state.ready = True
    logger.info(f"Warm-up generation done: 'What is 17×23?' -> {answer!r}")
    logger.info("The server is fired up and ready to roll!")


def main(argv: list[str] | None = None) -> int:
    """Run the server until it is stopped; returns the process exit code."""
    cli = parser()
    args = cli.parse_args(argv)
    if args.kv_cache_dtype != "auto" and args.attention_backend == "simt":
        cli.error(f"--kv-cache-dtype {args.kv_cache_dtype} decodes with --attention-backend torch or mma, not simt")
    from campaign.refserver.app import ServerState, build_app
    from campaign.refserver.engine_process import EngineProcess, EngineStartError

    configure_logging()
    logger.info(f"server_args={vars(args)}")
    # The engine (weights, pool, compile, capture) is built in its own process; this one serves HTTP.
    engine_args = {
        "model_path": args.model_path,
        "device": args.device,
        "attention_backend": args.attention_backend,
        "enable_torch_compile": args.enable_torch_compile,
        "disable_cuda_graph": args.disable_cuda_graph,
        "cuda_graph_max_bs": args.cuda_graph_max_bs,
        "cuda_graph_fallback": args.cuda_graph_fallback,
        "mem_fraction_static": args.mem_fraction_static,
        "max_total_tokens": args.max_total_tokens,
        "max_running_requests": args.max_running_requests,
        "decode_log_interval": args.decode_log_interval,
        "inject_fault": args.inject_fault,
        "context_length": args.context_length,
        "indexer": args.indexer,
        "index_topk": args.index_topk,
        "index_topk_method": args.index_topk_method,
        "dtype": args.dtype,
        "kv_cache_dtype": args.kv_cache_dtype,
    }
    try:
        engine = EngineProcess.start(engine_args)
    except EngineStartError as exc:
        return exc.code
    state = ServerState(engine, stream_interval=args.stream_interval, sleep_mode=not args.disable_sleep_mode)
    config = uvicorn.Config(
        build_app(state), host=args.host, port=args.port, log_config=uvicorn_log_config(), timeout_keep_alive=5
    )
    server = uvicorn.Server(config)
    failed = threading.Event()

    def on_fatal(_exc: BaseException) -> None:
        failed.set()
        server.should_exit = True

    engine.on_fatal = on_fatal
    threading.Thread(target=_warmup, args=(server, state, args.host, args.port, failed), daemon=True).start()
    try:
        server.run()
    except SystemExit as exc:  # uvicorn exits this way when it cannot bind; its own log line says why
        engine.stop()
        return int(exc.code) if isinstance(exc.code, int) else 1
    engine.stop()
    return 1 if failed.is_set() else 0


def run() -> None:
    """Entry point for ``python -m campaign.refserver``: exit with ``main``'s code, without waiting on threads."""
    code = main()
    os._exit(code)
