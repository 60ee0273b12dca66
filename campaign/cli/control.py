"""Commands on an experiment's box: run (and --dry-run), status, stop, restore."""

from __future__ import annotations

import json
from typing import Annotated

import typer

from campaign.cli.app import ConfigArg, ForceOpt, JsonOpt, SetOpt, app, finish_run, ops_of
from campaign.console import Output


@app.command()
def run(
    ctx: typer.Context,
    config: ConfigArg,
    run_ref: Annotated[
        str | None, typer.Argument(metavar="[RUN]", help="With --resume: the run to continue (id, prefix, `last`).")
    ] = None,
    variant: Annotated[
        list[str] | None, typer.Option("--variant", "-v", help="Run only this variant (repeat).")
    ] = None,
    set_: SetOpt = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Print the plan and touch nothing.")] = False,
    isolate: Annotated[
        bool | None, typer.Option("--isolate/--no-isolate", help="Localise a failure by toggling knobs back.")
    ] = None,
    accept_new_host_key: Annotated[
        bool, typer.Option("--accept-new-host-key", help="Trust and record an SSH host key seen for the first time.")
    ] = False,
    force: ForceOpt = False,
    resume: Annotated[
        bool,
        typer.Option(
            "--resume",
            help="Continue a stopped or failed run of this experiment (RUN, default: its last): finished attempts "
            "kept, the variants left run, one report.",
        ),
    ] = False,
    retry_known: Annotated[
        bool, typer.Option("--retry-known", help="Run variants a stored run saw fail the same way (not skipped).")
    ] = False,
    json_out: JsonOpt = False,
) -> None:
    """Run an experiment: every variant stopped, launched, proven or diagnosed, and the box restored."""
    from campaign.console.run import RunDisplay, render_plan

    out = Output(json=json_out)
    if run_ref is not None and not resume:
        raise typer.BadParameter(f"a run ({run_ref}) is given only with --resume", param_hint="RUN")
    if dry_run:
        plan = ops_of(ctx).plan(config, set_ or [], variant or [], isolate, accept_new_host_key=accept_new_host_key)
        for note in plan.notes:
            out.err.print(note)
        if json_out:
            out.print_json(plan.document().model_dump_json(indent=2))
        else:
            render_plan(out.out, plan)
        return
    display = RunDisplay(out.err, live=out.interactive)
    with display.session():
        report = ops_of(ctx).run(
            config,
            set_ or [],
            variant or [],
            isolate,
            accept_new_host_key=accept_new_host_key,
            on_event=display,
            force=force,
            resume=(run_ref or "last") if resume else None,
            retry_known=retry_known,
        )
    finish_run(ctx, out, report)


@app.command()
def status(ctx: typer.Context, config: ConfigArg, set_: SetOpt = None, json_out: JsonOpt = False) -> None:
    """What runs on the experiment's host now (spec, PID/PGID, uptime, health) and its known-good."""
    from campaign.console.box import render_status

    out = Output(json=json_out)
    states = ops_of(ctx).status(config, set_ or [])
    if json_out:
        # One host: its document, as always; a fleet: a list of them, one per host.
        docs = [json.loads(s.model_dump_json()) for s in states]
        out.print_json(json.dumps(docs[0] if len(docs) == 1 else docs, indent=2))
    else:
        for state in states:
            render_status(out.out, state)


@app.command()
def stop(
    ctx: typer.Context, config: ConfigArg, set_: SetOpt = None, force: ForceOpt = False, json_out: JsonOpt = False
) -> None:
    """Stop what campaign runs on the experiment's host (TERM, grace, KILL) and verify the box is clean."""
    from campaign.console.box import render_stop

    out = Output(json=json_out)
    stops = ops_of(ctx).stop(config, set_ or [], force=force)
    if json_out:
        # One host: its document; a fleet: a list of them, one per host (as `status`).
        docs = [json.loads(s.report.model_dump_json()) for s in stops]
        out.print_json(json.dumps(docs[0] if len(docs) == 1 else docs, indent=2))
    else:
        for stopped in stops:
            render_stop(out.out, stopped.host, stopped.report)


@app.command()
def restore(
    ctx: typer.Context, config: ConfigArg, set_: SetOpt = None, force: ForceOpt = False, json_out: JsonOpt = False
) -> None:
    """Relaunch the host's known-good and prove it again (readiness + smoke)."""
    from campaign.console.run import RunDisplay

    out = Output(json=json_out)
    display = RunDisplay(out.err, live=out.interactive)
    with display.session():
        report = ops_of(ctx).restore(config, set_ or [], on_event=display, force=force)
    finish_run(ctx, out, report)
