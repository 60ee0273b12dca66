"""A tiny HTTP server for tests whose health endpoint fails on its first launches (the seam is a custom recipe).

It counts its launches in ``--state`` (a file). While the count is at most ``--fail-launches`` it prints the ready
line but answers every ``/health`` with 503 (health flapping after the ready line); after that it answers 200.
``--bad`` is a flag nothing accepts in real servers either: argparse rejects it with exit status 2.
"""

from __future__ import annotations

import argparse
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path


def main() -> None:
    """Parse the flags, count this launch, serve."""
    p = argparse.ArgumentParser()
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--state", type=Path, required=True)
    p.add_argument("--fail-launches", type=int, default=1)
    args = p.parse_args()
    launches = int(args.state.read_text()) + 1 if args.state.exists() else 1
    args.state.write_text(str(launches))
    healthy = launches > args.fail_launches

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            code = 200 if healthy or self.path != "/health" else 503
            self.send_response(code)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, format: str, *a: object) -> None:
            print(f"request: {format % a}", flush=True)

    server = ThreadingHTTPServer(("127.0.0.1", args.port), Handler)
    print(f"flaky: launch {launches}, health {'ok' if healthy else 'failing'}", flush=True)
    print("flaky: ready to serve", flush=True)
    sys.stdout.flush()
    server.serve_forever()


if __name__ == "__main__":
    main()
