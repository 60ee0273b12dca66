"""Retry policy: each failure classed transient or deterministic, and the per-variant budget with its backoff.

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

FailureClass = Literal["transient", "deterministic"]

#: Kinds whose cause passes with time whatever the phase. ``bench_errors`` is a bench whose requests failed on a server
#: whose log shows no failure (a server that died or logged a fatal error gets that kind instead): most often a
#: stream cut on the path (a proxy, a forward), which the next launch passes. The class goes by kind alone (a stored
#: failure keeps no error counts), and a retry of a server that fails its requests every time costs only the budget,
#: while classing it deterministic would skip a good spec in every later run after one cut connection.
TRANSIENT_KINDS = frozenset({"port_in_use", "nccl_error", "bench_errors"})
#: A start that timed out after its ready line (waiting only for health) is health flapping; before it, a slow or
#: stuck load that will be as slow next time.
_FLAPPING_PHASES = frozenset({"ready"})


def failure_class(kind: str | None, failed_phase: str | None) -> FailureClass:
    """Whether a failure of diagnosis ``kind`` in ``failed_phase`` may pass on a retry of the same launch."""
    if kind in TRANSIENT_KINDS:
        return "transient"
    if kind == "startup_timeout" and failed_phase in _FLAPPING_PHASES:
        return "transient"
    return "deterministic"


#: Failures after which the box itself may be damaged (a GPU left in an error state, memory held by a zombie, the
#: kernel's OOM killer at work): the next launch needs the known-good proven again first (``restore: when_needed``).
_DAMAGING_KINDS = frozenset({"illegal_memory_access", "host_oom_killed", "gpu_oom", "nccl_error", "unknown"})


def needs_proven_box(kind: str | None) -> bool:
    """Whether, after a failure of ``kind``, the box must be proven (the known-good relaunched) before going on."""
    return kind is None or kind in _DAMAGING_KINDS


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
