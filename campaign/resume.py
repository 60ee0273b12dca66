"""Resuming a run: which of its planned variants are done, and whether a stored run may be continued at all.

A variant is done when the run holds a finished attempt of it (passed, failed, or skipped as a known failure) with
the same spec hash as the plan renders now; an attempt cut short (``interrupted``) is not, so the variant in flight
when the run stopped runs again, and a variant whose file changed since runs with its new spec. Retries of a
transient failure are one variant's attempts: its last attempt is its outcome.
"""

from __future__ import annotations

from collections.abc import Sequence

from campaign.config import PlannedVariant
from campaign.errors import UsageError
from campaign.records import Attempt, RunReport


def finished(att: Attempt) -> bool:
    """Whether an attempt ran to its end (a verdict), or was skipped on purpose as a known failure."""
    return att.outcome in ("passed", "failed") or att.known_failure is not None


def done_variants(report: RunReport, planned: Sequence[PlannedVariant]) -> dict[str, Attempt]:
    """The last finished attempt of each planned variant the run already holds, by variant name."""
    wanted = {pv.name: pv.spec.spec_hash() for pv in planned}
    done: dict[str, Attempt] = {}
    for att in report.attempts:
        if att.role == "variant" and finished(att) and wanted.get(att.variant) == att.spec_hash:
            done[att.variant] = att
    return done


def remaining(report: RunReport, planned: Sequence[PlannedVariant]) -> list[str]:
    """The planned variants a resume of ``report`` still has to run, in plan order."""
    done = done_variants(report, planned)
    return [pv.name for pv in planned if pv.name not in done]


def check_resumable(report: RunReport, experiment: str, host: str, planned: Sequence[PlannedVariant]) -> list[str]:
    """The variants left to run; ``UsageError`` when ``report`` is another experiment's, another host's, or done."""
    if report.experiment != experiment:
        raise UsageError(
            f"run {report.run_id} is of experiment {report.experiment}, not {experiment}",
            hint=f"resume it with its own file ({report.config_path or report.experiment})",
        )
    if report.host != host:
        raise UsageError(f"run {report.run_id} ran on {report.host}, not on {host}")
    left = remaining(report, planned)
    if not left:
        raise UsageError(
            f"run {report.run_id} has nothing left to run: every planned variant has a finished attempt",
            hint="start a new run without --resume",
        )
    return left
