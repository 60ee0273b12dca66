"""``campaign tune``: search an experiment's ``search:`` space and keep a proven winner."""

from __future__ import annotations

from typing import Annotated

import typer

from campaign.cli.app import ConfigArg, JsonOpt, SetOpt, app, ops_of
from campaign.console import Output


@app.command()
def tune(
    ctx: typer.Context,
    config: ConfigArg,
    set_: SetOpt = None,
    strategy: Annotated[
        str, typer.Option("--strategy", help="tiered (one factor, then combinations), bayes (Optuna TPE) or grid.")
    ] = "tiered",
    budget: Annotated[
        str | None, typer.Option("--budget", help="Trials (16) or wall time (30m, 2h); over the search: block's.")
    ] = None,
    resume: Annotated[
        bool, typer.Option("--resume", help="Continue the experiment's last unfinished tune: no trial run twice.")
    ] = False,
    json_out: JsonOpt = False,
) -> None:
    """Search the knob space through the loop; promote the winner only when it is significantly better."""
    from campaign.console.tune import TuneDisplay, render_tune

    if strategy not in ("tiered", "bayes", "grid"):
        raise typer.BadParameter(f"{strategy!r}: tiered, bayes or grid", param_hint="--strategy")
    out = Output(json=json_out)
    report = ops_of(ctx).tune(
        config,
        set_ or [],
        strategy=strategy,
        budget=budget,
        resume="last" if resume else None,
        on_progress=TuneDisplay(out.err),
    )
    if json_out:
        out.print_json(report.model_dump_json(indent=2))
    else:
        render_tune(out.out, report)
    # 0: a winner promoted or an honest "no significant gain", the box proven either way; 130: interrupted (resume
    # with --resume); 3: the box is not proven.
    if report.status == "interrupted":
        raise typer.Exit(130)
    if report.final is None or not report.final.box_proven:
        raise typer.Exit(3)
