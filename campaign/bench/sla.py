"""The SLA search: which load to measure next, and whether a measured level met the SLOs. Pure: no I/O.

``Bisection`` keeps the bracket between the highest load that met every SLO and the lowest that missed one. It
asks for ``low`` first (a variant that misses there has no answer), then ``high`` (one that meets it there needs no
search), then the middle of the bracket until the bracket is one step wide or the trial budget is spent. Latency
grows with load on every server a campaign measures, so one crossing is assumed; a noisy level can still move the
answer by a step, which the test of the search allows.
"""

from __future__ import annotations

import math

from campaign.records import LevelResult, SlaResult, SlaSettings, SlaTrial


def violations(level: LevelResult, sla: SlaSettings) -> list[str]:
    """The SLOs ``level`` missed, worded for a person (empty when it met them all)."""
    out: list[str] = []
    if level.error_rate > sla.max_error_rate:
        out.append(f"error rate {100 * level.error_rate:.1f}% > {100 * sla.max_error_rate:g}%")
    for name, bound in sla.slo.items():
        value = level.metric(name)
        if value is None:
            out.append(f"no {name} measured")
        elif value > bound:
            unit = "" if name == "error_rate" else " ms"
            out.append(f"{name} {value:.4g}{unit} > {bound:g}{unit}")
    return out


class Bisection:
    """The loads an SLA search measures, one at a time: ``next()`` until None, each answered with ``record``."""

    def __init__(self, sla: SlaSettings) -> None:
        self.sla = sla
        self.met: float | None = None
        self.missed: float | None = None
        self.trials: list[SlaTrial] = []
        self._levels: dict[float, LevelResult] = {}
        #: The most levels it will measure.
        self.bound = sla.trial_bound()

    def next(self) -> float | None:
        """The load to measure next, or None when the search is over."""
        sla = self.sla
        if len(self.trials) >= self.bound:
            return None
        if not self.trials:
            return sla.low
        if self.met is None:
            return None  # even the lowest load missed an SLO
        if len(self.trials) == 1:
            return sla.high if sla.high > sla.low else None
        if self.missed is None or self.missed - self.met <= sla.resolution:
            return None
        mid = (self.met + self.missed) / 2
        if sla.over == "concurrency":
            mid = float(math.floor(mid))
        return mid if self.met < mid < self.missed else None

    def record(self, value: float, level: LevelResult) -> SlaTrial:
        """Take the level measured at ``value``; returns the trial (met or not, and why)."""
        why = violations(level, self.sla)
        trial = SlaTrial(value=value, label=level.label, met=not why, violations=why)
        self.trials.append(trial)
        self._levels[value] = level
        if trial.met:
            self.met = value if self.met is None else max(self.met, value)
        else:
            self.missed = value if self.missed is None else min(self.missed, value)
        return trial

    def result(self) -> SlaResult:
        """What the search found so far."""
        sla = self.sla
        best = self._levels.get(self.met) if self.met is not None else None
        if self.met is None:
            converged = True
        elif self.missed is None:
            converged = self.met >= sla.high
        else:
            converged = self.missed - self.met <= sla.resolution
        return SlaResult(
            over=sla.over,
            slo=dict(sla.slo),
            max_error_rate=sla.max_error_rate,
            trials=list(self.trials),
            max=self.met,
            missed=self.missed,
            goodput=best.output_throughput if best is not None else None,
            request_goodput=best.request_throughput if best is not None else None,
            converged=converged,
        )
