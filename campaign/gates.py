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

An SLA search's answer is gated the same way, with no level: ``sla.max`` (the highest load that met every SLO),
``sla.goodput`` (output tokens per second there) and ``sla.request_goodput``, e.g.
``{metric: sla.max, min: 16}`` or ``{metric: sla.goodput, min_ratio: 0.95}``. A search that found no load within
the SLOs fails such a gate.
"""

from __future__ import annotations

from collections.abc import Sequence

from campaign.records import SLA_METRICS, BenchResult, Gate, GateResult, LevelResult


def _levels(result: BenchResult, gate: Gate) -> list[LevelResult]:
    if gate.concurrency is not None:
        lv = result.level(concurrency=gate.concurrency)
        return [lv] if lv else []
    if gate.request_rate is not None:
        lv = result.level(request_rate=gate.request_rate)
        return [lv] if lv else []
    return list(result.levels)


def _check_sla(gate: Gate, result: BenchResult, baseline: BenchResult | None) -> GateResult:
    if result.sla is None:
        return GateResult(name=gate.label, passed=False, detail=f"{gate.metric}: the bench ran no SLA search")
    value = result.sla_metric(gate.metric)
    if value is None:
        return GateResult(name=gate.label, passed=False, detail=f"{gate.metric}: no load met the SLOs")
    base = baseline.sla_metric(gate.metric) if baseline is not None and baseline.sla is not None else None
    return _bounds(gate, gate.label, f"{gate.metric} = {value:.4g}", value, baseline is not None, base, "search")


def _bounds(
    gate: Gate, name: str, note: str, value: float, have_baseline: bool, base: float | None, what: str
) -> GateResult:
    problems: list[str] = []
    notes: list[str] = [note]
    if gate.min is not None and value < gate.min:
        problems.append(f"below the minimum {gate.min:g}")
    if gate.max is not None and value > gate.max:
        problems.append(f"above the maximum {gate.max:g}")
    if gate.min_ratio is not None or gate.max_ratio is not None:
        if not have_baseline:
            notes.append("ratio not checked: no baseline")
        elif base is None:
            problems.append(f"the baseline has no {what} to compare with")
        else:
            if base == 0:
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


def _check_one(gate: Gate, level: LevelResult, baseline: BenchResult | None) -> GateResult:
    name = gate.label if gate.concurrency or gate.request_rate else f"{gate.label} [{level.label}]"
    value = level.metric(gate.metric)
    if value is None:
        return GateResult(name=name, passed=False, detail=f"{level.label}: no {gate.metric} measured (no successes)")
    base: float | None = None
    if baseline is not None:
        base_lv = baseline.level(concurrency=level.load.concurrency, request_rate=level.load.request_rate)
        base = base_lv.metric(gate.metric) if base_lv is not None else None
        if base_lv is not None and base is None:
            base = 0.0
    note = f"{level.label}: {gate.metric} = {value:.4g}"
    return _bounds(gate, name, note, value, baseline is not None, base, f"{level.label} level")


def check_gates(result: BenchResult, baseline: BenchResult | None, gates: Sequence[Gate]) -> list[GateResult]:
    """Check each gate against ``result`` (and ``baseline`` for ratio bounds); one GateResult per gate and level."""
    out: list[GateResult] = []
    for gate in gates:
        if gate.metric in SLA_METRICS:
            out.append(_check_sla(gate, result, baseline))
            continue
        levels = _levels(result, gate)
        if not levels:
            where = f"c={gate.concurrency}" if gate.concurrency is not None else f"rate={gate.request_rate:g}/s"
            out.append(GateResult(name=gate.label, passed=False, detail=f"the bench ran no {where} level"))
            continue
        out.extend(_check_one(gate, lv, baseline) for lv in levels)
    return out
