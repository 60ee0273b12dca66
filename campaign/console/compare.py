"""A comparison on a terminal: the same sections as the Markdown and CSV renderings, as rich tables."""

from __future__ import annotations

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from campaign.compare import Comparison


def _style(cell: str) -> str:
    if cell == "DIFFERS" or cell in ("failed", "restore_failed") or cell.startswith("failed"):
        return f"[red]{escape(cell)}[/]"
    if cell.startswith("not significant") or "untested" in cell:
        return f"[dim]{escape(cell)}[/]"
    return escape(cell)


def render_comparison(console: Console, c: Comparison) -> None:
    """Print every section of ``c`` as a table; the cell texts are exactly those of ``Comparison.sections()``."""
    console.print(f"[bold]comparison[/] of {escape(', '.join(c.runs))}")
    for s in c.sections():
        t = Table(title=s.title, title_justify="left")
        for i, h in enumerate(s.header):
            t.add_column(escape(h), justify="left" if i < 2 else "right", overflow="fold")
        for row in s.rows:
            t.add_row(*(_style(v) for v in row))
        if not s.rows:
            console.print(f"[bold]{escape(s.title)}[/]: (none)")
            continue
        console.print(t)
