"""The engine in a process of its own, and the handle the HTTP process holds on it.

As SGLang runs its scheduler apart from its HTTP server, the reference server runs the engine (model, KV pool and
the scheduler loop) in a child process and the FastAPI app in the parent: two interpreters, so neither waits for
the other's GIL. In one process the HTTP thread took the GIL whenever a decode step let go of it (every torch call
does) and the step then waited to get it back: at 32 streams on the H200 that added about 0.8 ms to a 1.3 ms step.

The two talk over a socket pair, one pickled tuple a message (``multiprocessing.connection.Connection``):

- to the engine: the engine's settings first (a dict of ``EngineArgs`` fields), then ``("submit", rid, prompt,
  max_new_tokens, temperature, ignore_eos, logprobs)``, ``("abort", rid)``, ``("call", call_id, name, args)``
  (the profiler's ``start`` and ``stop``, the sleeper's ``sleep`` and ``wake``) and ``("stop",)``;
- from the engine: ``("ready", info)`` once it is built, or ``("failed", exit_code)`` when it could not be (its log
  says why); then, after every scheduler step that changed anything, ``("tokens", items, stats, token_usage)``
  with one item ``(rid, token or None, finish reason or None, TokenLogprob or None)`` per token handed out;
  ``("reply", call_id, ok, value)``; ``("fatal", text)`` when a step raised (the engine process then exits).

Each process logs to the same stdout. The engine process ends when told to stop or when its socket closes (the
server died), so it never outlives the server; it ignores SIGINT, leaving shutdown to the server.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import os
import signal
import socket
import subprocess
import sys
import threading
import traceback
from functools import partial
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from campaign.refserver.log import configure_logging, logger
from campaign.refserver.profiler import ProfileError, Profiler
from campaign.refserver.request import Request, Stats, TokenLogprob

#: Longest wait for a profiler call to be answered (exporting a large trace takes seconds).
CALL_TIMEOUT_S = 600.0
#: The calls the engine's ``Sleeper`` answers (the others go to the profiler).
SLEEP_CALLS = frozenset({"sleep", "wake"})
#: Longest wait for the engine process to end once told to stop, before it is killed.
STOP_TIMEOUT_S = 10.0


class EngineStartError(Exception):
    """The engine process could not build the engine; ``code`` is the exit code the server should end with."""

    def __init__(self, code: int) -> None:
        super().__init__(f"the engine did not start (exit code {code})")
        self.code = code


# ---- the HTTP process's side --------------------------------------------------------------------------------


class EngineProcess:
    """The HTTP process's handle on the engine process: submit and abort requests, read counters, drive the profiler.

    Requests are the HTTP side's own ``Request`` objects: a reader thread fills in each one's tokens (and
    log-probabilities) as the engine reports them and then calls its sink, as the in-process engine did.
    """

    def __init__(self, proc: subprocess.Popen[bytes], conn: Connection, info: dict[str, Any]) -> None:
        self._proc = proc
        self._conn = conn
        self.model_id: str = info["model_id"]
        self.context_len: int = info["context_len"]
        self.device: str = info["device"]
        self.model_path: str = info["model_path"]
        self.stats = Stats()
        self.token_usage = 0.0
        self.fatal: BaseException | None = None
        #: Called once, on the reader thread, when the engine dies.
        self.on_fatal: Any = None
        self.profiler = _ProfilerProxy(self)
        self._requests: dict[int, Request] = {}
        self._calls: dict[int, list[Any]] = {}
        self._call_ids = itertools.count()
        self._lock = threading.Lock()
        self._stopping = False
        self._reader = threading.Thread(target=self._read, name="engine-reader", daemon=True)
        self._reader.start()

    @classmethod
    def start(cls, engine_args: dict[str, Any]) -> EngineProcess:
        """Start the engine process with ``engine_args`` and wait until its engine is built.

        Raises ``EngineStartError`` when it is not (the engine process has logged why).
        """
        ours, theirs = socket.socketpair()
        with theirs:
            proc = subprocess.Popen(
                [sys.executable, "-m", "campaign.refserver.engine_process", str(theirs.fileno())],
                pass_fds=(theirs.fileno(),),
            )
        conn = Connection(ours.detach())
        try:
            conn.send(engine_args)
            kind, value = conn.recv()
        except (EOFError, OSError):
            code = proc.wait()
            logger.error(f"The engine process exited with code {code} before its engine was built.")
            conn.close()
            raise EngineStartError(1) from None
        if kind != "ready":
            proc.wait()
            conn.close()
            raise EngineStartError(int(value))
        return cls(proc, conn, value)

    def submit(self, request: Request) -> None:
        """Send ``request`` to the engine; its sink gets each token. Raises when the engine died."""
        if self.fatal is not None:
            raise RuntimeError(f"the engine stopped after an error: {self.fatal}")
        message = (
            "submit",
            request.rid,
            request.prompt,
            request.max_new_tokens,
            request.temperature,
            request.ignore_eos,
            request.logprobs,
        )
        with self._lock:
            self._requests[request.rid] = request
            self._conn.send(message)

    def abort(self, request: Request) -> None:
        """Stop generating for ``request`` (its client went away)."""
        request.aborted = True
        with self._lock:
            if self._requests.pop(request.rid, None) is None:
                return
            with contextlib.suppress(OSError):  # the engine is gone: nothing to stop
                self._conn.send(("abort", request.rid))

    def call(self, name: str, *args: Any) -> Any:
        """Run the engine process's profiler method ``name`` and return its answer; raises ``ProfileError``."""
        call_id = next(self._call_ids)
        slot: list[Any] = [threading.Event(), False, ("the engine stopped", 503)]
        with self._lock:
            if self.fatal is not None:
                raise ProfileError(f"the engine stopped after an error: {self.fatal}", status=503)
            self._calls[call_id] = slot
            self._conn.send(("call", call_id, name, args))
        if not slot[0].wait(CALL_TIMEOUT_S):
            with self._lock:
                self._calls.pop(call_id, None)
            raise ProfileError(f"the engine did not answer {name} within {CALL_TIMEOUT_S:.0f} s", status=504)
        ok, value = slot[1], slot[2]
        if not ok:
            raise ProfileError(value[0], status=value[1])
        return value

    def stop(self) -> None:
        """Tell the engine process to end and wait for it (it is killed if it does not end in time)."""
        self._stopping = True
        with self._lock, contextlib.suppress(OSError):
            self._conn.send(("stop",))
        try:
            self._proc.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            logger.warning(f"The engine process did not end within {STOP_TIMEOUT_S:.0f} s; killing it.")
            self._proc.kill()  # our own child
            self._proc.wait()
        self._conn.close()

    def _read(self) -> None:
        try:
            while True:
                message = self._conn.recv()
                kind = message[0]
                if kind == "tokens":
                    self.stats, self.token_usage = message[2], message[3]
                    self._deliver(message[1])
                elif kind == "reply":
                    with self._lock:
                        slot = self._calls.pop(message[1], None)
                    if slot is not None:
                        slot[1], slot[2] = message[2], message[3]
                        slot[0].set()
                elif kind == "fatal":
                    self._die(message[1])
                    return
        except (EOFError, OSError):
            if not self._stopping:
                self._die(f"the engine process exited (exit code {self._proc.poll()})")

    def _deliver(self, items: list[tuple[int, int | None, str | None, TokenLogprob | None]]) -> None:
        for rid, token, reason, logprob in items:
            with self._lock:
                request = self._requests.pop(rid) if reason is not None else self._requests.get(rid)
            if request is None:
                continue  # aborted here meanwhile
            if token is not None:
                request.output.append(token)
                if logprob is not None:
                    request.token_logprobs.append(logprob)
            if reason is not None and reason != "error":
                request.finish_reason = reason
            if request.sink is not None and not request.aborted:
                request.sink(token, reason)

    def _die(self, why: str) -> None:
        self.fatal = RuntimeError(why)
        with self._lock:
            pending, self._requests = list(self._requests.values()), {}
            calls, self._calls = list(self._calls.values()), {}
        for request in pending:
            if request.sink is not None:
                request.sink(None, "error")
        for slot in calls:
            slot[0].set()
        if self.on_fatal is not None:
            self.on_fatal(self.fatal)


class _ProfilerProxy:
    """The profiler routes' view of the engine process's profiler (it must run where the kernels are launched)."""

    def __init__(self, engine: EngineProcess) -> None:
        self._engine = engine

    def start(self, output_dir: str | None, activities: list[str] | None) -> dict[str, Any]:
        """Start recording in the engine process; raises ``ProfileError``."""
        answer: dict[str, Any] = self._engine.call("start", output_dir, activities)
        return answer

    def stop(self) -> dict[str, Any]:
        """Stop recording and write the trace in the engine process; raises ``ProfileError``."""
        answer: dict[str, Any] = self._engine.call("stop")
        return answer


# ---- the engine process -------------------------------------------------------------------------------------


class _Scheduler:
    """The engine process's loop: take what the HTTP process sent, run one scheduler step, report what it made."""

    def __init__(self, engine: Any, conn: Connection) -> None:
        self.engine = engine
        self.conn = conn
        self.requests: dict[int, Request] = {}
        self.out: list[tuple[int, int | None, str | None, TokenLogprob | None]] = []
        self.profiler = Profiler(engine.args.device)
        from campaign.refserver.sleeper import Sleeper  # torch: the engine process's side only

        self.sleeper = Sleeper(engine)
        self._send_lock = threading.Lock()
        self._sent: tuple[Stats, float] | None = None

    def send(self, message: tuple[Any, ...]) -> None:
        with self._send_lock:  # profiler replies come from their own threads
            self.conn.send(message)

    def run(self) -> int:
        """Serve until told to stop (0), the server goes away (0), or a step raises (1)."""
        while True:
            try:
                wait = self.engine.idle  # nothing to run: block until a message comes
                while wait or self.conn.poll():
                    if not self.handle(self.conn.recv()):
                        return 0
                    wait = False
            except (EOFError, OSError):
                return 0
            try:
                self.engine.step()
            except BaseException as exc:  # the scheduler is the engine: any error ends it, loudly
                self.engine.fail(exc)
                self.report()
                self.send(("fatal", f"{type(exc).__name__}: {exc}"))
                return 1
            self.report()

    def handle(self, message: tuple[Any, ...]) -> bool:
        """Act on one message; False for ``stop``."""
        kind = message[0]
        if kind == "submit":
            _, rid, prompt, max_new, temperature, ignore_eos, logprobs = message
            request = Request(
                prompt, max_new, temperature=temperature, ignore_eos=ignore_eos, logprobs=logprobs, rid=rid
            )
            if self.sleeper.asleep:  # it slipped past the HTTP side's parked check: the pool is gone
                self.out.append((rid, None, "error", None))
                return True
            request.sink = partial(self.sink, request)
            self.requests[rid] = request
            self.engine.submit(request)
        elif kind == "abort":
            aborted = self.requests.pop(message[1], None)
            if aborted is not None:
                self.engine.abort(aborted)
        elif kind == "call" and message[2] in SLEEP_CALLS:
            self.call(*message[1:])  # on the scheduler's thread: no step runs while the engine's tensors move
        elif kind == "call":
            threading.Thread(target=self.call, args=message[1:], daemon=True).start()
        elif kind == "stop":
            return False
        return True

    def sink(self, request: Request, token: int | None, reason: str | None) -> None:
        logprob = request.token_logprobs[-1] if token is not None and request.logprobs is not None else None
        self.out.append((request.rid, token, reason, logprob))
        if reason is not None:
            self.requests.pop(request.rid, None)

    def report(self) -> None:
        """Send the step's tokens with the counters, when there are tokens or the counters moved."""
        state = (dataclasses.replace(self.engine.stats), self.engine.token_usage)
        if not self.out and state == self._sent:
            return
        items, self.out = self.out, []
        self._sent = state
        self.send(("tokens", items, *state))

    def call(self, call_id: int, name: str, args: tuple[Any, ...]) -> None:
        try:
            value = getattr(self.sleeper if name in SLEEP_CALLS else self.profiler, name)(*args)
            self.send(("reply", call_id, True, value))
        except ProfileError as exc:
            self.send(("reply", call_id, False, (exc.message, exc.status)))
        except Exception as exc:  # an unexpected failure answers the request instead of hanging it
            self.send(("reply", call_id, False, (f"{type(exc).__name__}: {exc}", 500)))


def serve(fd: int) -> int:
    """The engine process: build the engine from the settings the server sends, then run the scheduler loop."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    configure_logging()
    conn = Connection(fd)
    settings: dict[str, Any] = conn.recv()
    import torch

    from campaign.refserver.decode_runner import CaptureError
    from campaign.refserver.engine import WEIGHTS, Engine, EngineArgs

    path = settings.get("model_path")
    if path is None:
        path = WEIGHTS
    elif not path.exists() and path.parent == Path() and (WEIGHTS.parent / path).is_file():
        # A bare name (as a campaign config gives it, whatever directory the server starts in): the packaged file.
        path = WEIGHTS.parent / path
    if not path.is_file():
        logger.error(f"--model-path {path}: no such file")
        conn.send(("failed", 2))
        return 2
    device = settings.get("device") or ("cuda" if torch.cuda.is_available() else "cpu")
    try:
        engine = Engine(EngineArgs(**{**settings, "model_path": path, "device": device}))
    except CaptureError as exc:
        logger.error(f"Scheduler hit an exception: {traceback.format_exc()}")
        logger.error(str(exc).splitlines()[0])
        conn.send(("failed", 1))
        return 1
    except Exception:
        logger.error(f"Scheduler hit an exception: {traceback.format_exc()}")
        conn.send(("failed", 1))
        return 1
    info = {"model_id": engine.model_id, "context_len": engine.context_len, "device": device, "model_path": str(path)}
    conn.send(("ready", info))
    return _Scheduler(engine, conn).run()


if __name__ == "__main__":
    code = serve(int(sys.argv[1]))
    sys.stdout.flush()
    # Without the interpreter's teardown: with torch loaded it took over a second, and a campaign stopping the
    # server waits for every process of it to be gone.
    os._exit(code)
