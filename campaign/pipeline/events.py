"""What a run tells the live display: ``Event`` values sent to the sink the CLI gives (the console draws them).

``text`` is the line a person reads; what a display decides on is in typed fields, never parsed out of ``text``:
``record`` (the attempt, at ``attempt_end``), ``phase`` (at ``phase``), ``progress`` (at ``bench_progress``),
``bench`` (at ``bench``), ``restore`` (at ``restore_end``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from campaign.records import Attempt, BenchEvent, BenchResult, Restore, Role

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
    #: The attempt as it ended (``attempt_end``): its outcome, failed phase and diagnosis.
    record: Attempt | None = None
    #: The startup phase the server entered (``phase``).
    phase: str | None = None
    #: The bench's progress (``bench_progress``).
    progress: BenchEvent | None = None
    #: The bench's result (``bench``).
    bench: BenchResult | None = None
    #: The restore as it ended (``restore_end``): its outcome and detail.
    restore: Restore | None = None
    #: The host it happened on, in a fleet (``campaign.fleet`` fills it in); None on one host.
    host: str | None = None


EventSink = Callable[[Event], None]
