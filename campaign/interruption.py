"""Interruption: SIGINT, SIGTERM and SIGHUP while a run holds a box, handled alike.

Ctrl-C, ``timeout``, a CI cancellation, ``docker stop`` and a closed terminal must not leave an unproven server
running, a lock behind and a run that reads ``running`` for ever. While an ``Interruption`` is active (a context
manager, installed from the main thread):

- the **first** signal raises ``Interrupted`` where the run is; the pipeline then stops the variant under test,
  puts the known-good back (or applies ``at_end: stop``), records the attempt and the run as ``interrupted`` and
  releases the lock;
- a **second** signal raises ``LeaveNow``: the pipeline stops cleaning up, records what still runs and the command
  that fixes it, and leaves;
- a **third** has the signal's default effect (the process dies at once).

Sections that must not be cut in half (the launch and its record in current.json, taking the lock) run under
``shielded()``: a signal arriving there is raised when the section ends.

**A raised signal can be lost.** Python runs the handler between any two bytecodes, and some code swallows what it
raises: a finalizer (``__del__`` of an event loop the garbage collector frees: "Exception ignored in"), an asyncio
callback (asyncio re-raises only ``KeyboardInterrupt`` and ``SystemExit`` from a transport's read), third-party
``except BaseException``. A lost signal once let a run go on to the end and exit 0 after Ctrl-C. So the pipeline
says when it has caught one (``caught``), and ``checkpoint()``, called where the run waits or moves to its next step
(each readiness poll, each smoke question, each bench request, each phase of an attempt), raises again a signal
whose exception was raised but never caught. Only one that was raised: a signal held by a shield, or handed to
another thread and not landed there yet (``deliver``), is on its way, and raising it from a checkpoint as well would
raise it twice, the second time in the middle of the clean-up. A finalizer's lost ``Interrupted`` is not printed
(``sys.unraisablehook``), since the checkpoint raises it; ``unswallowed`` raises one that an asyncio callback
swallowed at once.

The exit code of an interrupted run is the shell's 128 + N: 130 for SIGINT, 143 for SIGTERM, 129 for SIGHUP.

Signals reach only the main thread. A fleet (``campaign.fleet``) runs each host's loop in a thread of its own, each
with its own ``Interruption``; the main thread catches the signal and hands it to each with ``deliver``, which
counts it the same way and raises the exception in that thread, as the handler would have in the main thread
(CPython's ``PyThreadState_SetAsyncExc``: it lands at the thread's next bytecode, so a call blocked in C, a socket
read, is interrupted when it returns or times out). A shielded section holds a delivered signal just as it holds
a caught one.
"""

from __future__ import annotations

import asyncio
import ctypes
import signal
import sys
import threading
from collections.abc import Callable, Coroutine, Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any, TypeVar

#: The signals a run handles, in the order they are documented.
SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


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
    """Signal handlers for the life of a run; ``count`` and ``first`` say what came."""

    def __init__(self) -> None:
        self.count = 0
        self.first: int | None = None
        #: The signal counted last (what a lost second signal is raised as).
        self.last: int | None = None
        #: How far the exceptions raised so far and those the pipeline caught reach: 1 the first signal's
        #: ``Interrupted``, 2 a ``LeaveNow`` (``lost`` is the difference).
        self._raised = 0
        self._caught = 0
        self._shield = 0
        self._pending: Interrupted | None = None
        self._quiet = False
        self._saved: dict[int, Any] = {}
        #: The thread the run is in while the context is active (what ``deliver`` raises in).
        self._owner: int | None = None
        #: Orders ``deliver`` (another thread) with the shield's count; never taken by the signal handler.
        self._mutex = threading.Lock()

    def __enter__(self) -> Interruption:
        self._owner = threading.get_ident()
        _active.current = self
        if threading.current_thread() is threading.main_thread():
            for sig in SIGNALS:
                self._saved[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        with self._mutex:
            self._owner = None
        _active.current = None
        for sig, old in self._saved.items():
            signal.signal(sig, old)
        self._saved.clear()

    def _count(self, signum: int) -> Interrupted:
        """Count one signal; the exception it means (the first ``Interrupted``, later ones ``LeaveNow``)."""
        self.count += 1
        self.last = signum
        if self.count == 1:
            self.first = signum
            return Interrupted(signum)
        for sig in self._saved:
            signal.signal(sig, signal.SIG_DFL)  # a third signal ends the process at once
        return LeaveNow(signum)

    def _hold(self, exc: Interrupted) -> None:
        self._pending = self._pending or exc
        if isinstance(exc, LeaveNow):
            self._pending = exc

    def _take(self, signum: int) -> Interrupted | None:
        """Count a signal; the exception to raise now, or None (quiet, or held by a shield)."""
        exc = self._count(signum)
        if self._quiet:
            return None
        if self._shield:
            self._hold(exc)
            return None
        return exc

    def _handle(self, signum: int, _frame: FrameType | None) -> None:
        exc = self._take(signum)
        if exc is not None:
            self.raised(exc)
            raise exc

    def deliver(self, signum: int) -> None:
        """Hand a signal the main thread caught to the run in this context's thread (see the module docstring).

        Nothing happens when the context is not active (the run has not started, or has ended).
        """
        with self._mutex:
            if self._owner is None:
                return
            exc = self._take(signum)
            if exc is not None:
                _raise_in(self._owner, exc, self.raised)

    @contextmanager
    def shielded(self) -> Iterator[None]:
        """Hold a signal that arrives inside the block until the block ends (then raise it)."""
        entered = False
        try:
            with self._mutex:
                self._shield += 1
                entered = True
            yield
        finally:
            if entered:
                with self._mutex:
                    self._shield -= 1
        if not self._shield and self._pending is not None and not self._quiet:
            pending, self._pending = self._pending, None
            self.raised(pending)
            raise pending

    def quiet(self) -> None:
        """From now on signals are only counted (the run's last bookkeeping must not be cut)."""
        self._quiet = True

    def raised(self, exc: Interrupted) -> None:
        """``exc`` is being raised in the run's thread (by the handler, a shield's end, or landing from ``deliver``)."""
        self._raised = max(self._raised, _level(exc))

    def caught(self, exc: Interrupted) -> None:
        """The pipeline caught ``exc``: ``checkpoint`` no longer raises it (see the module docstring)."""
        self._caught = max(self._caught, _level(exc))

    def lost(self) -> Interrupted | None:
        """The exception of a signal that was raised but never caught, or None."""
        if self._raised <= self._caught:
            return None
        if self._raised >= 2 and self.last is not None:
            return LeaveNow(self.last)
        return Interrupted(self.first) if self.first is not None else None

    def checkpoint(self) -> None:
        """Raise a signal that was raised but lost on its way (not inside a shield, not once quiet)."""
        if self._quiet or self._shield:
            return
        exc = self.lost()
        if exc is not None:
            raise exc


def _level(exc: Interrupted) -> int:
    return 2 if isinstance(exc, LeaveNow) else 1


class _Active(threading.local):
    current: Interruption | None = None


#: The Interruption active in each thread (a fleet runs one per host thread).
_active = _Active()


def checkpoint() -> None:
    """Raise a lost signal of the run in this thread (``Interruption.checkpoint``); nothing outside a run."""
    intr = _active.current
    if intr is not None:
        intr.checkpoint()


def _unraisable(args: Any) -> None:
    """``sys.unraisablehook``: an ``Interrupted`` a finalizer swallowed is left to ``checkpoint``, not printed."""
    if isinstance(args.exc_value, Interrupted):
        return
    _default_unraisable(args)


_default_unraisable = sys.unraisablehook
sys.unraisablehook = _unraisable

_T = TypeVar("_T")


async def unswallowed(work: Coroutine[Any, Any, _T]) -> _T:
    """Await ``work``; an ``Interrupted`` that asyncio swallowed in a loop callback cancels it and is raised here.

    When a signal's exception lands inside a transport's read (``sock.recv``, ``data_received``) or another loop
    callback, asyncio does not propagate a ``BaseException`` other than ``KeyboardInterrupt`` and ``SystemExit``: it
    logs "Fatal read error on socket transport" (or "Exception in callback"), closes that one connection and carries
    on. The work would then finish as if nothing had happened (the H200 run of 2026-12-03, ``longctx-01f4`` attempt
    4: the wrapper's ``timeout`` fired mid-bench and the run ignored it). Here such an exception reaches the loop's
    exception handler, which cancels the work and raises it from the awaiting call.
    """
    loop = asyncio.get_running_loop()
    task = asyncio.current_task()
    caught: list[BaseException] = []

    def handler(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        exc = context.get("exception")
        if isinstance(exc, BaseException) and not isinstance(exc, Exception | asyncio.CancelledError):
            caught.append(exc)
            if task is not None:
                task.cancel()
            return
        loop.default_exception_handler(context)

    loop.set_exception_handler(handler)
    try:
        result = await work
    except BaseException:
        if caught:
            raise caught[-1] from None  # the last one: a second signal (LeaveNow) outranks the first
        raise
    if caught:
        raise caught[-1]
    return result


def _raise_in(thread_id: int, exc: Interrupted, landed: Callable[[Interrupted], None]) -> None:
    """Raise (a copy of) ``exc`` in another thread at its next bytecode; ``landed`` is called there when it does.

    CPython raises an exception *class* there, made with no arguments: a subclass that knows its signal stands in,
    so ``except Interrupted`` / ``except LeaveNow`` and ``exit_code`` read as for a caught signal.
    """
    base = type(exc)
    signum = exc.signum

    def init(self: Interrupted) -> None:
        base.__init__(self, signum)
        landed(self)

    stand_in = type(base.__name__, (base,), {"__init__": init})
    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread_id), ctypes.py_object(stand_in))
