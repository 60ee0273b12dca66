"""What a run tells the live display: ``Event`` values sent to the sink the CLI gives (the console draws them)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from campaign.records import Attempt, Role

EventKind = Literal[
    "run_start",
    "attempt_start",
    "stopped",
    "launched",
    "phase",
    "line",
    "ready",
    "smoke",
    "bench",
    "bench_progress",
    "attempt_end",
    "restore_start",
    "restore_end",
    "isolation",
    "note",
    "run_end",
]


@dataclass(frozen=True)
class Event:
    """One thing that happened during a run, for the live display. ``text`` is already free of secrets."""

    kind: EventKind
    attempt: int | None = None
    variant: str | None = None
    role: Role | None = None
    text: str = ""
    record: Attempt | None = None
    payload: Any = None
    #: The host it happened on, in a fleet (``campaign.fleet`` fills it in); None on one host.
    host: str | None = None


EventSink = Callable[[Event], None]
