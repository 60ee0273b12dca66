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

The exit code of an interrupted run is the shell's 128 + N: 130 for SIGINT, 143 for SIGTERM, 129 for SIGHUP.

Signals reach only the main thread. A fleet (``campaign.fleet``) runs each host's loop in a thread of its own, each
with its own ``Interruption``; the main thread catches the signal and hands it to each with ``deliver``, which
counts it the same way and raises the exception in that thread, as the handler would have in the main thread
(CPython's ``PyThreadState_SetAsyncExc``: it lands at the thread's next bytecode, so a call blocked in C, a socket
read, is interrupted when it returns or times out). A shielded section holds a delivered signal just as it holds
a caught one.
"""

from __future__ import annotations

import ctypes
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any

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
        if threading.current_thread() is threading.main_thread():
            for sig in SIGNALS:
                self._saved[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        with self._mutex:
            self._owner = None
        for sig, old in self._saved.items():
            signal.signal(sig, old)
        self._saved.clear()

    def _count(self, signum: int) -> Interrupted:
        """Count one signal; the exception it means (the first ``Interrupted``, later ones ``LeaveNow``)."""
        self.count += 1
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
                _raise_in(self._owner, exc)

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
            raise pending

    def quiet(self) -> None:
        """From now on signals are only counted (the run's last bookkeeping must not be cut)."""
        self._quiet = True


def _raise_in(thread_id: int, exc: Interrupted) -> None:
    """Raise (a copy of) ``exc`` in another thread at its next bytecode.

    CPython raises an exception *class* there, made with no arguments: a subclass that knows its signal stands in,
    so ``except Interrupted`` / ``except LeaveNow`` and ``exit_code`` read as for a caught signal.
    """
    base = type(exc)
    signum = exc.signum

    def init(self: Interrupted) -> None:
        base.__init__(self, signum)

    stand_in = type(base.__name__, (base,), {"__init__": init})
    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread_id), ctypes.py_object(stand_in))
