"""A profile on a terminal: where one bench level's time went, class by class, with the largest kernels of each."""

from __future__ import annotations

from rich.console import Console
from rich.markup import escape
from rich.padding import Padding
from rich.table import Table

from campaign.config import Recipe
from campaign.records import Attempt, BenchSettings, ProfileSettings

#: Kernel names are long (templated CUDA kernels); a cell shows this many characters of each.
NAME_WIDTH = 60


def render_profile(console: Console, a: Attempt) -> None:
    """`campaign show`: the profile of attempt ``a``, if it has one (a line when there is no breakdown)."""
    p = a.profile
    if p is None:
        return
    if p.status != "measured":
        style = "yellow" if p.status == "unavailable" else "red"
        console.print(f"  #{a.index} profile: [{style}]{p.status}[/]" + (f" — {escape(p.note)}" if p.note else ""))
        return
    what = "GPU kernel time" if p.device == "gpu" else "CPU op self time (no GPU in the trace)"
    where = "decode steps" if p.scope == "decode" else "prefill and decode together"
    window = f", {p.window_s:.2f} s profiled" if p.window_s is not None else ""
    console.print(f"  #{a.index} profile at {escape(p.level or '-')}: {what}, {where}{window}")
    t = Table(show_header=True, header_style="bold", box=None, padding=(0, 1))
    for col, justify in (("class", "left"), ("time ms", "right"), ("share", "right"), ("largest", "left")):
        t.add_column(col, justify=justify)  # type: ignore[arg-type]
    for c in p.classes:
        top = ", ".join(f"{k.name[:NAME_WIDTH]} {k.time_ms:.2f} ms" for k in c.top[:3])
        t.add_row(c.name, f"{c.time_ms:.2f}", f"{100 * c.share:.1f}%", escape(top))
    t.add_row("total", f"{p.total_ms:.2f}", "100.0%", f"{p.events} events")
    console.print(Padding(t, (0, 0, 0, 4)))
    if p.note:
        console.print(f"    [dim]{escape(p.note)}[/]")
    for f in p.trace_files:
        console.print(f"    [dim]trace: {escape(f)}[/]")


def profile_plan(settings: ProfileSettings, bench: BenchSettings, recipe: Recipe) -> str:
    """A dry run's line: which level is profiled, with how many requests, through which endpoints."""
    if recipe.profile is None:
        return f"not available: recipe {recipe.name} declares no profiler endpoints (the step records why)"
    load = settings.load_of(bench)
    requests = settings.requests or bench.requests
    return (
        f"{load.label} again with {requests} requests between {recipe.profile.start.path} and "
        f"{recipe.profile.stop.path}; traces copied into the run folder"
    )
