"""A comparison on a terminal: the same sections as the Markdown rendering, as rich tables.

A significant change is green when it is for the better and red when it is for the worse, by the metric's
direction (higher throughput, lower latency); a cell that is not significant or untested is dim.
"""

from __future__ import annotations

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from campaign.comparison import Comparison


def _style(cell: str) -> str:
    if cell == "DIFFERS" or cell in ("failed", "restore_failed") or cell.startswith("failed"):
        return f"[red]{escape(cell)}[/]"
    if cell.startswith("better "):
        return f"[bold green]{escape(cell)}[/]"
    if cell.startswith("worse "):
        return f"[bold red]{escape(cell)}[/]"
    if cell.startswith(("not significant", "negligible", "untested", "equal")):
        return f"[dim]{escape(cell)}[/]"
    return escape(cell)


def render_comparison(console: Console, c: Comparison) -> None:
    """Print every section of ``c`` as a table; the cell texts are exactly those of ``Comparison.sections()``."""
    console.print(f"[bold]comparison[/] of {escape(', '.join(c.runs))}")
    for s in c.sections():
        if not s.rows:
            console.print(f"[bold]{escape(s.title)}[/]: (none)")
            continue
        t = Table(title=s.title, title_justify="left")
        for i, h in enumerate(s.header):
            t.add_column(escape(h), justify="left" if i < 2 else "right", overflow="fold")
        for row in s.rows:
            t.add_row(*(_style(v) for v in row))
        console.print(t)
