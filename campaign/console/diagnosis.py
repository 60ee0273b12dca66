"""Rendering of a Diagnosis and of attribution findings for a terminal."""

from __future__ import annotations

from collections.abc import Sequence

from rich.console import Console, Group
from rich.markup import escape
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from campaign.records import Diagnosis, Finding, show_value

_HEALTHY_STYLE = "green"
_FAILED_STYLE = "red"
_UNSETTLED_STYLE = "yellow"


def render_diagnosis(console: Console, diagnosis: Diagnosis) -> None:
    """Print one diagnosis: kind and confidence, the summary, the evidence lines with numbers, and the hint."""
    healthy = diagnosis.kind == "healthy"
    # Inconclusive is neither: the log proves no failure and no healthy start.
    style = _HEALTHY_STYLE if healthy else (_UNSETTLED_STYLE if diagnosis.kind == "inconclusive" else _FAILED_STYLE)
    parts: list[Text | Table] = [Text(diagnosis.summary or diagnosis.kind)]
    if diagnosis.evidence:
        table = Table(show_header=False, box=None, pad_edge=False, padding=(0, 1))
        table.add_column("line", justify="right", style="dim", no_wrap=True)
        table.add_column("text", overflow="fold")
        for ev in diagnosis.evidence:
            table.add_row(str(ev.line), Text(ev.text))
        parts.append(Text("evidence", style="bold"))
        parts.append(table)
    if diagnosis.hint:
        parts.append(Text.assemble(("next step: ", "bold"), diagnosis.hint))
    if diagnosis.fingerprint and diagnosis.kind not in ("healthy", "inconclusive"):
        parts.append(Text(f"fingerprint {diagnosis.fingerprint}", style="dim"))
    title = f"[{style}]{escape(diagnosis.kind)}[/] [dim](confidence {diagnosis.confidence:.2f})[/]"
    # Wrapped inside the panel even on a console that soft-wraps (long log lines would be cropped otherwise).
    console.print(Panel(Group(*parts), title=title, title_align="left", border_style=style), soft_wrap=False)


def render_findings(console: Console, findings: Sequence[Finding]) -> None:
    """Print what attribution concluded for each failure kind, with the attempts and the runs still needed."""
    if not findings:
        console.print("attribution: no failures to explain")
        return
    table = Table(title="attribution", title_justify="left", show_lines=True)
    table.add_column("failure")
    table.add_column("status", no_wrap=True)
    table.add_column("conclusion", overflow="fold")
    table.add_column("attempts", overflow="fold")
    for f in findings:
        explained = f.status == "explained"
        status = Text(f.status.replace("_", " "), style=_HEALTHY_STYLE if explained else _UNSETTLED_STYLE)
        conclusion = Text(f.statement)
        if f.settle_with:
            runs = "; ".join(", ".join(f"{k}={show_value(v)}" for k, v in run.items()) for run in f.settle_with)
            conclusion.append(f"\nto settle, run: {runs}", style="dim")
        attempts = f"failed {_indexes(f.failed)}" + (f"\npassed {_indexes(f.passed)}" if f.passed else "")
        table.add_row(Text(f.kind, style=_FAILED_STYLE), status, conclusion, attempts)
    console.print(table, soft_wrap=False)


def _indexes(ix: Sequence[int]) -> str:
    return ", ".join(f"#{i}" for i in ix) or "-"
