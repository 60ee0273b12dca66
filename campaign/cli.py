"""The command line: each command parses, makes one core call, and hands the value to the console.

Exit codes: 0 all good; 1 some variant failed and the box was restored; 2 bad usage or config; 3 the box could not
be restored (or was left dirty). Errors print one line and a hint; tracebacks only with --debug (never with locals).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Annotated, Any

import typer

from campaign.console import Output
from campaign.errors import CampaignError, StoreError, UsageError

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    help="Run inference-optimization campaigns: launch server variants, prove them, diagnose failures, restore.",
)

_state: dict[str, Any] = {"debug": False, "runs": Path("runs")}

JsonOpt = Annotated[bool, typer.Option("--json", help="Print only JSON on stdout (prose goes to stderr).")]
ConfigArg = Annotated[str, typer.Argument(help="An experiment: a name in configs/ or a path to a YAML file.")]


@app.callback()
def _main(
    debug: Annotated[bool, typer.Option("--debug", help="Show tracebacks (without local variables).")] = False,
    runs_dir: Annotated[Path, typer.Option("--runs-dir", envvar="CAMPAIGN_RUNS", help="The run store folder.")] = Path(
        "runs"
    ),
) -> None:
    _state["debug"] = debug
    _state["runs"] = runs_dir


def _store() -> Any:
    from campaign.store import Store

    return Store(_state["runs"])


def _exit_for(status: str) -> int:
    return {"passed": 0, "failed": 1, "restore_failed": 3}.get(status, 3)


# -- run --------------------------------------------------------------------------------------------------------------


@app.command()
def run(
    config: ConfigArg,
    variant: Annotated[
        list[str] | None, typer.Option("--variant", "-v", help="Run only this variant (repeat).")
    ] = None,
    set_: Annotated[
        list[str] | None, typer.Option("--set", help="Override a config value: key.path=value (repeat).")
    ] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Print the plan and touch nothing.")] = False,
    isolate: Annotated[
        bool | None, typer.Option("--isolate/--no-isolate", help="Localise a failure by toggling knobs back.")
    ] = None,
    accept_new_host_key: Annotated[
        bool, typer.Option("--accept-new-host-key", help="Trust and record an SSH host key seen for the first time.")
    ] = False,
    json_out: JsonOpt = False,
) -> None:
    """Run an experiment: every variant stopped, launched, proven or diagnosed, and the box restored."""
    from campaign import config as cfg

    out = Output(json=json_out)
    loaded = cfg.load(config, set_ or [])
    exp = loaded.experiment
    planned = cfg.plan(exp, loaded.recipe, tuple(variant or ()))
    use_isolate = exp.isolate if isolate is None else isolate
    host_label = exp.host.kind if exp.host.kind == "local" else f"ssh {exp.host.host}"
    if dry_run:
        store = _store()
        from campaign.console.run import render_plan

        known = None
        if exp.host.kind == "local":
            known = store.known_good("local")
        if json_out:
            plan = {
                "experiment": exp.name,
                "host": host_label,
                "recipe": loaded.recipe.name,
                "variants": [
                    {
                        "name": p.name,
                        "knobs": p.knobs,
                        "command": p.spec.command,
                        "shell": cfg.shell_line(p.spec),
                        "env": cfg.masked_env(p.spec.env),
                        "port": p.spec.port,
                        "spec_hash": p.spec.spec_hash(),
                    }
                    for p in planned
                ],
                "matrix": exp.matrix.model_dump() if exp.matrix else None,
                "isolate": use_isolate,
                "on_failure": "diagnose, stop, relaunch the known-good and prove it (readiness + smoke)",
                "known_good": known.variant if known else None,
                "at_end": exp.at_end,
            }
            out.print_json(json.dumps(plan, indent=2))
            return
        render_plan(
            out.out,
            experiment=exp.name,
            host=host_label,
            recipe=loaded.recipe.name,
            planned=planned,
            known_good=known,
            isolate=use_isolate,
            matrix=exp.matrix.model_dump() if exp.matrix else None,
            ready_s=exp.timeouts.ready_s,
            at_end=exp.at_end,
        )
        return

    from campaign.campaign import Campaign
    from campaign.console.run import RunDisplay
    from campaign.hosts import open_host

    host = open_host(exp.host, accept_new_host_key=accept_new_host_key)
    try:
        camp = Campaign(loaded, host, _store(), only=tuple(variant or ()), isolate=isolate)
        display = RunDisplay(out.err, live=out.interactive)
        camp.emit = display
        if camp.bench_settings is not None:
            from campaign.console.bench import bench_progress

            with display.session(), bench_progress(out.err) as bar:
                display._bench = bar
                report = camp.run()
        else:
            with display.session():
                report = camp.run()
    finally:
        host.close()
    _finish(out, report)


def _finish(out: Output, report: Any) -> None:
    """Print a run's report (JSON or tables) and exit with the code its status means."""
    from campaign.console.run import render_report

    code = _exit_for(report.status)
    if out.json:
        out.print_json(json.dumps(run_summary(report, code, str(_state["runs"])), indent=2))
    else:
        render_report(out.out, report)
        out.err.print(f"report: {_state['runs']}/{report.run_id}/report.json")
    raise typer.Exit(code)


def run_summary(report: Any, exit_code: int, runs_dir: str) -> dict[str, Any]:
    """The `campaign run --json` document: the report's essentials in a stable shape."""
    attempts = []
    for a in report.attempts:
        attempts.append(
            {
                "index": a.index,
                "variant": a.variant,
                "role": a.role,
                "knobs": a.knobs,
                "outcome": a.outcome,
                "failed_phase": a.failed_phase,
                "diagnosis": (
                    {
                        "kind": a.diagnosis.kind,
                        "evidence": [e.model_dump() for e in a.diagnosis.evidence],
                        "hint": a.diagnosis.hint,
                        "confidence": a.diagnosis.confidence,
                        "fingerprint": a.diagnosis.fingerprint,
                    }
                    if a.diagnosis is not None and a.outcome == "failed"
                    else None
                ),
                "timings": a.timings.model_dump(),
                "smoke": {"passed": a.smoke.passed, "total": a.smoke.total} if a.smoke else None,
                "restore": a.restore.model_dump() if a.restore else None,
                "bench": a.bench,
                "gates": [g.model_dump() for g in a.gates],
                "spec_hash": a.spec_hash,
                "log": f"{runs_dir}/{report.run_id}/{a.log_file}" if a.log_file else None,
            }
        )
    outcomes = [r.outcome for r in report.restores]
    restore = "failed" if "failed" in outcomes else ("restored" if outcomes else "not_needed")
    return {
        "run_id": report.run_id,
        "experiment": report.experiment,
        "host": report.host,
        "status": report.status,
        "exit_code": exit_code,
        "attempts": attempts,
        "restore": {"outcome": restore, "restores": [r.model_dump() for r in report.restores]},
        "final": report.final.model_dump(),
        "attribution": report.attribution,
        "report": f"{runs_dir}/{report.run_id}/report.json",
    }


# -- host state -------------------------------------------------------------------------------------------------------


def _control(config: str, set_: list[str] | None, accept_new: bool = False) -> tuple[Any, Any, Any]:
    from campaign import config as cfg
    from campaign.hosts import open_host
    from campaign.server import ServerControl

    loaded = cfg.load(config, set_ or [])
    host = open_host(loaded.experiment.host, accept_new_host_key=accept_new)
    return loaded, host, ServerControl(host, loaded.experiment.host.workdir)


SetOpt = Annotated[list[str] | None, typer.Option("--set", help="Override a config value: key.path=value.")]


@app.command()
def status(config: ConfigArg, set_: SetOpt = None, json_out: JsonOpt = False) -> None:
    """What runs on the experiment's host now (spec, PID/PGID, uptime, health) and its known-good."""
    from campaign.readiness import health_status

    out = Output(json=json_out)
    loaded, host, control = _control(config, set_)
    try:
        cur = control.current()
        running = None
        health = None
        if cur is not None:
            alive = control.alive(cur.pgid)
            health = health_status(host.url(cur.port), loaded.recipe.health_path) if alive else None
            running = {**cur.__dict__, "alive": alive, "uptime_s": round(time.time() - cur.started_at, 1)}
        kg = _store().known_good(host.name)
        doc = {
            "host": host.name,
            "running": running,
            "health": health,
            "known_good": (
                {
                    "variant": kg.variant,
                    "spec_hash": kg.spec_hash,
                    "run_id": kg.run_id,
                    "attempt": kg.attempt,
                    "proven_at": kg.proven_at,
                }
                if kg
                else None
            ),
        }
    finally:
        host.close()
    if json_out:
        out.print_json(json.dumps(doc, indent=2))
    else:
        from campaign.console.run import render_status

        render_status(out.out, doc)


@app.command()
def stop(config: ConfigArg, set_: SetOpt = None, json_out: JsonOpt = False) -> None:
    """Stop what campaign runs on the experiment's host (TERM, grace, KILL) and verify the box is clean."""
    out = Output(json=json_out)
    loaded, host, control = _control(config, set_)
    try:
        rep = control.stop(None, grace_s=loaded.experiment.timeouts.stop_grace_s)
    finally:
        host.close()
    if json_out:
        out.print_json(json.dumps(rep.__dict__))
    else:
        out.out.print(f"{host.name}: {rep.detail}" + (f" in {rep.seconds:.1f} s" if rep.stopped else ""))


@app.command()
def restore(config: ConfigArg, set_: SetOpt = None, json_out: JsonOpt = False) -> None:
    """Relaunch the host's known-good and prove it again (readiness + smoke)."""
    from campaign.campaign import restore_now
    from campaign.console.run import RunDisplay

    out = Output(json=json_out)
    loaded, host, _ = _control(config, set_)
    try:
        display = RunDisplay(out.err, live=out.interactive)
        with display.session():
            report = restore_now(loaded, host, _store(), on_event=display)
    finally:
        host.close()
    _finish(out, report)


# -- the store --------------------------------------------------------------------------------------------------------


@app.command()
def runs(
    failures: Annotated[bool, typer.Option("--failures", help="Group failures by fingerprint instead.")] = False,
    limit: Annotated[int, typer.Option("--limit", "-n", help="At most this many runs.")] = 30,
    json_out: JsonOpt = False,
) -> None:
    """A table of past runs (newest first), or failures grouped by fingerprint."""
    out = Output(json=json_out)
    store = _store()
    if failures:
        groups = store.failures()
        if json_out:
            out.print_json(json.dumps([g.__dict__ for g in groups], indent=2))
        else:
            from campaign.console.run import render_failures

            render_failures(out.out, groups)
        return
    rows = store.list_runs(limit=limit)
    if json_out:
        out.print_json(json.dumps([r.__dict__ for r in rows], indent=2))
    else:
        from campaign.console.run import render_runs

        render_runs(out.out, rows)


@app.command()
def show(
    run_ref: Annotated[str, typer.Argument(metavar="RUN", help="A run id, a unique prefix, or `last`.")],
    json_out: JsonOpt = False,
) -> None:
    """One run's report: attempts, diagnoses, restores, attribution, final state."""
    out = Output(json=json_out)
    report = _store().load_report(run_ref)
    if json_out:
        out.print_json(report.model_dump_json(indent=2))
    else:
        from campaign.console.run import render_report

        render_report(out.out, report)


@app.command()
def logs(
    run_ref: Annotated[str, typer.Argument(metavar="RUN", help="A run id, a unique prefix, or `last`.")],
    attempt: Annotated[int | None, typer.Option("--attempt", "-a", help="Attempt index (default: the last).")] = None,
    follow: Annotated[bool, typer.Option("--follow", "-f", help="Tail the live log on the host.")] = False,
) -> None:
    """A stored attempt's server log; --follow tails the live one on the host."""
    store = _store()
    report = store.load_report(run_ref)
    if not report.attempts:
        raise UsageError(f"run {report.run_id} has no attempts")
    if attempt is None:
        att = report.attempts[-1]
    else:
        matches = [a for a in report.attempts if a.index == attempt]
        if not matches:
            raise UsageError(
                f"run {report.run_id} has no attempt {attempt}",
                hint="attempts: " + ", ".join(f"{a.index} ({a.variant})" for a in report.attempts),
            )
        att = matches[0]
    if not follow:
        if att.log_file is None:
            raise StoreError(
                f"attempt {att.index} of {report.run_id} has no stored log (it is still running?)",
                hint="use --follow to tail it on the host",
            )
        path = store.root / report.run_id / att.log_file
        sys.stdout.buffer.write(path.read_bytes())
        return
    _follow(report, att)


def _follow(report: Any, att: Any) -> None:
    from campaign import config as cfg
    from campaign.hosts import open_host
    from campaign.readiness import LogFollower
    from campaign.server import ServerControl

    resolved = Path(_state["runs"]) / report.run_id / "experiment.yaml"
    loaded = cfg.load(str(resolved))
    host = open_host(loaded.experiment.host)
    try:
        control = ServerControl(host, loaded.experiment.host.workdir)
        follower = LogFollower(host, f"{att.remote_dir}/server.log")
        while True:
            for _n, line in follower.poll():
                sys.stdout.write(line + "\n")
            sys.stdout.flush()
            pgid = att.pgid
            if pgid is None or not control.alive(pgid):
                for _n, line in follower.flush():
                    sys.stdout.write(line + "\n")
                break
            time.sleep(0.2)
    except KeyboardInterrupt:
        pass
    finally:
        host.close()


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
    from campaign.diagnose import diagnose_file

    out = Output(json=json_out)
    d = diagnose_file(logfile, server=server, exit_code=exit_code)
    if json_out:
        out.print_json(d.model_dump_json(indent=2))
    else:
        from campaign.console.diagnosis import render_diagnosis

        render_diagnosis(out.out, d)


def _ints(text: str | None) -> list[int] | None:
    if not text:
        return None
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise UsageError(f"--concurrency {text!r}: expected integers separated by commas, e.g. 1,8,32") from None


def _floats(text: str | None) -> list[float] | None:
    if not text:
        return None
    try:
        return [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise UsageError(f"--rate {text!r}: expected numbers separated by commas, e.g. 2,8") from None


@app.command()
def bench(
    url: Annotated[str, typer.Argument(help="The server's base URL, e.g. http://127.0.0.1:30000")],
    concurrency: Annotated[str | None, typer.Option("--concurrency", "-c", help="Levels, e.g. 1,8,32,128.")] = None,
    rate: Annotated[str | None, typer.Option("--rate", help="Poisson request rates (req/s), e.g. 2,8.")] = None,
    requests: Annotated[int, typer.Option("--requests", "-n", help="Measured requests per level.")] = 64,
    warmup: Annotated[int, typer.Option("--warmup", help="Warm-up requests per level.")] = 2,
    repeats: Annotated[int, typer.Option("--repeats", help="Repeat each level this many times.")] = 1,
    prompts: Annotated[str, typer.Option("--prompts", help="arithmetic or random.")] = "arithmetic",
    input_len: Annotated[int, typer.Option("--input-len", help="Random prompts: input words.")] = 128,
    output_len: Annotated[int, typer.Option("--output-len", help="Random prompts: output tokens.")] = 128,
    max_tokens: Annotated[int | None, typer.Option("--max-tokens", help="max_tokens per request.")] = None,
    model: Annotated[str | None, typer.Option("--model", help="Model name (default: the first /v1/models).")] = None,
    max_error_rate: Annotated[float, typer.Option("--max-error-rate", help="A level past this fails.")] = 0.01,
    seed: Annotated[int, typer.Option("--seed", help="Prompt seed.")] = 0,
    ramp: Annotated[float, typer.Option("--ramp", help="Spread stream starts over this many s.")] = 0.0,
    json_out: JsonOpt = False,
) -> None:
    """Load a server with streaming chat requests and report TTFT, ITL, TPOT, E2E, throughput and errors."""
    from pydantic import ValidationError

    from campaign.bench import BenchSettings, run_bench

    out = Output(json=json_out)
    raw: dict[str, Any] = {
        "requests": requests,
        "warmup": warmup,
        "repeats": repeats,
        "prompts": prompts,
        "input_len": input_len,
        "output_len": output_len,
        "max_error_rate": max_error_rate,
        "seed": seed,
        "ramp_s": ramp,
    }
    if max_tokens is not None:
        raw["max_tokens"] = max_tokens
    if concurrency:
        raw["concurrency"] = _ints(concurrency)
    if rate:
        raw["request_rate"] = _floats(rate)
    try:
        settings = BenchSettings.model_validate(raw)
    except ValidationError as e:
        err = e.errors(include_url=False)[0]
        field = ".".join(str(p) for p in err["loc"]) or "options"
        msg = str(err["msg"]).removeprefix("Value error, ")
        raise UsageError(f"{field}: {msg}") from None
    from campaign.console.bench import bench_progress, render_bench

    with bench_progress(out.err) as progress:
        result = run_bench(url, settings, model=model, progress=progress)
    if json_out:
        out.print_json(result.model_dump_json(indent=2))
    else:
        render_bench(out.out, result)
    raise typer.Exit(0 if result.passed else 1)


@app.command()
def compare(
    run_refs: Annotated[list[str], typer.Argument(metavar="RUN...", help="Two or more runs (ids, prefixes, last).")],
    md: Annotated[bool, typer.Option("--md", help="Markdown on stdout.")] = False,
    csv: Annotated[bool, typer.Option("--csv", help="CSV on stdout.")] = False,
    json_out: JsonOpt = False,
    plot_file: Annotated[Path | None, typer.Option("--plot", help="Draw throughput and p90 latency to a PNG.")] = None,
    all_fields: Annotated[bool, typer.Option("--all", help="Show every config field, not only differences.")] = False,
) -> None:
    """Compare runs: config and environment differences, metrics side by side with significance and ratios."""
    from campaign.compare import compare as do_compare
    from campaign.compare import to_csv, to_json, to_markdown

    if sum([md, csv, json_out]) > 1:
        raise UsageError("choose one of --md, --csv, --json")
    out = Output(json=json_out)
    store = _store()
    reports = [store.load_report(r) for r in run_refs]
    c = do_compare(reports, all_fields=all_fields)
    if plot_file is not None:
        from campaign.plot import plot

        written = plot(c, plot_file)
        out.err.print(f"plot: {written}")
    if json_out:
        out.print_json(to_json(c))
    elif md:
        sys.stdout.write(to_markdown(c))
    elif csv:
        sys.stdout.write(to_csv(c))
    else:
        from campaign.console.compare import render_comparison

        render_comparison(out.out, c)


# -- entry point ------------------------------------------------------------------------------------------------------


def main() -> None:
    """Console-script entry: run the app, mapping CampaignError to its exit code and a one-line message."""
    debug = "--debug" in sys.argv[1:]
    try:
        rc = app(standalone_mode=False)
    except CampaignError as e:
        if debug:
            import traceback

            traceback.print_exc()
        from campaign.console import Output as _Out
        from campaign.console.run import render_error

        render_error(_Out().err, e.message, e.hint)
        sys.exit(e.exit_code)
    except typer.Exit as e:
        sys.exit(e.exit_code)
    except KeyboardInterrupt:
        sys.stderr.write("interrupted\n")
        sys.exit(130)
    except Exception as e:  # a bug of ours: say so plainly; the traceback (never with locals) only under --debug
        import click

        if isinstance(e, click.exceptions.ClickException):
            e.show()
            sys.exit(e.exit_code)
        if isinstance(e, click.exceptions.Abort):
            sys.stderr.write("aborted\n")
            sys.exit(130)
        if debug:
            import traceback

            traceback.print_exc()
        else:
            sys.stderr.write(f"internal error: {type(e).__name__}: {e}\n(run with --debug for the traceback)\n")
        sys.exit(70)
    sys.exit(rc if isinstance(rc, int) else 0)


if __name__ == "__main__":
    main()
