"""A small OpenAI-compatible server for the fault matrix: it answers a x b and a + b, and ``--mode`` breaks one thing.

Modes (each changes exactly one behaviour):

- ``ok``: prints the ready line, serves /health, /v1/models and chat completions.
- ``drip``: completions answer 200 and then one byte every 2 s, for ever.
- ``hang``: completions never answer (health stays 200).
- ``bigline``: writes ``BIGLINE_MB`` MiB with no newline, then an out-of-memory line, and exits 1.
- ``ready-then-die``: prints the ready line and exits 0 before serving.
- ``marker-nonl``: prints the ready line without a newline, then serves.
- ``ansi-log``: logs OSC and CSI sequences (a window title, a clipboard write) before its ready line.
- ``secret-echo``: prints its command line and the environment's secret-looking values, then serves.
- ``slow-start``: waits ``SLOW_S`` seconds (3 by default) before its ready line.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

READY = "FAULT SERVER READY"


def answer(text: str) -> str:
    """The answer to the last ``What is a×b?`` / ``a+b`` in ``text``."""
    found = re.findall(r"(\d+)\s*([×x+*])\s*(\d+)", text)
    if not found:
        return "I do not know"
    a, op, b = found[-1]
    return str(int(a) + int(b) if op == "+" else int(a) * int(b))


def main() -> None:
    """Parse the flags, misbehave as ``--mode`` says, serve."""
    p = argparse.ArgumentParser()
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--mode", default="ok")
    p.add_argument("--api-key", default="")
    args = p.parse_args()
    mode = args.mode
    print("fault server starting", flush=True)
    if mode == "secret-echo":
        print("argv:", " ".join(sys.argv), flush=True)
        for k, v in os.environ.items():
            if "KEY" in k or "TOKEN" in k:
                print(f"env {k}={v}", flush=True)
    if mode == "ansi-log":
        print("\x1b]0;PWNED-TITLE\x07\x1b]52;c;cm0gLXJmIH4vKgo=\x1b\\\x1b[2Jcleared", flush=True)
    if mode == "slow-start":
        time.sleep(float(os.environ.get("SLOW_S", "3")))
    if mode == "bigline":
        chunk = b"x" * (1 << 20)
        for _ in range(int(os.environ.get("BIGLINE_MB", "1"))):
            sys.stdout.buffer.write(chunk)
        sys.stdout.buffer.write(b"\nRuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB\n")
        sys.stdout.flush()
        sys.exit(1)

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def _json(self, code: int, doc: object) -> None:
            body = json.dumps(doc).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:
            if self.path == "/health":
                self._json(200, {"ok": True})
            elif self.path == "/v1/models":
                self._json(200, {"data": [{"id": "fault", "max_model_len": 4096}]})
            else:
                self._json(404, {"error": "no such path"})

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            doc = json.loads(self.rfile.read(length) or b"{}")
            if mode == "hang":
                time.sleep(3600)
            if mode == "drip":
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                while True:
                    self.wfile.write(b"1\r\n \r\n")
                    self.wfile.flush()
                    time.sleep(2)
            messages = doc.get("messages") or [{"content": doc.get("prompt", "")}]
            reply = answer(str(messages[-1].get("content", "")))
            self._json(
                200,
                {
                    "choices": [
                        {"index": 0, "message": {"role": "assistant", "content": reply}, "finish_reason": "stop"}
                    ]
                },
            )

        def log_message(self, format: str, *a: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", args.port), Handler)
    if mode == "marker-nonl":
        sys.stdout.write(READY)
        sys.stdout.flush()
    else:
        print(READY, flush=True)
    if mode == "ready-then-die":
        sys.exit(0)
    server.serve_forever()


if __name__ == "__main__":
    main()
