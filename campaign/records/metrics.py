"""The bench metrics: one table (name, unit, direction, shown, plotted) that every reader derives from, and the
latency summary a level's timing metrics are read from.

A metric is named as a gate, an SLO or a comparison asks for it: ``output_throughput``, ``ttft.p90``. Adding one is
one row of ``TABLE`` (its value measured as a field of ``LevelResult`` or a ``LatencyStats`` group, and pooled per
repeat by ``campaign.bench.load``); gates, SLOs, ``compare`` (its rows, units, CSV and JSON keys), the plot and the
console read the row. The rows' order is the order ``compare`` shows them in.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from pydantic import BaseModel


@dataclass(frozen=True)
class Metric:
    """One bench metric: its name, the unit it is measured in, and how a comparison treats it."""

    name: str
    #: ``tok/s``, ``req/s``, ``ms`` or ``fraction``.
    unit: str
    higher_is_better: bool
    #: A row of ``campaign compare`` by default (every metric is in its CSV and JSON).
    shown: bool = False
    #: A panel of ``campaign compare --plot``.
    plotted: bool = False


def _latency(group: str, shown: Sequence[str] = (), plotted: Sequence[str] = ()) -> list[Metric]:
    """The four statistics of one latency group (milliseconds, lower is better)."""
    return [
        Metric(f"{group}.{s}", "ms", False, shown=s in shown, plotted=s in plotted)
        for s in ("mean", "median", "p90", "p99")
    ]


#: Every metric a level measures, in the order ``compare`` shows them.
TABLE: tuple[Metric, ...] = (
    Metric("output_throughput", "tok/s", True, shown=True, plotted=True),
    Metric("input_throughput", "tok/s", True),
    Metric("total_throughput", "tok/s", True),
    Metric("request_throughput", "req/s", True, shown=True),
    *_latency("ttft", shown=("median", "p90"), plotted=("median",)),
    *_latency("itl", shown=("median",)),
    *_latency("tpot", shown=("median",), plotted=("median",)),
    *_latency("e2e", shown=("median", "p90"), plotted=("p90",)),
    Metric("error_rate", "fraction", False, shown=True),
)
#: The table by name.
BY_NAME: dict[str, Metric] = {m.name: m for m in TABLE}
#: Metric names a gate or a comparison can ask a level for, and whether higher is better.
METRICS: dict[str, bool] = {m.name: m.higher_is_better for m in TABLE}
#: The metrics ``compare`` shows per level, in order.
SHOWN_METRICS: tuple[str, ...] = tuple(m.name for m in TABLE if m.shown)
#: The metrics a plot draws, one panel each.
PLOTTED_METRICS: tuple[str, ...] = tuple(m.name for m in TABLE if m.plotted)

#: What a gate can ask of an SLA search (all higher-is-better): the highest load that met every SLO, and the
#: output tokens / requests per second measured there (goodput).
SLA_METRICS: dict[str, bool] = {"sla.max": True, "sla.goodput": True, "sla.request_goodput": True}


def unit_of(metric: str) -> str:
    """The unit a metric of ``TABLE`` is measured in (``""`` for a name the table does not hold)."""
    row = BY_NAME.get(metric)
    return row.unit if row is not None else ""


class LatencyStats(BaseModel):
    """Summary of one latency metric over a level, in milliseconds (None when there were no samples)."""

    count: int = 0
    mean: float | None = None
    median: float | None = None
    p90: float | None = None
    p99: float | None = None
    std: float | None = None
    min: float | None = None
    max: float | None = None

    @classmethod
    def of(cls, samples_s: Sequence[float]) -> LatencyStats:
        """Summarise samples given in seconds."""
        if not samples_s:
            return cls()
        ms = sorted(s * 1000.0 for s in samples_s)
        mean = math.fsum(ms) / len(ms)
        var = math.fsum((v - mean) ** 2 for v in ms) / len(ms)
        return cls(
            count=len(ms),
            mean=mean,
            median=percentile(ms, 50),
            p90=percentile(ms, 90),
            p99=percentile(ms, 99),
            std=math.sqrt(var),
            min=ms[0],
            max=ms[-1],
        )


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile of already sorted values, linearly interpolated (numpy's default method)."""
    if not sorted_values:
        raise ValueError("percentile of no values")
    pos = (len(sorted_values) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)
