"""Interruption: SIGINT, SIGTERM and SIGHUP while a run holds a box, handled alike and cooperatively.

Ctrl-C, ``timeout``, a CI cancellation, ``docker stop`` and a closed terminal must not leave an unproven server
running, a lock behind and a run that reads ``running`` for ever. While an ``Interruption`` is active (a context
manager; its signal handlers are installed when it is entered in the main thread):

- the **first** signal makes the run's next checkpoint raise ``Interrupted``; the pipeline then stops the variant
  under test, puts the known-good back (or applies ``at_end: stop``), records the attempt and the run as
  ``interrupted`` and releases the lock;
- a **second** signal makes the next checkpoint raise ``LeaveNow``: the pipeline stops cleaning up, records what
  still runs and the command that fixes it, and leaves;
- a **third** has the signal's default effect (the process dies at once).

**The handler only records.** It counts the signal and wakes whoever sleeps (``sleep``/``wait``); it raises nothing.
The exception is raised by ``checkpoint()``, in the run's own thread, at the places the run waits or moves on: each
readiness poll, each smoke question, each bench request, each stage of an attempt, each variant, each sleep. So a
section between two checkpoints (a launch and its record in current.json, taking the lock) is never cut in half,
and nothing is raised into a finalizer, an event loop's callback or a thread. The cost is a latency bounded by the
longest call between two checkpoints, and every such call has a timeout (the ``Host`` contract; each HTTP read of
readiness, smoke and bench). An asyncio section (smoke, bench) runs under ``interruptible``: a signal cancels it at
once, whatever it awaits, and the checkpoint raises.

A checkpoint raises a recorded signal until the pipeline says it ``caught`` it (an exception some code swallowed is
raised again at the next checkpoint); ``quiet()`` ends the raising for the run's last bookkeeping.

Sleeps wait on the context's wake-up pipe, not on a lock: the handler runs in the main thread between any two
bytecodes, possibly while that thread holds a ``threading.Event``'s lock, so setting an Event from it could
deadlock; writing a byte to a pipe cannot.

The exit code of an interrupted run is the shell's 128 + N: 130 for SIGINT, 143 for SIGTERM, 129 for SIGHUP.

Signals reach only the main thread. A fleet (``campaign.fleet``) runs each host's loop in a thread of its own, each
with its own ``Interruption`` (entered in that thread: no handlers of its own); the main thread records the signal
in its own context and hands it to each host's with ``deliver``, which records it there and wakes that thread's
sleeps; that thread's checkpoints then raise it.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import select
import signal
import threading
import time
from collections.abc import Coroutine
from types import FrameType
from typing import Any, TypeVar

#: The signals a run handles, in the order they are documented.
SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
#: How often an asyncio section (``interruptible``) looks whether a signal is pending.
_WATCH_S = 0.1


class Interrupted(BaseException):  # like KeyboardInterrupt: `except Exception` never eats it
    """The first signal: clean up, then leave with ``exit_code``."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum

    @property
    def name(self) -> str:
        """``SIGTERM``."""
        return signal.Signals(self.signum).name

    @property
    def exit_code(self) -> int:
        """128 + the signal number, as a shell reports a death by that signal."""
        return 128 + self.signum


class LeaveNow(Interrupted):
    """The second signal: stop cleaning up and leave now."""


class Interruption:
    """The signals a run received (``count``, ``first``, ``last``) and the checkpoint that raises them."""

    def __init__(self) -> None:
        self.count = 0
        self.first: int | None = None
        #: The signal counted last (what a ``LeaveNow`` names).
        self.last: int | None = None
        #: How far the pipeline has caught what was raised: 1 the first signal's ``Interrupted``, 2 a ``LeaveNow``.
        self._caught = 0
        self._quiet = False
        self._saved: dict[int, Any] = {}
        #: The wake-up pipe, open while the context is active (read end, write end).
        self._pipe: tuple[int, int] | None = None
        #: Orders ``deliver`` (the main thread) with this context's end (its own thread); never taken by a handler.
        self._mutex = threading.Lock()

    def __enter__(self) -> Interruption:
        read, write = os.pipe()
        os.set_blocking(read, False)
        os.set_blocking(write, False)
        with self._mutex:
            self._pipe = (read, write)
        _active.current = self
        if threading.current_thread() is threading.main_thread():
            for sig in SIGNALS:
                self._saved[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        _active.current = None
        for sig, old in self._saved.items():
            signal.signal(sig, old)
        self._saved.clear()
        with self._mutex:
            pipe, self._pipe = self._pipe, None
        if pipe is not None:
            os.close(pipe[0])
            os.close(pipe[1])

    def _record(self, signum: int) -> None:
        """Count one signal (what the next checkpoint raises)."""
        self.count += 1
        self.last = signum
        if self.count == 1:
            self.first = signum
        elif self._saved:
            for sig in self._saved:
                signal.signal(sig, signal.SIG_DFL)  # a third signal ends the process at once

    def _wake(self, pipe: tuple[int, int] | None) -> None:
        if pipe is not None:
            with contextlib.suppress(OSError):  # full: a wake-up is already waiting
                os.write(pipe[1], b"\0")

    def _handle(self, signum: int, _frame: FrameType | None) -> None:
        # The handler runs in the main thread, which is inside this context (the pipe stays open until the handlers
        # are put back): no lock, only a count and a byte written.
        self._record(signum)
        self._wake(self._pipe)

    def deliver(self, signum: int) -> None:
        """Record a signal the main thread caught for the run in this context's thread (a fleet's host).

        Recorded whether or not the run has entered its context yet: a host that had not started raises it at its
        first checkpoint.
        """
        with self._mutex:
            self._record(signum)
            self._wake(self._pipe)

    @property
    def level(self) -> int:
        """What the signals so far ask for: 0 nothing, 1 clean up and leave, 2 leave now."""
        return min(self.count, 2)

    def pending(self) -> Interrupted | None:
        """The exception a checkpoint would raise now, or None."""
        if self._quiet or self.level <= self._caught:
            return None
        if self.level >= 2 and self.last is not None:
            return LeaveNow(self.last)
        return Interrupted(self.first if self.first is not None else signal.SIGINT)

    def checkpoint(self) -> None:
        """Raise the signal recorded and not yet caught (``Interrupted``, or ``LeaveNow`` after a second)."""
        exc = self.pending()
        if exc is not None:
            raise exc

    def caught(self, exc: Interrupted) -> None:
        """The pipeline caught ``exc``: checkpoints raise only a later, stronger signal from now on."""
        self._caught = max(self._caught, 2 if isinstance(exc, LeaveNow) else 1)

    def quiet(self) -> None:
        """From now on signals are only counted (the run's last bookkeeping must not be cut)."""
        self._quiet = True

    def wait(self, seconds: float) -> bool:
        """Sleep up to ``seconds``; True as soon as a signal is pending (one that came before the call included).

        Used in this context's own thread; outside the context it is a plain sleep.
        """
        pipe = self._pipe
        deadline = time.monotonic() + seconds
        while True:
            if pipe is not None:
                self._drain(pipe[0])  # before the look below: a signal after it leaves a byte that ends the select
            if self.pending() is not None:
                return True
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            if pipe is None:
                time.sleep(left)
            else:
                select.select([pipe[0]], [], [], left)

    def sleep(self, seconds: float) -> None:
        """Sleep up to ``seconds``, then checkpoint: a signal ends the sleep at once and is raised."""
        self.wait(seconds)
        self.checkpoint()

    @staticmethod
    def _drain(fd: int) -> None:
        with contextlib.suppress(OSError):
            while os.read(fd, 64):
                pass


class _Active(threading.local):
    current: Interruption | None = None


#: The Interruption active in each thread (a fleet runs one per host thread).
_active = _Active()


def active() -> Interruption | None:
    """The run's ``Interruption`` in this thread, or None outside a run."""
    return _active.current


def checkpoint() -> None:
    """Raise a recorded signal of the run in this thread (``Interruption.checkpoint``); nothing outside a run."""
    intr = _active.current
    if intr is not None:
        intr.checkpoint()


def sleep(seconds: float) -> None:
    """``time.sleep`` that a signal to the run in this thread ends at once, raising it (``Interruption.sleep``)."""
    intr = _active.current
    if intr is None:
        time.sleep(seconds)
    else:
        intr.sleep(seconds)


_T = TypeVar("_T")


async def interruptible(work: Coroutine[Any, Any, _T]) -> _T:
    """Await ``work``; a signal to the run in this thread cancels it at once and is raised from here.

    Whatever ``work`` awaits (a socket read of a stream, a connect), cancelling its task ends it: the coroutine's own
    ``finally`` blocks close its connections. Outside a run this is ``await work``.
    """
    intr = _active.current
    if intr is None:
        return await work
    task = asyncio.ensure_future(work)
    while True:
        done, _ = await asyncio.wait({task}, timeout=_WATCH_S)
        if intr.pending() is not None:
            task.cancel()
            with contextlib.suppress(BaseException):
                await task
            intr.checkpoint()
        if done:
            return task.result()
