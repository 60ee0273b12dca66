"""A signal whose exception some code swallowed is raised again at the run's next checkpoint.

Real signals sent to this process (``os.kill``), raised by the handler that ``Interruption`` installs, landing where
Python loses them: inside a finalizer and inside an asyncio loop callback. The stress run that found this
(docs/reliability.md): Ctrl-C landed in a garbage-collected event loop's ``__del__`` and the run went on to exit 0.
"""

from __future__ import annotations

import asyncio
import gc
import os
import signal
import threading
import time

import pytest

from campaign.interruption import Interrupted, Interruption, LeaveNow, checkpoint, unswallowed


class _SignalsInFinalizer:
    """An object whose finalizer gets a signal and runs on until the handler has run inside it."""

    def __init__(self, intr: Interruption, sig: int) -> None:
        self.intr, self.sig = intr, sig

    def __del__(self) -> None:
        before = self.intr.count
        os.kill(os.getpid(), self.sig)
        deadline = time.monotonic() + 5
        while self.intr.count == before and time.monotonic() < deadline:  # the handler runs at one of these
            pass


def _lose_one(intr: Interruption, sig: int = signal.SIGINT) -> None:
    obj = _SignalsInFinalizer(intr, sig)
    del obj  # the finalizer swallows what the handler raised in it ("Exception ignored in ...")
    gc.collect()


def test_a_signal_lost_in_a_finalizer_is_raised_at_the_next_checkpoint(capfd: pytest.CaptureFixture[str]) -> None:
    with Interruption() as intr:
        _lose_one(intr)
        assert intr.count == 1  # counted, and nothing raised here: the finalizer ate it
        with pytest.raises(Interrupted) as raised:
            checkpoint()
        assert raised.value.name == "SIGINT" and raised.value.exit_code == 130
        assert not isinstance(raised.value, LeaveNow)
        # Once the pipeline has caught it, cleaning up goes on: the checkpoint no longer raises it.
        intr.caught(raised.value)
        checkpoint()
    # Not printed as "Exception ignored": the checkpoint stands in for it, and a user sees no traceback.
    assert "Exception ignored" not in capfd.readouterr().err


def test_a_second_signal_lost_while_cleaning_up_is_raised_as_leave_now() -> None:
    with Interruption() as intr:
        with pytest.raises(Interrupted) as first:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)
        intr.caught(first.value)
        _lose_one(intr, signal.SIGTERM)
        assert intr.count == 2
        with pytest.raises(LeaveNow) as second:
            checkpoint()
        assert second.value.exit_code == 143


def test_checkpoints_hold_inside_a_shield_and_once_quiet() -> None:
    with Interruption() as intr:
        with pytest.raises(Interrupted), intr.shielded():
            _lose_one(intr)
            checkpoint()  # a shielded section is never cut, even by a lost signal ...
        # ... and the shield raises what it held when it ends (above); once quiet, nothing is raised.
        intr.quiet()
        _lose_one(intr)
        checkpoint()
    checkpoint()  # no run in this thread: nothing to raise


def test_a_signal_handed_to_another_thread_is_not_lost_before_it_lands_there() -> None:
    """A fleet host's thread gets the signal at its next bytecode; until then a checkpoint must not raise it too.

    Raised twice, the second copy would land in the middle of the clean-up the first one started.
    """
    intr = Interruption()
    blocked, release = threading.Event(), threading.Event()
    seen: list[object] = []

    def host() -> None:
        with intr:
            try:
                blocked.set()
                release.wait(30)  # blocked in C: a delivered exception lands when this returns
                time.sleep(5)
            except Interrupted as e:
                seen.append(intr.lost())  # landed, not caught yet: a checkpoint would raise it
                intr.caught(e)
                seen.append(intr.lost())

    thread = threading.Thread(target=host)
    thread.start()
    assert blocked.wait(10)
    time.sleep(0.2)  # inside release.wait by now
    intr.deliver(signal.SIGTERM)
    assert intr.count == 1 and intr.lost() is None  # on its way, not lost
    release.set()
    thread.join(10)
    assert not thread.is_alive()
    assert isinstance(seen[0], Interrupted) and seen[1] is None


def test_a_signal_swallowed_by_an_asyncio_callback_ends_the_awaiting_call() -> None:
    async def work() -> str:
        loop = asyncio.get_running_loop()

        def callback() -> None:  # a loop callback, as a transport's read is: asyncio logs what it raises and goes on
            os.kill(os.getpid(), signal.SIGINT)
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline:
                pass

        loop.call_soon(callback)
        await asyncio.sleep(30)
        return "finished"

    with Interruption() as intr:
        t0 = time.monotonic()
        with pytest.raises(Interrupted):
            asyncio.run(unswallowed(work()))
        assert time.monotonic() - t0 < 10  # ended there, not after the 30 s sleep
        assert intr.count == 1
