# Over 500 lines: one typer declaration per command (options, help texts); each body is a single call.
"""The command line: each command parses, makes one call to ``campaign.operations``, and hands the value to the console.

Exit codes (``campaign.outcome``, docs/reliability.md): 0 all good; 1 some variant failed and the box was restored; 2
bad usage or config, or the host locked by another campaign; 3 the box could not be restored (or was left dirty or
unproven); 70 a bug of ours; 128+N a signal N interrupted it (130 SIGINT, 143 SIGTERM, 129 SIGHUP). A usage error
(unknown command or option, a missing argument, a bad value) prints the usage line and "Try 'campaign ... --help'";
any other error prints one line and a hint (and, under --json, a JSON document on stdout); tracebacks only with
--debug (never with locals). ``--json`` documents are records' JSON.
"""

from __future__ import annotations

import contextlib
import json
import sys
import traceback
from pathlib import Path
from typing import Annotated, Any

import typer
from pydantic import TypeAdapter
from typer.core import TyperGroup

from campaign import __version__
from campaign.console import Output
from campaign.errors import CampaignError
from campaign.interruption import Interrupted


class _Group(TyperGroup):
    """The root command: maps what a command raises to a message and an exit code (see the module docstring)."""

    def invoke(self, ctx: Any) -> Any:
        try:
            return super().invoke(ctx)
        except CampaignError as e:
            if _debug(ctx):
                traceback.print_exc()
            from campaign.console.run import render_error

            render_error(Output().err, e.message, e.hint)
            if "--json" in sys.argv[1:]:
                from campaign.outcome import error_doc

                sys.stdout.write(error_doc(e).model_dump_json(indent=2) + "\n")
            raise typer.Exit(e.exit_code) from None
        except Interrupted as e:
            sys.stderr.write(f"{e.name}: interrupted before anything was done\n")
            raise typer.Exit(e.exit_code) from None
        except (typer.Exit, typer.Abort, typer.TyperException):
            raise
        except KeyboardInterrupt:
            sys.stderr.write("interrupted\n")
            raise typer.Exit(130) from None
        except Exception as e:  # a bug of ours: say so plainly; the traceback (never with locals) only under --debug
            if _debug(ctx):
                traceback.print_exc()
            else:
                sys.stderr.write(f"internal error: {type(e).__name__}: {e}\n(run with --debug for the traceback)\n")
            raise typer.Exit(70) from None


def _debug(ctx: Any) -> bool:
    return bool(ctx.params.get("debug"))


app = typer.Typer(
    cls=_Group,
    no_args_is_help=False,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["--help", "-h"]},
    help="Run inference-optimization campaigns: launch server variants, prove them, diagnose failures, restore.",
)

JsonOpt = Annotated[bool, typer.Option("--json", help="Print only JSON on stdout (prose goes to stderr).")]
ConfigArg = Annotated[str, typer.Argument(help="An experiment: a name in configs/ or a path to a YAML file.")]
SetOpt = Annotated[list[str] | None, typer.Option("--set", help="Override a config value: key.path=value (repeat).")]
ForceOpt = Annotated[bool, typer.Option("--force", help="Break the host's lock held by another campaign (recorded).")]
RunArg = Annotated[str, typer.Argument(metavar="RUN", help="A run id, a unique prefix, or `last`.")]


def _show_version(value: bool) -> None:
    if value:
        sys.stdout.write(f"campaign {__version__}\n")
        raise typer.Exit(0)


@app.callback()
def _main(
    ctx: typer.Context,
    debug: Annotated[bool, typer.Option("--debug", help="Show tracebacks (without local variables).")] = False,
    runs_dir: Annotated[
        Path,
        typer.Option("--runs-dir", envvar="CAMPAIGN_RUNS", file_okay=False, help="The run store folder."),
    ] = Path("runs"),
    version: Annotated[
        bool, typer.Option("--version", callback=_show_version, is_eager=True, help="Print the version and exit.")
    ] = False,
) -> None:
    from campaign.operations import Operations

    ctx.obj = Operations(runs=runs_dir)


def _ops(ctx: typer.Context) -> Any:
    """The ``Operations`` the root callback made (typed ``Any`` here so the import stays lazy: --help stays fast)."""
    return ctx.find_root().obj


def _finish(ctx: typer.Context, out: Output, report: Any) -> None:
    """Print a run's report (its summary as JSON, or tables) and exit with the code its status means."""
    from campaign.console.run import render_report
    from campaign.operations import exit_code
    from campaign.records import RunSummary

    code = exit_code(report)
    runs = str(_ops(ctx).runs)
    if out.json:
        out.print_json(RunSummary.of(report, code, runs).model_dump_json(indent=2))
    else:
        render_report(out.out, report)
        out.err.print(f"report: {runs}/{report.run_id}/report.json")
    if report.status == "interrupted":
        out.err.print(f"{report.signal or 'interrupted'}: {report.final.detail}", markup=False, highlight=False)
    raise typer.Exit(code)


# -- run --------------------------------------------------------------------------------------------------------------


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
        plan = _ops(ctx).plan(config, set_ or [], variant or [], isolate, accept_new_host_key=accept_new_host_key)
        for note in plan.notes:
            out.err.print(note)
        if json_out:
            out.print_json(plan.document().model_dump_json(indent=2))
        else:
            render_plan(out.out, plan)
        return
    display = RunDisplay(out.err, live=out.interactive)
    with display.session():
        report = _ops(ctx).run(
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
    _finish(ctx, out, report)


@app.command()
def status(ctx: typer.Context, config: ConfigArg, set_: SetOpt = None, json_out: JsonOpt = False) -> None:
    """What runs on the experiment's host now (spec, PID/PGID, uptime, health) and its known-good."""
    from campaign.console.box import render_status

    out = Output(json=json_out)
    states = _ops(ctx).status(config, set_ or [])
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
    stops = _ops(ctx).stop(config, set_ or [], force=force)
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
        report = _ops(ctx).restore(config, set_ or [], on_event=display, force=force)
    _finish(ctx, out, report)


# -- the store --------------------------------------------------------------------------------------------------------


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
    store = _ops(ctx).store
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
    healing = _ops(ctx).doctor()
    if json_out:
        out.print_json(healing.model_dump_json(indent=2))
    else:
        render_healing(out.out, healing)


@app.command()
def show(ctx: typer.Context, run_ref: RunArg, json_out: JsonOpt = False) -> None:
    """One run's report: attempts, diagnoses, restores, attribution, final state."""
    from campaign.console.run import render_report

    out = Output(json=json_out)
    report = _ops(ctx).report(run_ref)
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
        out.write_bytes(_ops(ctx).stored_log(run_ref, attempt))
        return
    with contextlib.closing(_ops(ctx).follow_log(run_ref, attempt)) as lines:
        try:
            for line in lines:
                out.write_line(line)
        except KeyboardInterrupt:
            pass


# -- diagnosis, bench, compare ----------------------------------------------------------------------------------------


@app.command()
def diagnose(
    logfile: Annotated[Path, typer.Argument(help="A server log file.")],
    server: Annotated[
        str | None, typer.Option("--server", help="refserver, sglang or vllm (for flag spellings).")
    ] = None,
    exit_code: Annotated[int | None, typer.Option("--exit-code", help="The process's exit status, if known.")] = None,
    json_out: JsonOpt = False,
) -> None:
    """Why a server failed to start or serve: root cause, evidence lines, next step."""
    from campaign.console.diagnosis import render_diagnosis
    from campaign.diagnose import diagnose_file

    out = Output(json=json_out)
    d = diagnose_file(logfile, server=server, exit_code=exit_code)
    if json_out:
        out.print_json(d.model_dump_json(indent=2))
    else:
        render_diagnosis(out.out, d)


def _numbers(text: str | None, kind: type[float], option: str, example: str) -> list[float] | None:
    """``1,8,32`` as numbers of ``kind``; a usage error (exit 2, with the usage line) names the option otherwise."""
    if not text:
        return None
    try:
        return [kind(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise typer.BadParameter(
            f"{text!r}: expected numbers separated by commas, e.g. {example}", param_hint=f"'{option}'"
        ) from None


def _pairs(values: list[str] | None, sep: str, option: str, example: str) -> list[tuple[str, str]]:
    """``NAME<sep>VALUE`` options as pairs; a usage error names the option when one lacks the separator."""
    out: list[tuple[str, str]] = []
    for text in values or []:
        name, found, value = text.partition(sep)
        if not found or not name.strip():
            raise typer.BadParameter(f"{text!r}: expected NAME{sep}VALUE, e.g. {example}", param_hint=f"'{option}'")
        out.append((name.strip(), value.strip()))
    return out


def _sla_options(slos: list[str] | None, over: str, span: str, max_trials: int | None) -> dict[str, Any] | None:
    """``--sla ttft.p90=200 --sla-range 1:64`` as the ``sla`` bench setting (None without ``--sla``)."""
    pairs = _pairs(slos, "=", "--sla", "ttft.p90=200")
    if not pairs:
        return None
    bounds: dict[str, float] = {}
    for name, value in pairs:
        try:
            bounds[name] = float(value)
        except ValueError:
            raise typer.BadParameter(f"{name}={value!r}: the bound must be a number", param_hint="'--sla'") from None
    low, found, high = span.partition(":")
    try:
        lo, hi = float(low), float(high)
    except ValueError:
        raise typer.BadParameter(f"{span!r}: expected LOW:HIGH, e.g. 1:64", param_hint="'--sla-range'") from None
    if not found:
        raise typer.BadParameter(f"{span!r}: expected LOW:HIGH, e.g. 1:64", param_hint="'--sla-range'")
    error_rate = bounds.pop("error_rate", None)
    sla: dict[str, Any] = {"over": over, "slo": bounds, "low": lo, "high": hi}
    if error_rate is not None:
        sla["max_error_rate"] = error_rate
    if max_trials is not None:
        sla["max_trials"] = max_trials
    return sla


@app.command()
def bench(
    ctx: typer.Context,
    url: Annotated[str, typer.Argument(help="The server's base URL, e.g. http://127.0.0.1:30000")],
    concurrency: Annotated[str | None, typer.Option("--concurrency", "-c", help="Levels, e.g. 1,8,32,128.")] = None,
    rate: Annotated[str | None, typer.Option("--rate", help="Poisson request rates (req/s), e.g. 2,8.")] = None,
    requests: Annotated[int, typer.Option("--requests", "-n", help="Measured requests per level.")] = 64,
    warmup: Annotated[int, typer.Option("--warmup", help="Warm-up requests per level.")] = 2,
    repeats: Annotated[int, typer.Option("--repeats", help="Repeat each level this many times.")] = 1,
    prompts: Annotated[str, typer.Option("--prompts", help="arithmetic, random or long-context.")] = "arithmetic",
    input_len: Annotated[
        int,
        typer.Option(
            "--input-len",
            help="Random prompts: input tokens; long-context: the context length (exact with the server's /tokenize).",
        ),
    ] = 128,
    output_len: Annotated[int, typer.Option("--output-len", help="Random prompts: output tokens.")] = 128,
    max_tokens: Annotated[int | None, typer.Option("--max-tokens", help="max_tokens per request.")] = None,
    model: Annotated[str | None, typer.Option("--model", help="Model name (default: the first /v1/models).")] = None,
    max_error_rate: Annotated[float, typer.Option("--max-error-rate", help="A level past this fails.")] = 0.01,
    seed: Annotated[int, typer.Option("--seed", help="Prompt seed.")] = 0,
    ramp: Annotated[float, typer.Option("--ramp", help="Spread stream starts over this many s.")] = 0.0,
    endpoint: Annotated[
        str, typer.Option("--endpoint", help="chat (/v1/chat/completions) or completions (/v1/completions).")
    ] = "chat",
    api_key: Annotated[
        str | None,
        typer.Option(
            "--api-key",
            envvar="CAMPAIGN_API_KEY",
            show_envvar=True,
            help="Sent as Authorization: Bearer KEY; masked in all output.",
        ),
    ] = None,
    header: Annotated[
        list[str] | None, typer.Option("--header", help="'Name: value' sent with every request (repeat).")
    ] = None,
    sla: Annotated[
        list[str] | None,
        typer.Option("--sla", help="Search the highest load meeting METRIC=BOUND (ms), e.g. ttft.p90=200 (repeat)."),
    ] = None,
    sla_over: Annotated[str, typer.Option("--sla-over", help="concurrency or request_rate.")] = "concurrency",
    sla_range: Annotated[str, typer.Option("--sla-range", help="LOW:HIGH load the search spans.")] = "1:64",
    sla_trials: Annotated[int | None, typer.Option("--sla-max-trials", help="At most this many levels.")] = None,
    output: Annotated[Path | None, typer.Option("--output", "-o", help="Write the result's JSON here.")] = None,
    export_requests: Annotated[
        Path | None, typer.Option("--export-requests", help="Write every measured request here (JSON lines).")
    ] = None,
    json_out: JsonOpt = False,
) -> None:
    """Load a server with streaming requests: TTFT, ITL, TPOT, E2E, throughput and errors, or an SLA search."""
    from campaign.console.bench import bench_progress, render_bench

    out = Output(json=json_out)
    options: dict[str, Any] = {
        "requests": requests,
        "warmup": warmup,
        "repeats": repeats,
        "prompts": prompts,
        "input_len": input_len,
        "output_len": output_len,
        "max_error_rate": max_error_rate,
        "seed": seed,
        "ramp_s": ramp,
        "endpoint": endpoint,
        "headers": dict(_pairs(header, ":", "--header", "'X-Team: bench'")),
    }
    extra = {
        "max_tokens": max_tokens,
        "concurrency": _numbers(concurrency, int, "--concurrency", "1,8,32"),
        "request_rate": _numbers(rate, float, "--rate", "2,8"),
        "api_key": api_key,
        "sla": _sla_options(sla, sla_over, sla_range, sla_trials),
    }
    options.update({k: v for k, v in extra.items() if v is not None})
    with bench_progress(out.err) as progress:
        result = _ops(ctx).bench(url, options, model=model, progress=progress, output=output, export=export_requests)
    if json_out:
        out.print_json(result.model_dump_json(indent=2))
    else:
        render_bench(out.out, result)
    raise typer.Exit(0 if result.passed else 1)


@app.command()
def compare(
    ctx: typer.Context,
    run_refs: Annotated[list[str], typer.Argument(metavar="RUN...", help="One or more runs (ids, prefixes, last).")],
    md: Annotated[bool, typer.Option("--md", help="Markdown on stdout.")] = False,
    csv: Annotated[bool, typer.Option("--csv", help="Every measured value as long-format CSV on stdout.")] = False,
    json_out: JsonOpt = False,
    plot_file: Annotated[
        Path | None,
        typer.Option("--plot", help="Draw throughput, TTFT, TPOT and p90 latency (95% intervals) to a PNG."),
    ] = None,
    all_fields: Annotated[bool, typer.Option("--all", help="Show every config field, not only differences.")] = False,
    baseline: Annotated[
        str | None,
        typer.Option(
            "--baseline",
            metavar="RUN:VARIANT",
            help="Compare every column with this one (default: the same variant of the first run, else the first).",
        ),
    ] = None,
    correction: Annotated[
        str, typer.Option("--correction", help="p-value adjustment over all cells: holm, bh or none.")
    ] = "holm",
    alpha: Annotated[float, typer.Option("--alpha", help="Significance level of the adjusted p-values.")] = 0.05,
    min_effect: Annotated[
        float,
        typer.Option("--min-effect", help="Smallest change called significant, as a fraction (0.05 = 5%; 0: any)."),
    ] = 0.05,
) -> None:
    """Compare runs: config and environment differences, metrics with ratios, intervals and corrected significance.

    --csv writes every measured value in long form (run, variant, launch, repeat, level, metric, unit, value).
    """
    from campaign.comparison import to_csv, to_json, to_markdown
    from campaign.console.compare import render_comparison

    if sum([md, csv, json_out]) > 1:
        raise typer.BadParameter("choose one of --md, --csv, --json", param_hint="--md/--csv/--json")
    out = Output(json=json_out)
    if correction not in ("holm", "bh", "none"):
        raise typer.BadParameter(f"{correction!r}: choose holm, bh or none", param_hint="'--correction'")
    if not 0 < alpha < 1:
        raise typer.BadParameter(f"{alpha:g}: a significance level is between 0 and 1", param_hint="'--alpha'")
    if not 0 <= min_effect < 1:
        why = f"{min_effect:g}: a minimum effect is a fraction in [0, 1)"
        raise typer.BadParameter(why, param_hint="'--min-effect'")
    c = _ops(ctx).compare(
        run_refs,
        all_fields=all_fields,
        baseline=baseline,
        correction=correction,
        alpha=alpha,
        min_effect=min_effect,
    )
    if plot_file is not None:
        from campaign.plot import plot

        out.err.print(f"plot: {plot(c, plot_file)}")
    if json_out:
        out.print_json(to_json(c))
    elif md:
        out.write_text(to_markdown(c))
    elif csv:
        out.write_text(to_csv(c))
    else:
        render_comparison(out.out, c)


# -- entry point ------------------------------------------------------------------------------------------------------


def main() -> None:
    """Console-script entry: usage errors exit 2 (typer prints the usage and the help hint); see ``_Group``."""
    app(prog_name="campaign")


if __name__ == "__main__":
    main()
