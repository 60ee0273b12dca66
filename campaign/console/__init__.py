"""Everything campaign shows a person: the only package that imports rich.

``Output`` holds two rich consoles: ``out`` (stdout: tables, reports, JSON) and ``err`` (stderr: progress, prose and
errors), so ``--json`` keeps stdout pure JSON. Submodules render one area each (run, box, diagnosis, bench, compare,
profile). Both consoles are ``SafeConsole``s and the raw writers neutralise too: text from outside (a server's log,
a lock record another user wrote) never reaches the terminal as control sequences (``console.terminal``).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field

from rich.console import Console

from campaign.console.terminal import SafeConsole, json_safe, neutralise, neutralise_bytes


@dataclass
class Output:
    """The two streams a command writes to; ``json`` means stdout carries only JSON."""

    json: bool = False
    # Off a terminal rich would assume 80 columns and squeeze tables; logs and pipes get a generous width instead.
    out: Console = field(
        default_factory=lambda: SafeConsole(highlight=False, soft_wrap=True, width=None if sys.stdout.isatty() else 160)
    )
    err: Console = field(
        default_factory=lambda: SafeConsole(stderr=True, highlight=False, width=None if sys.stderr.isatty() else 160)
    )

    @property
    def interactive(self) -> bool:
        """True when stderr is a terminal (live displays); plain lines otherwise."""
        return self.err.is_terminal and sys.stderr.isatty()

    def print_json(self, text: str) -> None:
        """Write one JSON document to stdout, untouched by rich markup; a control character json leaves raw (DEL,
        C1, bidirectional) is written as its JSON escape, so the document means the same and shows safely."""
        sys.stdout.write(json_safe(text if text.endswith("\n") else text + "\n"))
        sys.stdout.flush()

    def write_text(self, text: str) -> None:
        """Write text to stdout (Markdown, CSV, log lines): no markup, no wrapping, control characters made visible
        (``console.terminal``; JSON has none to change)."""
        sys.stdout.write(neutralise(text))
        sys.stdout.flush()

    def write_line(self, line: str) -> None:
        """Write one line of text to stdout as it is."""
        self.write_text(line + "\n")

    def write_bytes(self, data: bytes) -> None:
        """Write bytes to stdout (a stored log, whatever its encoding), control characters made visible."""
        sys.stdout.buffer.write(neutralise_bytes(data))
        sys.stdout.buffer.flush()
