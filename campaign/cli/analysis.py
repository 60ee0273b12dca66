"""Commands that judge and measure: diagnose a log, bench a server (or search an SLA), compare runs."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from campaign.cli.app import JsonOpt, app, ops_of
from campaign.console import Output


@app.command()
def diagnose(
    logfile: Annotated[Path, typer.Argument(help="A server log file.")],
    server: Annotated[
        str | None,
        typer.Option("--server", help="The recipe (sglang, vllm, ... or a recipe file): its ready marker and flags."),
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
        result = ops_of(ctx).bench(url, options, model=model, progress=progress, output=output, export=export_requests)
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
    c = ops_of(ctx).compare(
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
