"""Everything campaign shows a person: the only package that imports rich.

``Output`` holds two rich consoles: ``out`` (stdout: tables, reports, JSON) and ``err`` (stderr: progress, prose and
errors), so ``--json`` keeps stdout pure JSON. Submodules render one area each (run, box, diagnosis, bench, compare,
profile).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field

from rich.console import Console


@dataclass
class Output:
    """The two streams a command writes to; ``json`` means stdout carries only JSON."""

    json: bool = False
    # Off a terminal rich would assume 80 columns and squeeze tables; logs and pipes get a generous width instead.
    out: Console = field(
        default_factory=lambda: Console(highlight=False, soft_wrap=True, width=None if sys.stdout.isatty() else 160)
    )
    err: Console = field(
        default_factory=lambda: Console(stderr=True, highlight=False, width=None if sys.stderr.isatty() else 160)
    )

    @property
    def interactive(self) -> bool:
        """True when stderr is a terminal (live displays); plain lines otherwise."""
        return self.err.is_terminal and sys.stderr.isatty()

    def print_json(self, text: str) -> None:
        """Write one JSON document to stdout, untouched by rich markup."""
        self.write_text(text if text.endswith("\n") else text + "\n")

    def write_text(self, text: str) -> None:
        """Write text to stdout as it is (Markdown, CSV, log lines): no markup, no wrapping."""
        sys.stdout.write(text)
        sys.stdout.flush()

    def write_line(self, line: str) -> None:
        """Write one line of text to stdout as it is."""
        self.write_text(line + "\n")

    def write_bytes(self, data: bytes) -> None:
        """Write bytes to stdout untouched (a stored log, whatever its encoding)."""
        sys.stdout.buffer.write(data)
        sys.stdout.buffer.flush()
