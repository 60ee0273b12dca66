"""Commands over the run store: runs (and --failures), doctor, show, logs."""

from __future__ import annotations

import contextlib
from typing import Annotated

import typer
from pydantic import TypeAdapter

from campaign.cli.app import JsonOpt, RunArg, app, ops_of
from campaign.console import Output


@app.command()
def runs(
    ctx: typer.Context,
    failures: Annotated[bool, typer.Option("--failures", help="Group failures by fingerprint instead.")] = False,
    limit: Annotated[int, typer.Option("--limit", "-n", help="At most this many runs.")] = 30,
    json_out: JsonOpt = False,
) -> None:
    """A table of past runs (newest first), or failures grouped by fingerprint."""
    from campaign.console.box import render_failures, render_runs
    from campaign.records import FailureGroup, RunRow

    out = Output(json=json_out)
    store = ops_of(ctx).store
    if failures:
        groups = store.failures()
        if json_out:
            out.print_json(TypeAdapter(list[FailureGroup]).dump_json(groups, indent=2).decode())
        else:
            render_failures(out.out, groups)
        return
    rows = store.list_runs(limit=limit)
    if json_out:
        out.print_json(TypeAdapter(list[RunRow]).dump_json(rows, indent=2).decode())
    else:
        render_runs(out.out, rows)


@app.command()
def doctor(ctx: typer.Context, json_out: JsonOpt = False) -> None:
    """Rebuild the run index from the run folders' report.json files and prune rows whose folder is gone."""
    from campaign.console.box import render_healing

    out = Output(json=json_out)
    healing = ops_of(ctx).doctor()
    if json_out:
        out.print_json(healing.model_dump_json(indent=2))
    else:
        render_healing(out.out, healing)


@app.command()
def show(ctx: typer.Context, run_ref: RunArg, json_out: JsonOpt = False) -> None:
    """One run's report: attempts, diagnoses, restores, attribution, final state."""
    from campaign.console.run import render_report

    out = Output(json=json_out)
    report = ops_of(ctx).report(run_ref)
    if json_out:
        out.print_json(report.model_dump_json(indent=2))
    else:
        render_report(out.out, report)


@app.command()
def logs(
    ctx: typer.Context,
    run_ref: RunArg,
    attempt: Annotated[int | None, typer.Option("--attempt", "-a", help="Attempt index (default: the last).")] = None,
    follow: Annotated[bool, typer.Option("--follow", "-f", help="Tail the live log on the host.")] = False,
) -> None:
    """A stored attempt's server log; --follow tails the live one on the host."""
    out = Output()
    if not follow:
        out.write_bytes(ops_of(ctx).stored_log(run_ref, attempt))
        return
    with contextlib.closing(ops_of(ctx).follow_log(run_ref, attempt)) as lines:
        try:
            for line in lines:
                out.write_line(line)
        except KeyboardInterrupt:
            pass
