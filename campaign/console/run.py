"""Rendering of runs: the live display of a campaign, the plan of a dry run, reports, run lists and status."""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from rich.console import Console, Group
from rich.live import Live
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from campaign.campaign import Event, EventSink
from campaign.config import PlannedVariant, masked_env, shell_line
from campaign.records import Attempt, RunReport
from campaign.store import FailureGroup, KnownGood, RunRow

_OUTCOME_STYLE = {"passed": "green", "failed": "red", "skipped": "yellow"}
_RESTORE_STYLE = {"restored": "green", "failed": "bold red", "not_needed": "dim"}


@dataclass
class _Row:
    variant: str
    role: str
    phase: str = "stopping"
    started: float = field(default_factory=time.monotonic)
    ended: float | None = None
    outcome: str | None = None
    last: str = ""
    detail: str = ""


class RunDisplay:
    """Consumes campaign Events; draws a live table on a terminal and plain lines elsewhere."""

    def __init__(self, console: Console, live: bool) -> None:
        self.console = console
        self.live = live
        self.rows: dict[int, _Row] = {}
        self._live: Live | None = None
        self._bench: Any = None

    def __call__(self, ev: Event) -> None:
        """Take one event."""
        if ev.kind == "bench_progress":
            if self._bench is not None:
                self._bench(ev.payload)
            return
        row = self.rows.get(ev.attempt) if ev.attempt is not None else None
        if ev.kind == "attempt_start" and ev.attempt is not None:
            row = self.rows[ev.attempt] = _Row(ev.variant or "?", ev.role or "variant")
            self._say(f"[bold]#{ev.attempt} {escape(row.variant)}[/] ({row.role}): stopping what runs, launching")
        elif row is not None and ev.kind == "phase":
            row.phase = ev.text
            self._say(f"  #{ev.attempt} phase {ev.text} at {time.monotonic() - row.started:.1f} s", dim=True)
        elif row is not None and ev.kind == "line":
            if ev.text.strip():
                row.last = ev.text.strip()[:160]
        elif row is not None and ev.kind in {"launched", "stopped", "ready", "smoke"}:
            if ev.kind in {"ready", "smoke"}:
                row.phase = ev.kind
            self._say(f"  #{ev.attempt} {escape(ev.text)}", dim=ev.kind in {"launched", "stopped"})
        elif row is not None and ev.kind == "attempt_end":
            row.ended = time.monotonic()
            row.outcome = ev.text
            rec = ev.record
            detail = ""
            if rec is not None and rec.outcome == "failed":
                kind = rec.diagnosis.kind if rec.diagnosis else "?"
                detail = f"failed in {rec.failed_phase}: {kind}"
                if rec.diagnosis and rec.diagnosis.hint:
                    detail += f" — {rec.diagnosis.hint}"
            row.detail = detail
            style = _OUTCOME_STYLE.get(ev.text, "")
            self._say(f"  #{ev.attempt} [{style}]{ev.text}[/] {escape(detail)}")
            if rec is not None and rec.diagnosis and rec.outcome == "failed":
                for e in rec.diagnosis.evidence[:3]:
                    self._say(f"      line {e.line}: {escape(e.text[:150])}", dim=True)
        elif ev.kind in {"restore_start", "restore_end", "isolation", "note", "run_start"}:
            style = "bold red" if ev.kind == "restore_end" and "failed" in ev.text.split(":")[0] else "cyan"
            self._say(f"[{style}]{escape(ev.text)}[/]")
        self._refresh()

    def _say(self, markup: str, dim: bool = False) -> None:
        if self._live is not None:
            self._live.console.print(markup, style="dim" if dim else None, highlight=False)
        else:
            self.console.print(markup, style="dim" if dim else None, highlight=False)

    def _table(self) -> Table:
        t = Table(box=None, pad_edge=False, show_header=True, header_style="bold")
        for col in ("#", "variant", "role", "phase", "elapsed", "last log line"):
            t.add_column(col, overflow="fold" if col == "last log line" else "ellipsis")
        for i, r in self.rows.items():
            end = r.ended or time.monotonic()
            phase = Text(r.outcome or r.phase, style=_OUTCOME_STYLE.get(r.outcome or "", "yellow"))
            t.add_row(str(i), r.variant, r.role, phase, f"{end - r.started:5.1f}s", Text(r.last[:100], style="dim"))
        return t

    def _refresh(self) -> None:
        if self._live is not None:
            self._live.update(Group(self._table()))

    @contextmanager
    def session(self) -> Iterator[EventSink]:
        """Run the display for the duration of a campaign."""
        if self.live:
            with Live(self._table(), console=self.console, refresh_per_second=8, transient=False) as live:
                self._live = live
                try:
                    yield self
                finally:
                    self._refresh()
                    self._live = None
        else:
            yield self


def render_plan(
    console: Console,
    *,
    experiment: str,
    host: str,
    recipe: str,
    planned: Sequence[PlannedVariant],
    known_good: KnownGood | None,
    isolate: bool,
    matrix: dict[str, Any] | None,
    ready_s: float,
    at_end: str,
) -> None:
    """What `campaign run --dry-run` shows: every variant's exact launch, and the failure policy."""
    console.print(f"[bold]Plan for {escape(experiment)}[/] on [cyan]{escape(host)}[/] with recipe {escape(recipe)}")
    if matrix:
        axes = ", ".join(f"{k} ∈ {v}" for k, v in matrix.get("axes", {}).items())
        console.print(f"matrix: {escape(axes)}" + (f"; zipped {matrix['zip']}" if matrix.get("zip") else ""))
    for i, pv in enumerate(planned):
        console.print(f"\n[bold]{i}. {escape(pv.name)}[/]  knobs: {escape(str(pv.knobs))}")
        console.print(f"   command: {escape(shell_line(pv.spec.model_copy(update={'env': {}})))}", soft_wrap=True)
        env = masked_env(pv.spec.env)
        console.print(f"   env: {escape(str(env)) if env else '(none)'}")
        console.print(
            f"   ready when: the group is alive, /{escape(pv.spec.ready_marker)}/ is in the log and "
            f"{escape(pv.spec.health_path)} answers 200 on port {pv.spec.port} (deadline {ready_s:g} s)"
        )
    console.print(
        "\n[bold]On failure[/]: diagnose the log, stop the server, relaunch the known-good and prove it again"
    )
    if known_good is not None:
        console.print(
            f"   known-good now: {escape(known_good.variant)} (spec {known_good.spec_hash}, run {known_good.run_id})"
        )
    else:
        console.print("   known-good now: none on this host yet; the first variant that passes becomes it")
    console.print(
        "   isolation: "
        + (
            "on: a failed variant is retried with each knob set back to the baseline value, one at a time"
            if isolate
            else "off (use --isolate to localise a failure to a knob)"
        )
    )
    console.print(f"   at the end: {at_end}")
    console.print("\n[dim]dry run: nothing was touched[/]")


def render_report(console: Console, report: RunReport) -> None:
    """`campaign show`: one run's attempts, diagnoses, restores, attribution and final state."""
    console.print(
        f"[bold]{escape(report.run_id)}[/]  {escape(report.experiment)} on {escape(report.host)} "
        f"({escape(report.recipe)})  status: [{_status_style(report.status)}]{report.status}[/]"
    )
    console.print(f"started {report.started_at}, ended {report.ended_at or '-'}")
    t = Table(show_header=True, header_style="bold")
    for col in ("#", "variant", "role", "outcome", "failed in", "ready s", "lag s", "smoke", "diagnosis", "restore"):
        t.add_column(col)
    for a in report.attempts:
        t.add_row(*_attempt_cells(a))
    console.print(t)
    for a in report.attempts:
        if a.outcome == "failed" and a.diagnosis is not None:
            d = a.diagnosis
            console.print(
                f"\n[bold]#{a.index} {escape(a.variant)}[/]: [red]{d.kind}[/] (confidence {d.confidence:.2f})"
            )
            if d.summary:
                console.print(f"  {escape(d.summary)}")
            for e in d.evidence[:6]:
                console.print(f"  [dim]line {e.line}:[/] {escape(e.text[:200])}")
            if d.hint:
                console.print(f"  [cyan]next:[/] {escape(d.hint)}")
        if a.bench:
            lv = a.bench.get("levels") or []
            parts = []
            for level in lv:
                load = level.get("load") or {}
                tag = f"c={load.get('concurrency')}" if load.get("concurrency") else f"rate={load.get('request_rate')}"
                parts.append(f"{tag}: {level.get('output_throughput', 0):.1f} tok/s")
            if parts:
                console.print(f"  #{a.index} bench: " + "; ".join(parts))
    if report.attribution:
        console.print("\n[bold]Attribution[/]")
        for f in report.attribution:
            console.print(f"  {escape(str(f.get('statement') or f))}")
    fin = report.final
    if fin.variant is None and fin.healthy:
        console.print(f"\nfinal: nothing left running — {escape(fin.detail or 'stopped')}, the box verified clean")
        return
    state = "[green]healthy[/]" if fin.healthy else "[red]not healthy[/]"
    console.print(f"\nfinal: {escape(fin.variant or '-')} {state}" + (f" — {escape(fin.detail)}" if fin.detail else ""))


def _status_style(status: str) -> str:
    return {"passed": "green", "failed": "yellow", "restore_failed": "bold red", "aborted": "red"}.get(status, "")


def _attempt_cells(a: Attempt) -> list[str | Text]:
    kind = a.diagnosis.kind if a.diagnosis and a.outcome == "failed" else ""
    restore = a.restore.outcome if a.restore else ""
    return [
        str(a.index),
        a.variant,
        a.role,
        Text(a.outcome, style=_OUTCOME_STYLE.get(a.outcome, "")),
        a.failed_phase or "",
        f"{a.timings.launch_to_ready_s:.2f}" if a.timings.launch_to_ready_s is not None else "",
        f"{a.timings.ready_detect_lag_s:.3f}" if a.timings.ready_detect_lag_s is not None else "",
        f"{a.smoke.passed}/{a.smoke.total}" if a.smoke else "",
        kind,
        Text(restore, style=_RESTORE_STYLE.get(restore, "")),
    ]


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
            Text(r.status, style=_status_style(r.status)),
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


def render_status(console: Console, status: dict[str, Any]) -> None:
    """`campaign status`: what runs on the host now and its known-good."""
    console.print(f"[bold]{escape(str(status['host']))}[/]")
    cur = status.get("running")
    if cur:
        health = status.get("health")
        alive = "[green]alive[/]" if cur.get("alive") else "[red]dead[/]"
        console.print(
            f"  running: {escape(str(cur['variant']))} (spec {cur['spec_hash']}, run {cur['run_id']}) {alive}, "
            f"pid {cur['pid']} pgid {cur['pgid']}, port {cur['port']}, up {cur.get('uptime_s', 0):.0f} s, "
            f"health {health if health is not None else 'no answer'}"
        )
    else:
        console.print("  running: nothing campaign started")
    kg = status.get("known_good")
    if kg:
        console.print(
            f"  known-good: {escape(str(kg['variant']))} (spec {kg['spec_hash']}, proven in run {kg['run_id']} "
            f"at {kg['proven_at']})"
        )
    else:
        console.print("  known-good: none yet")


def render_error(console: Console, message: str, hint: str | None) -> None:
    """An error as the CLI shows it: one red line, then what to do."""
    console.print(f"[bold red]error:[/] {escape(message)}", highlight=False)
    if hint:
        console.print(f"[cyan]hint:[/] {escape(hint)}", highlight=False)
