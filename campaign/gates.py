"""Bench gates: what a variant's measurement must show before it may become known-good.

A gate names a metric (``output_throughput``, ``request_throughput``, ``error_rate`` or a latency statistic such
as ``ttft.p90``), optionally a level (``concurrency: 32`` or ``request_rate: 8``; without one it applies to every
level), and bounds: absolute (``min`` / ``max``) and relative to the baseline's same level (``min_ratio`` /
``max_ratio``). Written in YAML::

    gates:
      - {metric: output_throughput, concurrency: 32, min_ratio: 0.97}
      - {metric: error_rate, max: 0.01}

A ratio bound cannot be checked without a baseline (the baseline itself is being measured); it then passes and
says so in its detail. A level the result lacks fails the gate.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict, model_validator

from campaign.records import GateResult

if TYPE_CHECKING:
    from campaign.bench import BenchResult, LevelResult


class Gate(BaseModel):
    """One requirement on a bench result."""

    model_config = ConfigDict(extra="forbid")

    metric: str
    concurrency: int | None = None
    request_rate: float | None = None
    min: float | None = None
    max: float | None = None
    min_ratio: float | None = None
    max_ratio: float | None = None
    name: str | None = None

    @model_validator(mode="after")
    def _valid(self) -> Gate:
        from campaign.bench import METRICS

        if self.metric not in METRICS:
            known = ", ".join(METRICS)
            raise ValueError(f"unknown gate metric {self.metric!r}; known: {known}")
        if all(v is None for v in (self.min, self.max, self.min_ratio, self.max_ratio)):
            raise ValueError("a gate needs at least one of min, max, min_ratio, max_ratio")
        if self.concurrency is not None and self.request_rate is not None:
            raise ValueError("a gate selects a level by concurrency or by request_rate, not both")
        return self

    @property
    def label(self) -> str:
        """The gate's name, or one made from what it checks: ``output_throughput@c=32 >= 0.97x baseline``."""
        if self.name:
            return self.name
        where = ""
        if self.concurrency is not None:
            where = f"@c={self.concurrency}"
        elif self.request_rate is not None:
            where = f"@rate={self.request_rate:g}/s"
        bounds = []
        if self.min is not None:
            bounds.append(f">= {self.min:g}")
        if self.max is not None:
            bounds.append(f"<= {self.max:g}")
        if self.min_ratio is not None:
            bounds.append(f">= {self.min_ratio:g}x baseline")
        if self.max_ratio is not None:
            bounds.append(f"<= {self.max_ratio:g}x baseline")
        return f"{self.metric}{where} " + ", ".join(bounds)


def _levels(result: BenchResult, gate: Gate) -> list[LevelResult]:
    if gate.concurrency is not None:
        lv = result.level(concurrency=gate.concurrency)
        return [lv] if lv else []
    if gate.request_rate is not None:
        lv = result.level(request_rate=gate.request_rate)
        return [lv] if lv else []
    return list(result.levels)


def _check_one(gate: Gate, level: LevelResult, baseline: BenchResult | None) -> GateResult:
    name = gate.label if gate.concurrency or gate.request_rate else f"{gate.label} [{level.label}]"
    value = level.metric(gate.metric)
    if value is None:
        return GateResult(name=name, passed=False, detail=f"{level.label}: no {gate.metric} measured (no successes)")
    problems: list[str] = []
    notes: list[str] = [f"{level.label}: {gate.metric} = {value:.4g}"]
    if gate.min is not None and value < gate.min:
        problems.append(f"below the minimum {gate.min:g}")
    if gate.max is not None and value > gate.max:
        problems.append(f"above the maximum {gate.max:g}")
    if gate.min_ratio is not None or gate.max_ratio is not None:
        base_lv = None
        if baseline is not None:
            base_lv = baseline.level(concurrency=level.load.concurrency, request_rate=level.load.request_rate)
        if baseline is None:
            notes.append("ratio not checked: no baseline")
        elif base_lv is None:
            problems.append(f"the baseline has no {level.label} level to compare with")
        else:
            base = base_lv.metric(gate.metric)
            if base is None or base == 0:
                problems.append(f"the baseline's {gate.metric} is {base!r}; no ratio")
            else:
                ratio = value / base
                notes.append(f"baseline {base:.4g}, ratio {ratio:.3f}x")
                if gate.min_ratio is not None and ratio < gate.min_ratio:
                    problems.append(f"ratio below {gate.min_ratio:g}x")
                if gate.max_ratio is not None and ratio > gate.max_ratio:
                    problems.append(f"ratio above {gate.max_ratio:g}x")
    detail = "; ".join(notes + problems)
    return GateResult(name=name, passed=not problems, detail=detail)


def check_gates(result: BenchResult, baseline: BenchResult | None, gates: Sequence[Gate]) -> list[GateResult]:
    """Check each gate against ``result`` (and ``baseline`` for ratio bounds); one GateResult per gate and level."""
    out: list[GateResult] = []
    for gate in gates:
        levels = _levels(result, gate)
        if not levels:
            where = f"c={gate.concurrency}" if gate.concurrency is not None else f"rate={gate.request_rate:g}/s"
            out.append(GateResult(name=gate.label, passed=False, detail=f"the bench ran no {where} level"))
            continue
        out.extend(_check_one(gate, lv, baseline) for lv in levels)
    return out
