"""Rendering of runs: the live display of a campaign, the plan of a dry run, reports, errors.

What the store and the box show (run lists, failures, a host's status, a stop, the doctor) is in ``console.box``.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from rich.console import Console, Group
from rich.live import Live
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from campaign.config import shell_line
from campaign.console.bench import bench_progress, sla_line
from campaign.console.profile import profile_plan, render_profile
from campaign.operations import Plan, host_label
from campaign.pipeline import Event, EventSink
from campaign.records import Attempt, BenchEvent, RunReport
from campaign.redaction import mask_args, mask_env

_OUTCOME_STYLE = {"passed": "green", "failed": "red", "skipped": "yellow"}
_RESTORE_STYLE = {"restored": "green", "failed": "bold red", "not_needed": "dim"}


@dataclass
class _Row:
    variant: str
    role: str
    #: The host of a fleet the attempt runs on (None on one host).
    host: str | None = None
    phase: str = "stopping"
    started: float = field(default_factory=time.monotonic)
    ended: float | None = None
    outcome: str | None = None
    last: str = ""
    detail: str = ""


#: Seconds between heartbeat lines on a non-terminal output (``CAMPAIGN_HEARTBEAT_S`` overrides; 0 turns them off).
HEARTBEAT_S = 30.0


def heartbeat_interval() -> float:
    """The heartbeat interval: ``CAMPAIGN_HEARTBEAT_S`` when it is a number, else ``HEARTBEAT_S``."""
    try:
        return max(0.0, float(os.environ.get("CAMPAIGN_HEARTBEAT_S", HEARTBEAT_S)))
    except ValueError:
        return HEARTBEAT_S


class RunDisplay:
    """Consumes campaign Events; draws a live table on a terminal and plain lines elsewhere.

    Elsewhere (a CI log, a file), a long phase would print nothing for minutes: while an attempt runs, a heartbeat
    line (its phase, the time since launch, the last log line) is printed every ``heartbeat_s``.
    """

    def __init__(self, console: Console, live: bool, heartbeat_s: float | None = None) -> None:
        self.console = console
        self.live = live
        self.heartbeat_s = heartbeat_interval() if heartbeat_s is None else heartbeat_s
        self._print_lock = threading.Lock()
        self.rows: dict[int, _Row] = {}
        self._live: Live | None = None
        self._stack: ExitStack | None = None
        self._bench: Callable[[BenchEvent], None] | None = None

    def __call__(self, ev: Event) -> None:
        """Take one event."""
        if ev.kind == "bench_progress":
            # The bench bar starts with the first bench and lasts to the end of the session.
            if self._bench is None and self._stack is not None:
                self._bench = self._stack.enter_context(bench_progress(self.console))
            if self._bench is not None and ev.progress is not None:
                self._bench(ev.progress)
            return
        row = self.rows.get(ev.attempt) if ev.attempt is not None else None
        say = partial(self._say, host=ev.host)
        if ev.kind == "attempt_start" and ev.attempt is not None:
            row = self.rows[ev.attempt] = _Row(ev.variant or "?", ev.role or "variant", ev.host)
            say(f"[bold]#{ev.attempt} {escape(row.variant)}[/] ({row.role}): stopping what runs, launching")
        elif row is not None and ev.kind == "phase" and ev.phase is not None:
            row.phase = ev.phase
            say(f"  #{ev.attempt} phase {ev.phase} at {time.monotonic() - row.started:.1f} s", dim=True)
        elif row is not None and ev.kind == "line":
            if ev.text.strip():
                row.last = ev.text.strip()[:160]
        elif row is not None and ev.kind in {"launched", "stopped", "ready", "smoke"}:
            if ev.kind in {"ready", "smoke"}:
                row.phase = ev.kind
            elif ev.kind == "launched":
                row.phase = "launch"  # until the log names a phase
            say(f"  #{ev.attempt} {escape(ev.text)}", dim=ev.kind in {"launched", "stopped"})
        elif row is not None and ev.kind == "attempt_end" and ev.record is not None:
            row.ended = time.monotonic()
            rec = ev.record
            row.outcome = rec.outcome
            detail = ""
            if rec.outcome == "failed":
                kind = rec.diagnosis.kind if rec.diagnosis else "?"
                detail = f"failed in {rec.failed_phase}: {kind}"
                if rec.diagnosis and rec.diagnosis.hint:
                    detail += f" — {rec.diagnosis.hint}"
            row.detail = detail
            style = _OUTCOME_STYLE.get(rec.outcome, "")
            say(f"  #{ev.attempt} [{style}]{rec.outcome}[/] {escape(detail)}")
            if rec.diagnosis and rec.outcome == "failed":
                for e in rec.diagnosis.evidence[:3]:
                    say(f"      line {e.line}: {escape(e.text[:150])}", dim=True)
        elif ev.kind in {"restore_start", "restore_end", "isolation", "note", "run_start"}:
            failed = ev.restore is not None and ev.restore.outcome == "failed"
            style = "bold red" if failed else "cyan"
            say(f"[{style}]{escape(ev.text)}[/]")
        self._refresh()

    def _say(self, markup: str, dim: bool = False, host: str | None = None) -> None:
        if host is not None:
            # Every line of a fleet's run names its host, so each host's progress reads apart in a log.
            markup = f"{escape(f'[{host}]')} {markup}"
        with self._print_lock:
            if self._live is not None:
                self._live.console.print(markup, style="dim" if dim else None, highlight=False)
            else:
                self.console.print(markup, style="dim" if dim else None, highlight=False)

    def heartbeat(self) -> str | None:
        """The heartbeat line of the attempt under way (None between attempts); a fleet's: of its first host's."""
        lines = self.heartbeats()
        return lines[0][1] if lines else None

    def heartbeats(self) -> list[tuple[str | None, str]]:
        """(host, heartbeat line) of the attempt under way on each host (one host: the one attempt)."""
        latest: dict[str | None, tuple[int, _Row]] = {}
        for i, r in self.rows.items():
            if r.ended is None:
                latest[r.host] = (i, r)
        out = []
        for host, (i, r) in latest.items():
            elapsed = time.monotonic() - r.started
            last = f"; last line: {r.last[:120]}" if r.last else ""
            out.append((host, f"… #{i} {r.variant}: {r.phase}, {elapsed:.0f} s since launch{last}"))
        return out

    def _beat(self, stop: threading.Event) -> None:
        while not stop.wait(self.heartbeat_s):
            for host, line in self.heartbeats():
                self._say(escape(line), dim=True, host=host)

    def _table(self) -> Table:
        fleet = any(r.host is not None for r in self.rows.values())
        t = Table(box=None, pad_edge=False, show_header=True, header_style="bold")
        for col in ("#", *(("host",) if fleet else ()), "variant", "role", "phase", "elapsed", "last log line"):
            t.add_column(col, overflow="fold" if col == "last log line" else "ellipsis")
        for i, r in self.rows.items():
            end = r.ended or time.monotonic()
            phase = Text(r.outcome or r.phase, style=_OUTCOME_STYLE.get(r.outcome or "", "yellow"))
            host = (r.host or "",) if fleet else ()
            elapsed = f"{end - r.started:5.1f}s"
            t.add_row(str(i), *host, r.variant, r.role, phase, elapsed, Text(r.last[:100], style="dim"))
        return t

    def _hosts(self) -> Table | None:
        """A fleet's progress, one line per host: attempts done and passed, and what runs there now."""
        hosts: dict[str, list[tuple[int, _Row]]] = {}
        for i, r in self.rows.items():
            if r.host is not None:
                hosts.setdefault(r.host, []).append((i, r))
        if not hosts:
            return None
        t = Table(box=None, pad_edge=False, show_header=False)
        for host, rows in hosts.items():
            done = [r for _i, r in rows if r.ended is not None]
            passed = sum(1 for r in done if r.outcome == "passed")
            now = next(((i, r) for i, r in reversed(rows) if r.ended is None), None)
            doing = f"now #{now[0]} {now[1].variant}: {now[1].phase}" if now is not None else "idle"
            t.add_row(Text(host, style="bold"), f"{len(done)} done, {passed} passed", doing)
        return t

    def _refresh(self) -> None:
        if self._live is not None:
            hosts = self._hosts()
            self._live.update(Group(hosts, self._table()) if hosts is not None else Group(self._table()))

    @contextmanager
    def session(self) -> Iterator[EventSink]:
        """Run the display for the duration of a campaign (and a bench bar once a bench starts)."""
        with ExitStack() as stack:
            self._stack = stack
            try:
                if self.live:
                    with Live(self._table(), console=self.console, refresh_per_second=8, transient=False) as live:
                        self._live = live
                        try:
                            yield self
                        finally:
                            self._refresh()
                            self._live = None
                elif self.heartbeat_s > 0:
                    stop = threading.Event()
                    beat = threading.Thread(target=self._beat, args=(stop,), name="heartbeat", daemon=True)
                    beat.start()
                    try:
                        yield self
                    finally:
                        stop.set()
                        beat.join()
                else:
                    yield self
            finally:
                self._stack = None
                self._bench = None


def render_plan(console: Console, plan: Plan) -> None:
    """What `campaign run --dry-run` shows: every variant's exact launch, and the failure policy."""
    exp = plan.loaded.experiment
    experiment, host, recipe = exp.name, plan.host_label, plan.loaded.recipe.name
    planned, known_good, isolate = plan.planned, plan.known_good, plan.isolate
    matrix: dict[str, Any] | None = exp.matrix.model_dump() if exp.matrix else None
    ready_s, at_end = exp.timeouts.ready_s, exp.at_end
    console.print(f"[bold]Plan for {escape(experiment)}[/] on [cyan]{escape(host)}[/] with recipe {escape(recipe)}")
    if len(exp.fleet) > 1:
        console.print(
            "fleet: each host runs the baseline first and takes variants once it passed; each variant runs once, "
            "on the host free first (the launches below are the first host's)"
        )
        for i, h in enumerate(exp.fleet):
            extra = {**h.knobs, **({"env": mask_env(h.env)} if h.env else {})}
            console.print(f"   host {i}: {escape(host_label(h))}" + (f", with {escape(str(extra))}" if extra else ""))
    if matrix:
        axes = ", ".join(f"{k} ∈ {v}" for k, v in matrix.get("axes", {}).items())
        console.print(f"matrix: {escape(axes)}" + (f"; zipped {matrix['zip']}" if matrix.get("zip") else ""))
    for i, pv in enumerate(planned):
        console.print(f"\n[bold]{i}. {escape(pv.name)}[/]  knobs: {escape(str(pv.knobs))}")
        shown = pv.spec.model_copy(update={"env": {}, "command": mask_args(pv.spec.command)})
        console.print(f"   command: {escape(shell_line(shown))}", soft_wrap=True)
        env = mask_env(pv.spec.env)
        console.print(f"   env: {escape(str(env)) if env else '(none)'}")
        console.print(
            f"   ready when: the group is alive, /{escape(pv.spec.ready_marker)}/ is in the log and "
            f"{escape(pv.spec.health_path)} answers 200 on port {pv.spec.port} (deadline {ready_s:g} s)"
        )
    bench = exp.bench_settings()
    if bench is not None:
        console.print(f"\n[bold]Bench[/] (each variant): {escape(bench.describe())}")
    if bench is not None and exp.profile is not None:
        console.print(
            f"[bold]Profile[/] (each variant): {escape(profile_plan(exp.profile, bench, plan.loaded.recipe))}"
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
    if plan.estimate is not None:
        _render_estimate(console, plan)
    console.print("\n[dim]dry run: nothing was touched[/]")


def _render_estimate(console: Console, plan: Plan) -> None:
    est = plan.estimate
    if est is None:
        return
    retry = plan.loaded.experiment.retry
    console.print(
        f"\n[bold]Cost[/]: {est.trials} trial(s); transient failures retried up to {retry.budget} time(s) each"
    )
    if est.total_s is None:
        console.print("   ETA: unknown (no stored run of this recipe on this host yet)")
    else:
        guessed = sum(1 for v in est.variants if v.basis != "spec")
        fleet = f" over {est.hosts} hosts (costs from the first host's runs)" if est.hosts > 1 else ""
        console.print(
            f"   ETA: {_duration(est.total_s)}{fleet} from {est.runs_used} stored run(s)"
            + (f"; {guessed} variant(s) never run here, counted at the recipe's median" if guessed else "")
        )
    if est.deadline_s is not None:
        line = f"   deadline: {_duration(est.deadline_s)}"
        if est.past_deadline:
            line += f"; by the estimate these would not be started: {', '.join(est.past_deadline)}"
        console.print(escape(line))


def _duration(seconds: float) -> str:
    """``42 s``, ``3 min 5 s``, ``1 h 20 min``."""
    s = round(seconds)
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60} s"
    return f"{s // 3600} h {s % 3600 // 60} min"


def render_report(console: Console, report: RunReport) -> None:
    """`campaign show`: one run's attempts, diagnoses, restores, attribution and final state."""
    console.print(
        f"[bold]{escape(report.run_id)}[/]  {escape(report.experiment)} on {escape(report.host)} "
        f"({escape(report.recipe)})  status: [{status_style(report.status)}]{report.status}[/]"
    )
    console.print(f"started {report.started_at}, ended {report.ended_at or '-'}")
    fleet = bool(report.hosts)
    t = Table(show_header=True, header_style="bold")
    columns = ("#", "variant", "role", "outcome", "failed in", "ready s", "lag s", "smoke", "diagnosis", "restore")
    for col in (columns[0], "host", *columns[1:]) if fleet else columns:
        t.add_column(col)
    for a in report.attempts:
        cells = _attempt_cells(a)
        t.add_row(*([cells[0], a.host or "", *cells[1:]] if fleet else cells))
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
            parts = [f"{lv.label}: {lv.output_throughput:.1f} tok/s" for lv in a.bench.levels]
            if parts:
                console.print(f"  #{a.index} bench: " + "; ".join(parts))
            found = sla_line(a.bench)
            if found:
                console.print(f"  #{a.index} {escape(found)}")
        render_profile(console, a)
    _render_long_run(console, report)
    if report.attribution:
        console.print("\n[bold]Attribution[/]")
        for f in report.attribution:
            console.print(f"  {escape(f.statement)}")
    if fleet:
        _render_hosts(console, report)
        return
    fin = report.final
    if fin.variant is None and fin.healthy:
        console.print(f"\nfinal: nothing left running — {escape(fin.detail or 'stopped')}, the box verified clean")
        return
    state = "[green]healthy[/]" if fin.healthy else "[red]not healthy[/]"
    console.print(f"\nfinal: {escape(fin.variant or '-')} {state}" + (f" — {escape(fin.detail)}" if fin.detail else ""))


def _render_hosts(console: Console, report: RunReport) -> None:
    """A fleet run's ending, host by host: its baseline, its status, what it left running."""
    console.print("\n[bold]Hosts[/]")
    for h in report.hosts:
        base = f"baseline proven by #{h.baseline_attempt}" if h.baseline_attempt is not None else "baseline not proven"
        fin = h.final
        state = "[green]healthy[/]" if fin.healthy else "[red]not healthy[/]"
        left = f"{escape(fin.variant)} {state}" if fin.variant else escape(fin.detail or "nothing running")
        console.print(
            f"  {escape(h.host)}: [{status_style(h.status)}]{h.status}[/], {base}; final: {left}"
            + (f" — {escape(h.note)}" if h.note else "")
        )
    if report.not_run:
        console.print(f"not run: {escape(', '.join(report.not_run))}")


def _render_long_run(console: Console, report: RunReport) -> None:
    """Retries, known failures skipped, resumes and a deadline stop, where the run had any."""
    for a in report.attempts:
        if a.retry_of is not None:
            console.print(f"  #{a.index} {escape(a.variant)}: retry of #{a.retry_of} (transient failure), {a.outcome}")
        if a.known_failure is not None:
            console.print(f"  #{a.index} {escape(a.variant)}: [yellow]skipped[/], {escape(a.note or a.known_failure)}")
    for rs in report.restores:
        if rs.ready_s is not None and rs.cold_start_ready_s is not None:
            how = f" by {rs.mode}" if rs.mode else ""  # reports from before restores said how have no mode
            parts = ", ".join(f"{k.removesuffix('_s')} {v:.1f} s" for k, v in rs.phases.items() if v is not None)
            console.print(
                f"  restore after #{rs.attempt}{how}: ready in {rs.ready_s:.1f} s against a cold start of "
                f"{rs.cold_start_ready_s:.1f} s ({rs.ready_s / max(rs.cold_start_ready_s, 1e-9):.2f}x)"
                + (f" ({escape(parts)})" if parts else "")
            )
    for r in report.resumes:
        console.print(
            f"resumed {r.at} from {r.from_status}: {len(r.remaining)} variant(s) left; found {escape(r.found)}"
        )
    if report.ended_early:
        console.print(f"[yellow]ended early[/]: {escape(report.ended_early)}")


def status_style(status: str) -> str:
    """The colour a run's status is shown in (run reports here, run lists in ``console.box``)."""
    styles = {"passed": "green", "failed": "yellow", "restore_failed": "bold red", "aborted": "red"}
    return styles.get(status, "yellow")  # interrupted, running


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


def render_error(console: Console, message: str, hint: str | None) -> None:
    """An error as the CLI shows it: one red line, then what to do."""
    console.print(f"[bold red]error:[/] {escape(message)}", highlight=False)
    if hint:
        console.print(f"[cyan]hint:[/] {escape(hint)}", highlight=False)
