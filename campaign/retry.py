"""Retry policy: each failure classed transient or deterministic, and the per-variant budget with its backoff.

Each kind's class and whether it damages the box are data: ``class``, ``transient_in_phases`` and ``damaging`` of the
kind in ``campaign/signatures.yaml`` (its one home); this module only reads them.

A transient failure is one the same launch can pass on its next try: a port still in TIME_WAIT or briefly held,
NCCL timing out while its ranks meet, a health endpoint that flaps after the ready line, bench requests cut or
failed on a server whose log shows no failure. Those are retried up to the
experiment's ``retry.budget`` times, waiting ``backoff_s`` and then ``factor`` times longer each time. Everything
else (bad arguments, a capture that breaks isolation, a knob not applied, an OOM at a given memory fraction, wrong
answers, a gate missed, a start that stalls before its ready line, a death nobody can name) fails the same way
again: it is attempted once, and a later run that plans the same spec on the same host skips it (``known failure``)
unless ``--retry-known`` is given. A lost SSH connection never reaches this module: the host package reconnects
inside a call, and a host lost for good ends the run.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from campaign.config import RetryConfig
from campaign.diagnosis.signatures import Signatures, signatures

FailureClass = Literal["transient", "deterministic"]


def failure_class(kind: str | None, failed_phase: str | None, sigs: Signatures | None = None) -> FailureClass:
    """Whether a failure of diagnosis ``kind`` in ``failed_phase`` may pass on a retry of the same launch.

    The class is the kind's ``class`` in the rules file (``transient_in_phases`` names phases where a deterministic
    kind is transient: a start that timed out after its ready line is health flapping). ``bench_errors`` is transient
    there: a stream cut on the path, which the next launch passes; a stored failure keeps no error counts, and classing
    it deterministic would skip a good spec in every later run after one cut connection. A kind the rules do not
    declare (a stored report from another build) is deterministic.
    """
    info = (sigs or signatures()).kinds.get(kind or "")
    if info is None:
        return "deterministic"
    if info.failure_class == "transient" or (failed_phase is not None and failed_phase in info.transient_phases):
        return "transient"
    return "deterministic"


def needs_proven_box(kind: str | None, sigs: Signatures | None = None) -> bool:
    """Whether, after a failure of ``kind``, the box must be proven (the known-good relaunched) before going on.

    The kind's ``damaging`` in the rules file (a GPU left in an error state, memory held by a zombie, the kernel's OOM
    killer at work); a failure with no diagnosis, or of a kind the rules do not declare, may have done anything.
    """
    info = (sigs or signatures()).kinds.get(kind or "")
    return info is None or info.damaging


@dataclass(frozen=True)
class RetryBudget:
    """The retries one variant may still take, and the wait before each."""

    config: RetryConfig
    used: int = 0

    @property
    def left(self) -> int:
        """Retries not yet taken."""
        return max(0, self.config.budget - self.used)

    def delay_s(self) -> float:
        """The wait before the next retry: ``backoff_s``, then ``factor`` times the previous wait."""
        return float(self.config.backoff_s * self.config.factor**self.used)

    def spend(self) -> RetryBudget:
        """The budget after one more retry."""
        return RetryBudget(self.config, self.used + 1)
