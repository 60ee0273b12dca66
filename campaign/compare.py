"""Compare runs: what differs in configuration and environment, and bench metrics side by side with significance.

``compare(reports)`` is pure: run reports in, a ``Comparison`` out. Each variant of each run is one column, with
one sample per launch: a ``bench.launches`` run relaunches every variant (role ``relaunch``) and each launch's
level result, its in-launch repeats averaged, is one sample. Every column is compared with one reference column:
``baseline`` (``(run id, variant)``) when given, else the same-named variant of the first run, else the first
column. With two launches or more on both sides a Welch t-test gives a p-value, and the p-values of every tested
cell of the comparison are adjusted together (Holm by default, or Benjamini–Hochberg), so a comparison of many
metrics at many levels does not find differences by chance; the ratio of means comes with its 95% interval. A
cell that does not pass is "not significant" before any ratio is shown; one that passes with a ratio within the
minimum effect of 1 (5% by default) is "negligible"; with one launch it is "untested".
Configuration rows show only what differs unless ``all_fields``; environment fields (host, GPU, driver, server
version, kernel hash) are flagged when they differ, since a metric change across machines is not a variant's doing.

The document, its table layout and its plain renderings (Markdown, long-format CSV, JSON) are in
``campaign.comparison``.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Sequence
from typing import Any, Literal

from campaign.comparison import (
    ALPHA,
    CONFIDENCE,
    MIN_EFFECT,
    Column,
    Comparison,
    FieldRow,
    MetricCell,
    MetricRow,
    Observation,
    ProfileColumn,
    Series,
    SeriesPoint,
    metric_key,
)
from campaign.errors import StoreError, UsageError
from campaign.records import (
    METRICS,
    PLOTTED_METRICS,
    SHOWN_METRICS,
    Attempt,
    BenchResult,
    LevelResult,
    RunReport,
    unit_of,
)
from campaign.redaction import mask_env
from campaign.statistics import (
    Correction,
    adjust,
    drift_variance,
    mean,
    mean_interval,
    ratio_interval,
    ratio_test_across_runs,
    welch,
)

#: Environment fields always shown (others only when they differ, or with all_fields).
KEY_ENVIRONMENT = ("host", "gpu", "driver", "server_version", "kernel_hash")


# ---------------------------------------------------------------------------------------------------------------------
# Building the comparison


def _flatten(prefix: str, value: Any, out: dict[str, str]) -> None:
    if isinstance(value, dict):
        for k in sorted(value):
            _flatten(f"{prefix}.{k}" if prefix else str(k), value[k], out)
    elif isinstance(value, list) and prefix.endswith("command"):
        out[prefix] = shlex.join(str(v) for v in value)
    elif isinstance(value, list):
        out[prefix] = json.dumps(value, separators=(",", ":"))
    else:
        out[prefix] = "" if value is None else str(value)


def _config_of(report: RunReport, attempt: Attempt) -> dict[str, str]:
    fields: dict[str, str] = {"experiment": report.experiment, "recipe": attempt.spec.recipe}
    _flatten("knobs", attempt.knobs, fields)
    spec = attempt.spec.model_dump()
    spec["env"] = mask_env(attempt.spec.env)
    _flatten("spec", {k: v for k, v in spec.items() if k in ("command", "env", "workdir", "port")}, fields)
    fields["spec_hash"] = attempt.spec_hash or attempt.spec.spec_hash()
    if attempt.bench is not None:
        _flatten("bench", attempt.bench.settings.model_dump(mode="json"), fields)
    return fields


def _rows(per_column: list[dict[str, str]], all_fields: bool, always: Sequence[str] = ()) -> list[FieldRow]:
    names: list[str] = []
    for d in per_column:
        names += [k for k in d if k not in names]
    rows = []
    for name in names:
        values = [d.get(name) for d in per_column]
        differs = len(set(values)) > 1
        if all_fields or differs or name in always:
            rows.append(FieldRow(field=name, values=values, differs=differs))
    return rows


def _launch_value(level: LevelResult, metric: str) -> float | None:
    """One launch's value of a metric at a level: its repeats averaged (the pooled value without repeats)."""
    values = [v for r in level.repeats if (v := r.metrics.get(metric)) is not None]
    return mean(values) if values else level.metric(metric)


def _samples(benches: Sequence[BenchResult], label: str, metric: str) -> list[float]:
    out = []
    for b in benches:
        lv = next((lv for lv in b.levels if lv.label == label), None)
        if lv is not None and (v := _launch_value(lv, metric)) is not None:
            out.append(v)
    return out


def _cell(
    samples: list[float],
    ref: list[float] | None,
    confidence: float,
    controls: Sequence[tuple[list[float], list[float]]] = (),
) -> MetricCell:
    """A cell before correction: its value, ratio and interval, and the raw p-value when it can be tested.

    ``controls``, for a cell compared with a column of another run: the samples of configurations both runs hold
    unchanged, (this run's, the other run's). Their differences are the box's drift between the runs, which the
    launches of one run cannot show, so it is added to the test (``ratio_test_across_runs``).
    """
    cell = MetricCell(value=mean(samples) if samples else None, samples=samples)
    if ref is None:
        cell.verdict = "baseline"
        return cell
    if not samples or not ref:
        return cell
    base = mean(ref)
    cell.ratio = cell.value / base if base != 0 else (1.0 if cell.value == 0 else None)  # type: ignore[operator]
    if len(samples) < 2 or len(ref) < 2:
        cell.verdict = "untested"
        return cell
    if len(set(samples) | set(ref)) == 1:
        cell.verdict = "equal"  # e.g. no errors anywhere: nothing to test, and no test spent on it
        return cell
    if controls:
        drift, pairs = drift_variance(controls)
        across = ratio_test_across_runs(samples, ref, drift, pairs, confidence)
        if across is not None:
            cell.p_value, cell.drift_sd = across.p, across.drift_sd
            cell.ci_low, cell.ci_high = across.interval.low, across.interval.high
            return cell
    cell.p_value = welch(samples, ref).p
    interval = ratio_interval(samples, ref, confidence)
    if interval is not None:
        cell.ci_low, cell.ci_high = interval.low, interval.high
    return cell


class _Group:
    """The attempts of one variant of one run: its first attempt and its relaunches."""

    def __init__(self, report: RunReport, first: Attempt) -> None:
        self.report = report
        self.attempts = [first]

    @property
    def first(self) -> Attempt:
        return self.attempts[0]

    @property
    def benches(self) -> list[BenchResult]:
        return [a.bench for a in self.attempts if a.bench is not None]

    def column(self, key: str) -> Column:
        failed = next((a for a in self.attempts if a.outcome != "passed"), None)
        shown = failed or self.first
        restore = next((r for r in self.report.restores if r.attempt == shown.index), None)
        first = self.first
        gates = f"{sum(g.passed for g in first.gates)}/{len(first.gates)} passed" if first.gates else ""
        benches = self.benches
        return Column(
            key=key,
            run_id=self.report.run_id,
            variant=first.variant,
            attempt=first.index,
            launches=len(benches),
            outcome=shown.outcome,
            failed_phase=shown.failed_phase,
            failure_kind=shown.diagnosis.kind if shown.diagnosis and shown.outcome == "failed" else None,
            restore=restore.outcome if restore else None,
            bench_passed=all(b.passed for b in benches) if benches else None,
            gates=gates,
        )


def _groups(report: RunReport) -> list[_Group]:
    groups: list[_Group] = []
    for attempt in report.attempts:
        if attempt.role == "relaunch":
            # A fleet runs the baseline on every host: a relaunch belongs to the same variant on its own host.
            owner = next(
                (g for g in reversed(groups) if (g.first.variant, g.first.host) == (attempt.variant, attempt.host)),
                None,
            )
            if owner is not None:
                owner.attempts.append(attempt)
                continue
        elif attempt.role != "variant":
            continue
        groups.append(_Group(report, attempt))
    return groups


def _references(columns: list[Column], baseline: tuple[str, str] | None) -> list[int | None]:
    """For each column, the index of the column it is compared with."""
    if baseline is not None:
        found = [i for i, c in enumerate(columns) if (c.run_id, c.variant) == baseline]
        if not found:
            have = ", ".join(f"{c.run_id}:{c.variant}" for c in columns)
            raise UsageError(f"--baseline {baseline[0]}:{baseline[1]} is not among the compared columns ({have})")
        return [None if i == found[0] else found[0] for i in range(len(columns))]
    first_run = columns[0].run_id
    refs: list[int | None] = []
    for i, c in enumerate(columns):
        same = next((j for j, o in enumerate(columns) if o.run_id == first_run and o.variant == c.variant), None)
        if same is not None and same != i:
            refs.append(same)
        else:
            refs.append(None if i == 0 else 0)
    return refs


def compare(
    reports: Sequence[RunReport],
    *,
    all_fields: bool = False,
    alpha: float = ALPHA,
    baseline: tuple[str, str] | None = None,
    correction: Correction = "holm",
    confidence: float = CONFIDENCE,
    min_effect: float = MIN_EFFECT,
) -> Comparison:
    """Compare the variants of ``reports``, each with its reference column (see the module docstring)."""
    if not reports:
        raise StoreError("nothing to compare: no runs given")
    groups = [g for r in reports for g in _groups(r)]
    if not groups:
        raise StoreError("the runs hold no variant attempts to compare")
    columns: list[Column] = []
    seen: dict[str, int] = {}
    for g in groups:
        key = f"{g.report.run_id}/{g.first.variant}"
        seen[key] = seen.get(key, 0) + 1
        columns.append(g.column(key if seen[key] == 1 else f"{key}#{seen[key]}"))
    refs = _references(columns, baseline)
    for col, ref in zip(columns, refs, strict=True):
        col.reference = None if ref is None else columns[ref].key

    benches = [g.benches for g in groups]
    controls = _controls(groups, refs)
    labels: list[str] = []
    for launches in benches:
        for b in launches:
            labels += [lv.label for lv in b.levels if lv.label not in labels]
    metrics: list[MetricRow] = []
    for label in labels:
        for metric in SHOWN_METRICS:
            samples = [_samples(launches, label, metric) for launches in benches]
            cells = [
                _cell(
                    samples[i],
                    None if ref is None else samples[ref],
                    confidence,
                    [(samples[a], samples[b]) for a, b in controls[i]],
                )
                for i, ref in enumerate(refs)
            ]
            metrics.append(
                MetricRow(
                    level=label,
                    metric=metric,
                    unit=unit_of(metric),
                    key=metric_key(metric),
                    higher_is_better=METRICS[metric],
                    cells=cells,
                )
            )
    _decide(metrics, correction, alpha, min_effect)
    return Comparison(
        runs=[r.run_id for r in reports],
        columns=columns,
        config=_rows([_config_of(g.report, g.first) for g in groups], all_fields),
        environment=_rows([_environment_of(g.report) for g in groups], all_fields, always=KEY_ENVIRONMENT),
        metrics=metrics,
        series=_series(columns, benches, confidence),
        all_fields=all_fields,
        alpha=alpha,
        confidence=confidence,
        correction=correction,
        min_effect=min_effect,
        observations=[o for g in groups for o in _observations(g)],
        profiles=profile_columns(columns, groups),
    )


def _controls(groups: Sequence[_Group], refs: Sequence[int | None]) -> list[list[tuple[int, int]]]:
    """For each column compared with a column of another run, the pairs (a, b) that measure the drift between them.

    A pair is one configuration in both runs, unchanged: a in the column's run, b in its reference's, the same
    launch spec and the same environment (host, GPU, driver, server version, kernel hash, ...), neither the compared
    columns themselves. A pair whose environment differs (new kernels, another driver) is not drift but a change, so
    it is not used. Within one run, or with no such pair, the list is empty.
    """
    # The clock offset is measured afresh each run and says nothing about what runs.
    same = [
        (g.first.spec_hash, sorted((k, v) for k, v in _environment_of(g.report).items() if k != "clock_offset_s"))
        for g in groups
    ]
    out: list[list[tuple[int, int]]] = []
    for i, ref in enumerate(refs):
        pairs: list[tuple[int, int]] = []
        if ref is not None and groups[i].report.run_id != groups[ref].report.run_id:
            for a, ga in enumerate(groups):
                if a == i or ga.report.run_id != groups[i].report.run_id:
                    continue
                for b, gb in enumerate(groups):
                    if b != ref and gb.report.run_id == groups[ref].report.run_id and same[a] == same[b]:
                        pairs.append((a, b))
        out.append(pairs)
    return out


def _decide(rows: list[MetricRow], correction: Correction, alpha: float, min_effect: float) -> None:
    """Adjust the p-values of every tested cell together, then mark each significant or not, and its direction.

    A cell whose adjusted p-value is below ``alpha`` but whose ratio is within ``min_effect`` of 1 is
    ``negligible``: a difference too small to be what the variant changed rather than the box's own drift.
    """
    tested = [(row, cell) for row in rows for cell in row.cells if cell.p_value is not None]
    adjusted = adjust([cell.p_value for _, cell in tested if cell.p_value is not None], correction)
    for (row, cell), p in zip(tested, adjusted, strict=True):
        cell.p_adjusted = p
        if p < alpha and cell.ratio is not None and abs(cell.ratio - 1.0) < min_effect:
            cell.verdict = "negligible"
        elif p < alpha:
            cell.verdict = "significant"
            up = (cell.ratio or 0.0) > 1.0
            cell.direction = "better" if up == row.higher_is_better else "worse"
        else:
            cell.verdict = "not significant"


def _environment_of(report: RunReport) -> dict[str, str]:
    env: dict[str, str] = {"host": report.host}
    _flatten("", report.environment.model_dump(mode="json"), env)
    return env


def _series(columns: list[Column], benches: list[list[BenchResult]], confidence: float) -> list[Series]:
    series = []
    for col, launches in zip(columns, benches, strict=True):
        if not launches:
            continue
        levels = [lv for b in launches[:1] for lv in b.levels]
        axis: Literal["concurrency", "request_rate"] = (
            "concurrency" if all(lv.load.concurrency is not None for lv in levels) else "request_rate"
        )
        points = []
        for lv in levels:
            values: dict[str, float | None] = {}
            errors: dict[str, float | None] = {}
            for metric in PLOTTED_METRICS:
                samples = _samples(launches, lv.label, metric)
                values[metric_key(metric)] = mean(samples) if samples else None
                errors[metric_key(metric)] = mean_interval(samples, confidence)
            points.append(SeriesPoint(x=lv.load.x, label=lv.label, values=values, errors=errors))
        series.append(Series(key=col.key, axis=axis, points=points))
    return series


def _observations(group: _Group) -> list[Observation]:
    out = []
    for attempt in group.attempts:
        for lv in attempt.bench.levels if attempt.bench else []:
            for rep in lv.repeats:
                for metric, value in rep.metrics.items():
                    out.append(
                        Observation(
                            run=group.report.run_id,
                            variant=attempt.variant,
                            launch=attempt.launch,
                            repeat=rep.repeat,
                            level=lv.label,
                            concurrency=lv.load.concurrency,
                            request_rate=lv.load.request_rate,
                            metric=metric,
                            unit=unit_of(metric),
                            value=value,
                        )
                    )
    return out


def profile_columns(columns: Sequence[Column], groups: Sequence[_Group]) -> list[ProfileColumn]:
    """The profile of each column whose variant was profiled (its first launch), for the Profile section."""
    out = []
    for col, group in zip(columns, groups, strict=True):
        p = group.first.profile
        if p is None:
            continue
        measured = p.status == "measured"
        out.append(
            ProfileColumn(
                key=col.key,
                status=p.status,
                note=p.note,
                level=p.level,
                device=p.device,
                scope=p.scope,
                **{k: getattr(p, k) if measured else None for k in ("total_ms", "attention_ms", "gemm_ms", "other_ms")},
                attention_share=p.attention_share,
                gemm_share=p.gemm_share,
                other_share=p.other_share,
            )
        )
    return out
