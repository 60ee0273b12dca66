"""Cooperative interruption with real signals: the handler records, the run's own checkpoints raise.

Signals are sent to this process with ``os.kill`` (the handler ``Interruption`` installs runs as it would under
Ctrl-C or ``timeout``); a fleet's host thread gets them through ``deliver``, as ``campaign.fleet`` hands them on.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from campaign.interruption import Interrupted, Interruption, LeaveNow, checkpoint, interruptible

REPO = Path(__file__).resolve().parents[1]


def _kill_soon(sig: int, after_s: float = 0.2) -> threading.Thread:
    """Send ``sig`` to this process from another thread after ``after_s`` (the handler runs in the main thread)."""
    t = threading.Timer(after_s, os.kill, (os.getpid(), sig))
    t.start()
    return t


def _handled(intr: Interruption, count: int) -> None:
    """Wait until the handler has counted ``count`` signals (it runs at the main thread's next bytecode)."""
    deadline = time.monotonic() + 5
    while intr.count < count and time.monotonic() < deadline:
        time.sleep(0.01)


def test_the_handler_only_records_and_the_next_checkpoint_raises() -> None:
    with Interruption() as intr:
        os.kill(os.getpid(), signal.SIGTERM)
        _handled(intr, 1)  # the handler ran here, between two lines, and raised nothing into them
        assert (intr.count, intr.first) == (1, signal.SIGTERM)
        with pytest.raises(Interrupted) as first:
            checkpoint()
        assert type(first.value) is Interrupted and first.value.exit_code == 143
        # Not caught yet (swallowed somewhere, say): the next checkpoint raises it again.
        with pytest.raises(Interrupted):
            checkpoint()
        intr.caught(first.value)
        checkpoint()  # caught: the clean-up runs on
        os.kill(os.getpid(), signal.SIGINT)
        _handled(intr, 2)
        with pytest.raises(LeaveNow) as second:
            checkpoint()
        assert second.value.signum == signal.SIGINT
        intr.caught(second.value)
        intr.quiet()
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # the handlers it replaced are back


def test_quiet_counts_signals_and_raises_none() -> None:
    with Interruption() as intr:
        intr.quiet()
        os.kill(os.getpid(), signal.SIGHUP)
        _handled(intr, 1)
        checkpoint()
        assert intr.count == 1 and intr.pending() is None


def test_a_long_sleep_ends_at_once_on_a_signal() -> None:
    with Interruption() as intr:
        timer = _kill_soon(signal.SIGINT)
        started = time.monotonic()
        with pytest.raises(Interrupted) as caught:
            intr.sleep(30)
        timer.join()
        assert time.monotonic() - started < 3
        assert caught.value.signum == signal.SIGINT
        intr.caught(caught.value)
        # Once caught, a later sleep sleeps (a retry backoff in the clean-up is not cut short by the old signal).
        started = time.monotonic()
        intr.sleep(0.3)
        assert time.monotonic() - started >= 0.3


def test_an_awaited_read_that_never_answers_is_cancelled_by_a_signal() -> None:
    """A stream whose server sends nothing: the signal cancels the read, the coroutine's clean-up runs."""
    cleaned: list[str] = []

    async def read_forever() -> bytes:
        accepted: list[asyncio.StreamWriter] = []
        server = await asyncio.start_server(lambda _r, w: accepted.append(w), "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            return await reader.read(1)  # the server never writes
        finally:
            for w in [writer, *accepted]:
                w.close()
            server.close()
            await server.wait_closed()
            cleaned.append("closed")

    with Interruption() as intr:
        timer = _kill_soon(signal.SIGTERM, 0.3)
        started = time.monotonic()
        with pytest.raises(Interrupted):
            asyncio.run(interruptible(read_forever()))
        timer.join()
        assert time.monotonic() - started < 3
        assert cleaned == ["closed"] and intr.count == 1


def test_a_host_thread_raises_what_the_main_thread_delivers_at_its_own_checkpoint() -> None:
    """As a fleet runs: the host's loop sleeps in its thread; the main thread hands the signal on and wakes it."""
    intr = Interruption()
    entered = threading.Event()
    outcome: list[BaseException | str] = []

    def host_loop() -> None:
        with intr:
            entered.set()
            try:
                intr.sleep(30)
                outcome.append("slept through")
            except Interrupted as e:
                outcome.append(e)

    thread = threading.Thread(target=host_loop)
    thread.start()
    assert entered.wait(5)
    started = time.monotonic()
    intr.deliver(signal.SIGTERM)
    thread.join(timeout=10)
    assert time.monotonic() - started < 3
    assert len(outcome) == 1 and isinstance(outcome[0], Interrupted) and outcome[0].signum == signal.SIGTERM


def test_a_signal_delivered_before_the_host_began_is_raised_at_its_first_checkpoint() -> None:
    intr = Interruption()
    intr.deliver(signal.SIGINT)
    with intr, pytest.raises(Interrupted):
        checkpoint()


def test_a_third_signal_ends_the_process_at_once() -> None:
    """Two signals are the run's to handle; the third has the signal's default effect (a stuck clean-up ends)."""
    code = (
        "import os, signal, time\n"
        "from campaign.interruption import Interruption\n"
        "with Interruption() as intr:\n"
        "    for _ in range(3):\n"
        "        os.kill(os.getpid(), signal.SIGTERM)\n"
        "        time.sleep(0.2)\n"
        "    print('survived', intr.count)\n"
    )
    res = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert res.returncode == -signal.SIGTERM, (res.returncode, res.stdout, res.stderr)
    assert "survived" not in res.stdout


def test_no_asynchronous_exception_injection_is_left() -> None:
    """The old design raised into arbitrary frames and threads; none of its machinery may come back."""
    source = "\n".join(p.read_text() for p in (REPO / "campaign").rglob("*.py"))
    for gone in ("PyThreadState_SetAsyncExc", "unraisablehook", "set_exception_handler", "unswallowed"):
        assert gone not in source, gone
