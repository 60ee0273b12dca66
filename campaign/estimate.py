"""A plan's cost: the estimated duration of a run from the stored timings of the same recipe on the same host.

Each planned variant costs what its exact spec cost before (the median of its stored attempts, plus the restore that
followed a failed one); a spec never run costs the median attempt of the recipe on that host. A run adds its
overhead (connecting, the host's facts, the flag check, putting the box back at the end): the median of stored runs'
duration minus the attempts counted above, of the same experiment where there are such runs. The figures come from
``Timings.attempt_s``, the whole attempt measured on our clock; older attempts without it count the sum of their
steps.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from datetime import datetime

from campaign.config import PlannedVariant
from campaign.records import Attempt, PlanEstimate, RunReport, VariantCost


def attempt_cost(att: Attempt) -> float | None:
    """Seconds one stored attempt took (None when it recorded no timing, or was cut short: skipped, interrupted).

    An interrupted attempt keeps the timings measured up to its end, but a part of an attempt is not its cost.
    """
    if att.outcome == "interrupted":
        return None
    t = att.timings
    if t.attempt_s is not None:
        return t.attempt_s
    steps = [t.stop_s, t.launch_to_ready_s, t.smoke_s, t.bench_s]
    return sum(s for s in steps if s is not None) if any(s is not None for s in steps) else None


def run_duration(report: RunReport) -> float | None:
    """Seconds from a run's start to its end, from its ISO timestamps (None while it has no end)."""
    if report.ended_at is None:
        return None
    try:
        return (datetime.fromisoformat(report.ended_at) - datetime.fromisoformat(report.started_at)).total_seconds()
    except ValueError:
        return None


def _variant_costs(report: RunReport) -> list[tuple[str, float]]:
    """(spec hash, cost) of each finished variant attempt: its own time plus the restore a failure led to."""
    by_index = {a.index: a for a in report.attempts}
    out: list[tuple[str, float]] = []
    for a in report.attempts:
        if a.role == "restore" or a.outcome not in ("passed", "failed"):
            continue
        cost = attempt_cost(a)
        if cost is None:
            continue
        if a.role == "relaunch" and out and out[-1][0] == a.spec_hash:
            # A further launch of the same variant (bench.launches): part of that variant's cost.
            out[-1] = (a.spec_hash, out[-1][1] + cost)
            continue
        if a.restore is not None and a.restore.attempt is not None and a.restore.attempt in by_index:
            cost += attempt_cost(by_index[a.restore.attempt]) or 0.0
        out.append((a.spec_hash, cost))
    return out


def estimate(
    reports: Sequence[RunReport],
    planned: Sequence[PlannedVariant],
    *,
    experiment: str,
    deadline_s: float | None = None,
) -> PlanEstimate:
    """The cost of running ``planned``, from ``reports`` (stored runs of the same recipe on the same host)."""
    by_spec: dict[str, list[float]] = {}
    every: list[float] = []
    overheads: dict[bool, list[float]] = {True: [], False: []}
    for report in reports:
        costs = _variant_costs(report)
        for spec_hash, cost in costs:
            by_spec.setdefault(spec_hash, []).append(cost)
            every.append(cost)
        duration = run_duration(report)
        if duration is not None and costs and report.status in ("passed", "failed"):
            overheads[report.experiment == experiment].append(max(0.0, duration - sum(c for _h, c in costs)))
    recipe_median = statistics.median(every) if every else None
    same = overheads[True] or overheads[False]
    overhead = statistics.median(same) if same else 0.0
    variants: list[VariantCost] = []
    for pv in planned:
        seen = by_spec.get(pv.spec.spec_hash())
        if seen:
            variants.append(VariantCost(variant=pv.name, seconds=round(statistics.median(seen), 2), basis="spec"))
        elif recipe_median is not None:
            variants.append(VariantCost(variant=pv.name, seconds=round(recipe_median, 2), basis="recipe"))
        else:
            variants.append(VariantCost(variant=pv.name, seconds=None, basis="none"))
    known = [v.seconds for v in variants if v.seconds is not None]
    total = round(overhead + sum(known), 1) if known else None
    past: list[str] = []
    if deadline_s is not None:
        spent = overhead
        for v in variants:
            spent += v.seconds or 0.0
            if spent > deadline_s:
                past.append(v.variant)
    return PlanEstimate(
        trials=len(planned),
        total_s=total,
        overhead_s=round(overhead, 2),
        runs_used=len(reports),
        variants=variants,
        deadline_s=deadline_s,
        past_deadline=past,
    )


def variant_cost(reports: Sequence[RunReport], pv: PlannedVariant, experiment: str) -> float | None:
    """The estimated seconds of one variant (None when nothing stored says)."""
    return estimate(reports, [pv], experiment=experiment).variants[0].seconds
