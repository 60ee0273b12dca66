"""The terminal side of ``campaign tune``: a line per trial (k of N, best so far, ETA) and the final report."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from campaign.records import show_value
from campaign.records.tune import TuneReport
from campaign.tune.search import Progress
from campaign.tune.space import describe


class TuneDisplay:
    """Prints one line per finished trial to ``console`` (stderr)."""

    def __init__(self, console: Console) -> None:
        self.console = console

    def __call__(self, p: Progress) -> None:
        """One trial's line."""
        t = p.trial
        value = f"{t.objective:.4g}" if t.objective is not None else "-"
        what = t.outcome if t.outcome == "passed" else f"{t.outcome} ({t.kind or t.reason or ''})"
        best = f"{p.best.objective:.4g} (trial {p.best.number})" if p.best and p.best.objective is not None else "-"
        eta = f"{p.eta_s / 60:.1f} min" if p.eta_s is not None else "?"
        self.console.print(
            f"[bold]trial {p.done} of {p.planned}[/] [{t.stage}] {describe(t.config)}: {value} {what}; "
            f"best {best}; ETA {eta}"
        )
        if p.note:
            self.console.print(f"  {p.note}")


def render_tune(console: Console, report: TuneReport) -> None:
    """The trajectory, the constraints learnt, each knob's effect, and the verdict."""
    table = Table(title=f"tune {report.tune_id} ({report.strategy}, {report.objective})")
    for col in ("trial", "stage", "configuration", "objective", "outcome", "diagnosis", "run"):
        table.add_column(col)
    for t in report.trials:
        table.add_row(
            str(t.number),
            t.stage,
            describe(t.config),
            f"{t.objective:.4g}" if t.objective is not None else "-",
            t.outcome,
            t.diagnosis or t.reason or "",
            t.run_id or "",
        )
    console.print(table)
    for c in report.constraints:
        knobs = " and ".join(f"{k}={show_value(v)}" for k, v in c.knobs.items())
        console.print(f"learnt: never {knobs} ({c.kind}; trials {c.trials})")
    effects = Table(title="each knob's measured effect (mean objective of the passed trials holding it)")
    for col in ("knob", "value", "trials", "failed", "mean", "vs baseline"):
        effects.add_column(col)
    for e in report.effects:
        if e.trials:
            effects.add_row(
                e.knob,
                show_value(e.value),
                str(e.trials),
                str(e.failed),
                f"{e.mean_objective:.4g}" if e.mean_objective is not None else "-",
                f"{e.ratio_to_baseline:.3f}x" if e.ratio_to_baseline is not None else "-",
            )
    console.print(effects)
    console.print(f"search ended: {report.stopped_because}")
    if report.final is not None:
        f = report.final
        for name, cell in f.cells.items():
            console.print(f"  {name}: {cell}")
        console.print(f"[bold]{f.detail}[/]")
        console.print(
            f"final run {f.run_id or '-'}; box {'proven' if f.box_proven else 'NOT proven'} by run {f.restore_run_id}"
        )
    if report.plot_file:
        console.print(f"figure: {report.plot_file} in the tune's folder")
