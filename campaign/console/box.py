"""Rendering of the store and the box: past runs, failures by fingerprint, a host's status, a stop, the doctor."""

from __future__ import annotations

from collections.abc import Sequence

from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from campaign.console.run import status_style
from campaign.records import FailureGroup, Healing, HostStatus, RunRow, StopReport


def render_runs(console: Console, rows: Sequence[RunRow]) -> None:
    """`campaign runs`: a table of past runs, newest first."""
    if not rows:
        console.print("no runs yet: try `campaign run quickstart`")
        return
    t = Table(show_header=True, header_style="bold")
    for col in ("run", "experiment", "host", "started", "status", "attempts", "passed", "failed", "final"):
        t.add_column(col)
    for r in rows:
        t.add_row(
            r.run_id,
            r.experiment,
            r.host,
            r.started_at,
            Text(r.status, style=status_style(r.status)),
            str(r.attempts),
            str(r.passed),
            str(r.failed),
            r.final_variant or "",
        )
    console.print(t)


def render_failures(console: Console, groups: Sequence[FailureGroup]) -> None:
    """`campaign runs --failures`: failures grouped by fingerprint."""
    if not groups:
        console.print("no failures recorded")
        return
    t = Table(show_header=True, header_style="bold")
    for col in ("fingerprint", "kind", "count", "first seen", "last seen", "variants", "runs"):
        t.add_column(col, overflow="fold")
    for g in groups:
        t.add_row(
            g.fingerprint,
            g.kind,
            str(g.count),
            g.first_seen,
            g.last_seen,
            ", ".join(g.variants),
            ", ".join(g.runs[-3:]) + (f" (+{len(g.runs) - 3})" if len(g.runs) > 3 else ""),
        )
    console.print(t)


def render_status(console: Console, status: HostStatus) -> None:
    """`campaign status`: what runs on the host now and its known-good."""
    console.print(f"[bold]{escape(status.host)}[/]")
    cur = status.running
    if cur:
        health = status.health
        alive = "[green]alive[/]" if cur.alive else "[red]dead[/]"
        console.print(
            f"  running: {escape(cur.variant)} (spec {cur.spec_hash}, run {cur.run_id}) {alive}, "
            f"pid {cur.pid} pgid {cur.pgid}, port {cur.port}, up {cur.uptime_s:.0f} s, "
            f"health {health if health is not None else 'no answer'}"
        )
        if cur.other_experiment:
            console.print(
                f"  [yellow]this server belongs to experiment {escape(cur.experiment)}[/], "
                f"not {escape(status.experiment or '?')}"
            )
    else:
        console.print("  running: nothing campaign started")
    for proc in status.untracked:
        console.print(f"  [red]untracked[/]: pid {proc.pid} ({escape(proc.command)}), started by campaign")
    if status.lock is not None:
        stale = " [yellow](stale: its CLI is gone)[/]" if status.lock.stale else ""
        console.print(f"  locked by {escape(status.lock.text)}{stale}")
    for run_id in status.reconciled:
        console.print(f"  run {escape(run_id)}: its CLI died; now recorded as interrupted")
    kg = status.known_good
    if kg:
        console.print(
            f"  known-good: {escape(kg.variant)} (spec {kg.spec_hash}, proven in run {kg.run_id} at {kg.proven_at})"
        )
    else:
        console.print("  known-good: none yet")


def render_stop(console: Console, host: str, report: StopReport) -> None:
    """`campaign stop`: what was stopped on the host, and how long it took."""
    console.print(f"{host}: {report.detail}" + (f" in {report.seconds:.1f} s" if report.stopped else ""))
    if report.foreign:
        console.print(f"  {escape(report.foreign)}")


def render_healing(console: Console, healing: Healing) -> None:
    """`campaign doctor`: what the rebuild of the run index found."""
    aside = f"; the old one kept as {healing.moved_aside}" if healing.moved_aside else ""
    console.print(
        f"index rebuilt from {healing.reports} report(s) and {healing.known_goods} known-good record(s){aside}",
        markup=False,
    )
    for name in healing.unreadable:
        console.print(f"  unreadable, left out: {name}", markup=False)
