"""The outcome of a command as a number and a document: exit codes of run reports and errors.

0    every variant passed
1    some variant failed, and the box was put back on its known-good (or is clean)
2    bad usage or config, or the host is locked by another campaign (nothing was touched)
3    the box could not be restored, was left dirty, or is left unproven (a host lost for good included)
128+N  a signal interrupted the run: 130 SIGINT, 143 SIGTERM, 129 SIGHUP (the report says what was left)
"""

from __future__ import annotations

import signal

from campaign.errors import CampaignError, ConfigError, LockHeld
from campaign.records import ErrorDocument, RunReport


def exit_code(report: RunReport) -> int:
    """The exit code a run's report means."""
    if report.status == "interrupted":
        try:
            return 128 + int(signal.Signals[report.signal]) if report.signal else 130
        except KeyError:
            return 130
    return {"passed": 0, "failed": 1, "restore_failed": 3}.get(report.status, 3)


def error_doc(err: CampaignError) -> ErrorDocument:
    """The ``--json`` document of a command that ended with ``err`` (nothing else goes to stdout then)."""
    doc = ErrorDocument(error=err.message, kind=type(err).__name__, hint=err.hint, exit_code=err.exit_code)
    if isinstance(err, LockHeld):
        doc.holder = err.holder
    if isinstance(err, ConfigError):
        doc.file, doc.line, doc.field = err.file, err.line, err.field
    return doc
