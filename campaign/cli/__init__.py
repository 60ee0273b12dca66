"""The command line: each command parses, makes one call to ``campaign.operations``, and hands the value to the console.

``app`` (the root, its shared options and the error → exit code map) is in ``app``; the commands are registered, in
the order ``--help`` lists them, by ``control`` (run, status, stop, restore), ``history`` (runs, doctor, show, logs)
and ``analysis`` (diagnose, bench, compare). Exit codes are in ``app``'s docstring and docs/exit-codes.md.
"""

# The order of these imports is the order --help lists the commands in.
# isort: off
from campaign.cli.app import app, main
from campaign.cli import control, history, analysis, tune
# isort: on

__all__ = ["analysis", "app", "control", "history", "main", "tune"]
