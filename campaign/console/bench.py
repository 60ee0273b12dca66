"""Bench on a terminal: a live progress bar per level while it runs, and result tables when it ends."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn
from rich.table import Table

from campaign.records import BenchEvent, BenchResult, LatencyStats, unit_of


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


@contextmanager
def bench_progress(console: Console) -> Iterator[Callable[[BenchEvent], None]]:
    """Yield a ``progress`` callback for ``run_bench`` that draws one bar per level (plain lines off a terminal)."""
    live = console.is_terminal
    progress = Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[status]}"),
        TimeElapsedColumn(),
        console=console,
        disable=not live,
    )
    tasks: dict[str, TaskID] = {}

    def on_event(ev: BenchEvent) -> None:
        if ev.kind == "level_start":
            tasks[ev.level] = progress.add_task(
                f"level {ev.index + 1}/{ev.levels} {ev.level}", total=ev.total, status=""
            )
            if not live:
                console.print(f"bench level {ev.index + 1}/{ev.levels} {escape(ev.level)}: {ev.total} requests")
            return
        task = tasks.get(ev.level)
        if task is None:
            return
        if ev.kind == "warmup":
            progress.update(task, status="warm-up")
        elif ev.kind in ("repeat", "request"):
            status = f"[red]{ev.failed} failed[/]" if ev.failed else ""
            progress.update(task, completed=ev.done, status=status)
        elif ev.kind == "level_end" and ev.result is not None:
            r = ev.result
            verdict = "[green]passed[/]" if r.passed else f"[red]failed: error rate {100 * r.error_rate:.1f}%[/]"
            progress.update(task, completed=ev.total, status=verdict)
            if not live:
                console.print(
                    f"  {escape(ev.level)}: {r.successful}/{r.sent} ok, {r.output_throughput:.1f} tok/s, "
                    f"TTFT median {_ms(r.ttft.median)} ms; {'passed' if r.passed else 'FAILED'}"
                )

    with progress:
        yield on_event


def _stats_row(name: str, s: LatencyStats) -> list[str]:
    return [name, _ms(s.mean), _ms(s.median), _ms(s.p90), _ms(s.p99), str(s.count)]


def render_bench(console: Console, result: BenchResult) -> None:
    """Print a bench result: a summary table over levels, latency tables per level, and errors by type."""
    verdict = "[green]passed[/]" if result.passed else "[red]FAILED[/]"
    console.print(
        f"bench of [bold]{escape(result.model)}[/] at {escape(result.base_url)}: {verdict} "
        f"({len(result.levels)} levels, {result.duration_s:.1f} s, max error rate "
        f"{100 * result.settings.max_error_rate:g}%)"
    )
    summary = Table(title="levels", title_justify="left")
    for col, justify in (
        ("level", "left"),
        ("ok", "right"),
        ("failed", "right"),
        ("incomplete", "right"),
        ("error rate", "right"),
        (unit_of("request_throughput"), "right"),
        (f"in {unit_of('input_throughput')}", "right"),
        (f"out {unit_of('output_throughput')}", "right"),
        (f"total {unit_of('total_throughput')}", "right"),
        ("TTFT p50", "right"),
        ("ITL p50", "right"),
        ("TPOT p50", "right"),
        ("E2E p90", "right"),
        ("", "left"),
    ):
        summary.add_column(col, justify=justify)  # type: ignore[arg-type]
    for lv in result.levels:
        summary.add_row(
            lv.label,
            str(lv.successful),
            f"[red]{lv.failed}[/]" if lv.failed else "0",
            f"[yellow]{lv.incomplete}[/]" if lv.incomplete else "0",
            f"{100 * lv.error_rate:.2f}%",
            f"{lv.request_throughput:.2f}",
            f"{lv.input_throughput:.1f}",
            f"{lv.output_throughput:.1f}",
            f"{lv.total_throughput:.1f}",
            _ms(lv.ttft.median),
            _ms(lv.itl.median),
            _ms(lv.tpot.median),
            _ms(lv.e2e.p90),
            "[green]ok[/]" if lv.passed else "[red]FAILED[/]",
        )
    console.print(summary)
    if result.input_lengths == "tokenize":
        console.print(f"input lengths: fitted to {result.settings.input_len} tokens with the server's /tokenize")
    elif result.settings.prompts == "random":
        console.print(
            "[yellow]input lengths approximate[/]: the server has no tokenize endpoint; in tok/s counts what its "
            "usage.prompt_tokens reported"
        )
    if result.sla is not None:
        render_sla(console, result)
    for lv in result.levels:
        t = Table(title=f"{lv.label} latency (ms)", title_justify="left")
        for col in ("metric", "mean", "median", "p90", "p99", "samples"):
            t.add_column(col, justify="left" if col == "metric" else "right")
        for name, stats in (("TTFT", lv.ttft), ("ITL", lv.itl), ("TPOT", lv.tpot), ("E2E", lv.e2e)):
            t.add_row(*_stats_row(name, stats))
        console.print(t)
        if lv.errors:
            e = Table(title=f"{lv.label} errors", title_justify="left")
            e.add_column("type")
            e.add_column("count", justify="right")
            e.add_column("example", overflow="fold")
            for kind, count in lv.errors.items():
                e.add_row(escape(kind), str(count), escape(lv.error_examples.get(kind, "")))
            console.print(e)


def _slo_text(slo: dict[str, float]) -> str:
    return ", ".join(f"{k} <= {v:g}" + ("" if k == "error_rate" else " ms") for k, v in slo.items())


def render_sla(console: Console, result: BenchResult) -> None:
    """The SLA search: each trial with its verdict, then the answer and its goodput."""
    sla = result.sla
    assert sla is not None
    what = "concurrency" if sla.over == "concurrency" else "request rate"
    t = Table(title=f"SLA search over {what}", title_justify="left")
    for col in ("trial", "level", "met", "why not"):
        t.add_column(col, justify="right" if col == "trial" else "left")
    for i, trial in enumerate(sla.trials, 1):
        verdict = "[green]yes[/]" if trial.met else "[red]no[/]"
        t.add_row(str(i), escape(trial.label), verdict, escape("; ".join(trial.violations)))
    console.print(t)
    bounds = _slo_text(sla.slo)
    if sla.max is None:
        console.print(f"[red]no load met the SLOs[/] ({escape(bounds)}, error rate <= {100 * sla.max_error_rate:g}%)")
        return
    unit = "" if sla.over == "concurrency" else " req/s"
    above = f"; missed at {sla.missed:g}{unit}" if sla.missed is not None else "; the top of the range met them"
    console.print(
        f"highest {what} within the SLOs: [bold]{sla.max:g}{unit}[/]{above}; goodput {sla.goodput or 0:.1f} "
        f"tok/s, {sla.request_goodput or 0:.2f} req/s"
        + ("" if sla.converged else " [yellow](trial budget spent before the bracket closed)[/]")
    )


def sla_line(result: BenchResult) -> str | None:
    """One line for a report: what an SLA search found (None when the bench ran no search)."""
    sla = result.sla
    if sla is None:
        return None
    bounds = _slo_text(sla.slo)
    if sla.max is None:
        return f"SLA search: no load met {bounds} ({len(sla.trials)} trial(s))"
    where = f"c={sla.max:g}" if sla.over == "concurrency" else f"rate={sla.max:g}/s"
    return (
        f"SLA search: highest {where} within {bounds}; goodput {sla.goodput or 0:.1f} tok/s, "
        f"{sla.request_goodput or 0:.2f} req/s ({len(sla.trials)} trials)"
    )
