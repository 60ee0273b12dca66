"""The decisive error of a log: the last exception a process raised before something ended it.

A log that ends in a termination line (the shell's ``Killed``, an exit status, a supervisor's "exited with code")
says how the process ended, not why. When a Python exception precedes it, that exception is the decisive error and
the termination its messenger: a worker that raised ``ValueError`` and was then reaped is not a host out of memory.
A messenger's own exception line (a supervisor's ``ChildFailedError``, "see the root cause above", a worker "killed
by signal") is skipped: it reports another process's end.
"""

from __future__ import annotations

import re

from campaign.diagnosis.case import Case, matches
from campaign.logscan import Line

#: An exception line as Python prints it at the end of a traceback (``pkg.mod.SomeError: message``): a class name,
#: not a bare "Error:" (a Go or shell client's message).
EXCEPTION_LINE = re.compile(r"^(\w+\.)*[A-Z]\w*(Error|Exception)\b(:|$)")
#: Exception lines that report another process's end rather than a failure of their own.
_MESSENGER = re.compile(
    r"\b(killed|SIGKILL|SIGTERM|signal \d+|exit ?code|exitcode|exited|root cause|died|terminated|ChildFailedError|"
    r"EngineDeadError|child process|core engine|Engine core initialization failed)\b",
    re.IGNORECASE,
)


def last_exception(ctx: Case, before: int | None = None) -> Line | None:
    """The last exception line (at ERROR level or unlevelled) before line ``before``, messengers skipped."""
    found = None
    for ln in ctx.lines:
        if before is not None and ln.number >= before:
            break
        if ln.quiet or not EXCEPTION_LINE.match(ln.message):
            continue
        if _MESSENGER.search(ln.message) or matches(ctx.sigs.engine_wrappers, ln) or matches(ctx.sigs.killed, ln):
            continue
        found = ln
    return found
