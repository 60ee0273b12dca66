"""The command line's root: the typer app, its shared options, and the map from what a command raises to an exit code.

Exit codes (``campaign.outcome``, docs/reliability.md): 0 all good; 1 some variant failed and the box was restored; 2
bad usage or config, or the host locked by another campaign; 3 the box could not be restored (or was left dirty or
unproven); 70 a bug of ours; 128+N a signal N interrupted it (130 SIGINT, 143 SIGTERM, 129 SIGHUP). A usage error
(unknown command or option, a missing argument, a bad value) prints the usage line and "Try 'campaign ... --help'";
any other error prints one line and a hint (and, under --json, a JSON document on stdout); tracebacks only with
--debug (never with locals). ``--json`` documents are records' JSON.
"""

from __future__ import annotations

import sys
import traceback
from pathlib import Path
from typing import Annotated, Any

import typer
from typer.core import TyperGroup

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
        from campaign.version import version

        sys.stdout.write(f"campaign {version()}\n")
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
        bool, typer.Option("--version", "-V", callback=_show_version, is_eager=True, help="Print the version and exit.")
    ] = False,
) -> None:
    from campaign.operations import Operations

    ctx.obj = Operations(runs=runs_dir)


def ops_of(ctx: typer.Context) -> Any:
    """The ``Operations`` the root callback made (typed ``Any`` here so the import stays lazy: --help stays fast)."""
    return ctx.find_root().obj


def finish_run(ctx: typer.Context, out: Output, report: Any) -> None:
    """Print a run's report (its summary as JSON, or tables) and exit with the code its status means."""
    from campaign.console.run import render_report
    from campaign.operations import exit_code
    from campaign.records import RunSummary

    code = exit_code(report)
    runs = str(ops_of(ctx).runs)
    if out.json:
        out.print_json(RunSummary.of(report, code, runs).model_dump_json(indent=2))
    else:
        render_report(out.out, report)
        out.err.print(f"report: {runs}/{report.run_id}/report.json")
    if report.status == "interrupted":
        out.err.print(f"{report.signal or 'interrupted'}: {report.final.detail}", markup=False, highlight=False)
    raise typer.Exit(code)


def main() -> None:
    """Console-script entry: usage errors exit 2 (typer prints the usage and the help hint); see ``_Group``."""
    app(prog_name="campaign")
