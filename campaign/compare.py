"""Compare runs: what differs in configuration and environment, and bench metrics side by side.

``compare(reports)`` is pure: run reports in, a ``Comparison`` out. Each benched or failed variant attempt of each
run is one column; the first column is the baseline every ratio is taken against. With repeats on both sides a
Welch t-test over the per-repeat values comes before any ratio, and a difference it cannot tell from noise is
reported as "not significant" (with one repeat the ratio is shown and marked untested). Configuration rows show
only what differs unless ``all_fields``; environment fields (host, GPU, driver, server version, kernel hash) are
flagged when they differ, since a metric change across machines is not a variant's doing. Each column carries its
outcome, failure kind and restore outcome.

``Comparison.sections()`` lays the comparison out as titled tables of plain strings, and every renderer (Markdown,
CSV, JSON here; rich in campaign/console/compare.py) draws those same strings, so all formats agree cell by cell.
"""

from __future__ import annotations

import csv
import io
import json
import math
import re
import shlex
from collections.abc import Sequence
from typing import Any, Literal

from pydantic import BaseModel, Field

from campaign.bench import METRICS, BenchResult, LevelResult
from campaign.errors import StoreError
from campaign.records import Attempt, RunReport

ALPHA = 0.05
#: The metrics shown per level, in order.
SHOWN_METRICS = (
    "output_throughput",
    "request_throughput",
    "ttft.median",
    "ttft.p90",
    "itl.median",
    "tpot.median",
    "e2e.median",
    "e2e.p90",
    "error_rate",
)
#: Environment fields always shown (others only when they differ, or with all_fields).
KEY_ENVIRONMENT = ("host", "gpu", "driver", "server_version", "kernel_hash")
_SECRET = re.compile(r"TOKEN|KEY|SECRET|PASSWORD|PASSWD|CREDENTIAL", re.IGNORECASE)


class Column(BaseModel):
    """One variant attempt of one run."""

    key: str
    run_id: str
    variant: str
    attempt: int
    outcome: str
    failed_phase: str | None = None
    failure_kind: str | None = None
    restore: str | None = None
    bench_passed: bool | None = None
    gates: str = ""


class FieldRow(BaseModel):
    """One configuration or environment field across the columns (None where a column lacks it)."""

    field: str
    values: list[str | None]
    differs: bool


class MetricCell(BaseModel):
    """One column's value of a metric at a level, and how it stands against the baseline column."""

    value: float | None = None
    ratio: float | None = None
    p_value: float | None = None
    samples: int = 0
    #: ``baseline``, ``significant``, ``not significant``, ``untested`` (too few repeats), ``n/a``.
    verdict: Literal["baseline", "significant", "not significant", "untested", "n/a"] = "n/a"


class MetricRow(BaseModel):
    """A metric at one level, across the columns."""

    level: str
    metric: str
    higher_is_better: bool
    cells: list[MetricCell]


class SeriesPoint(BaseModel):
    """One level of one column, for a plot."""

    x: float
    label: str
    output_throughput: float | None
    e2e_p90_ms: float | None


class Series(BaseModel):
    """One column's levels in order, for a plot; ``axis`` is what x means."""

    key: str
    axis: Literal["concurrency", "request_rate"]
    points: list[SeriesPoint] = Field(default_factory=list)


class Section(BaseModel):
    """A titled table of plain strings: the one layout all renderers draw."""

    title: str
    header: list[str]
    rows: list[list[str]]


class Comparison(BaseModel):
    """Runs compared: columns, configuration and environment differences, metrics, and plot series."""

    runs: list[str]
    columns: list[Column]
    config: list[FieldRow]
    environment: list[FieldRow]
    metrics: list[MetricRow]
    series: list[Series]
    all_fields: bool = False
    alpha: float = ALPHA

    def sections(self) -> list[Section]:
        """The comparison as titled tables of strings, in display order."""
        keys = [c.key for c in self.columns]
        out = [
            Section(
                title="Variants",
                header=["column", "outcome", "failed phase", "failure kind", "restore", "bench", "gates"],
                rows=[
                    [
                        c.key,
                        c.outcome,
                        c.failed_phase or "",
                        c.failure_kind or "",
                        c.restore or "",
                        "" if c.bench_passed is None else ("passed" if c.bench_passed else "failed"),
                        c.gates,
                    ]
                    for c in self.columns
                ],
            )
        ]
        out.append(
            Section(
                title="Configuration" if self.all_fields else "Configuration (differences)",
                header=["field", *keys],
                rows=[[r.field, *(v if v is not None else "-" for v in r.values)] for r in self.config],
            )
        )
        out.append(
            Section(
                title="Environment",
                header=["field", *keys, "differs"],
                rows=[
                    [r.field, *(v if v is not None else "-" for v in r.values), "DIFFERS" if r.differs else ""]
                    for r in self.environment
                ],
            )
        )
        header = ["level", "metric", keys[0]] if keys else ["level", "metric"]
        for k in keys[1:]:
            header += [k, f"{k} vs {keys[0]}"]
        rows: list[list[str]] = []
        for m in self.metrics:
            row = [m.level, _metric_label(m.metric)]
            for i, cell in enumerate(m.cells):
                row.append(_fmt_value(cell.value, m.metric))
                if i > 0:
                    row.append(_fmt_verdict(cell))
            rows.append(row)
        out.append(Section(title="Metrics", header=header, rows=rows))
        return out


def _metric_label(metric: str) -> str:
    units = {"output_throughput": "tok/s", "request_throughput": "req/s", "error_rate": ""}
    unit = units.get(metric, "ms")
    return f"{metric} ({unit})" if unit else metric


def _fmt_value(value: float | None, metric: str) -> str:
    if value is None:
        return "-"
    if metric == "error_rate":
        return f"{100 * value:.2f}%"
    return f"{value:.4g}" if abs(value) < 1000 else f"{value:.0f}"


def _fmt_verdict(cell: MetricCell) -> str:
    if cell.verdict == "n/a" or cell.ratio is None:
        return "-"
    if cell.verdict == "not significant":
        return f"not significant (p={cell.p_value:.2f})"
    if cell.verdict == "untested":
        return f"{cell.ratio:.3f}x (untested, n={cell.samples})"
    return f"{cell.ratio:.3f}x (p={cell.p_value:.3f})"


# ---------------------------------------------------------------------------------------------------------------------
# Statistics


def _betacf(a: float, b: float, x: float) -> float:
    # Continued fraction of the incomplete beta function, evaluated by the modified Lentz method.
    tiny = 1e-300
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 300):
        m2 = 2 * m
        aa = m * (b - m) * x / ((qam + m2) * (a + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        h *= d * c
        aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        delta = d * c
        h *= delta
        if abs(delta - 1.0) < 1e-12:
            break
    return h


def _betainc(a: float, b: float, x: float) -> float:
    """The regularised incomplete beta function I_x(a, b)."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    ln_front = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    if x < (a + 1.0) / (a + b + 2.0):
        return math.exp(ln_front) * _betacf(a, b, x) / a
    return 1.0 - math.exp(ln_front) * _betacf(b, a, 1.0 - x) / b


def welch_p_value(a: Sequence[float], b: Sequence[float]) -> float:
    """Two-sided p-value of Welch's t-test that ``a`` and ``b`` have the same mean (each needs two values)."""
    if len(a) < 2 or len(b) < 2:
        raise ValueError("Welch's test needs at least two values on each side")
    ma, mb = math.fsum(a) / len(a), math.fsum(b) / len(b)
    va = math.fsum((x - ma) ** 2 for x in a) / (len(a) - 1)
    vb = math.fsum((x - mb) ** 2 for x in b) / (len(b) - 1)
    sa, sb = va / len(a), vb / len(b)
    if sa + sb == 0.0:
        return 1.0 if ma == mb else 0.0
    t = (ma - mb) / math.sqrt(sa + sb)
    df = (sa + sb) ** 2 / ((sa**2 / (len(a) - 1) if sa else 0.0) + (sb**2 / (len(b) - 1) if sb else 0.0))
    return _betainc(df / 2.0, 0.5, df / (df + t * t))


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
    spec["env"] = {k: ("***" if _SECRET.search(k) else v) for k, v in attempt.spec.env.items()}
    _flatten("spec", {k: v for k, v in spec.items() if k in ("command", "env", "workdir", "port")}, fields)
    fields["spec_hash"] = attempt.spec_hash or attempt.spec.spec_hash()
    if attempt.bench is not None:
        _flatten("bench", attempt.bench.get("settings", {}), fields)
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


def _bench_of(attempt: Attempt) -> BenchResult | None:
    if attempt.bench is None:
        return None
    try:
        return BenchResult.model_validate(attempt.bench)
    except ValueError as e:
        raise StoreError(f"attempt {attempt.index} ({attempt.variant}) has an unreadable bench record: {e}") from e


def _cell(level: LevelResult | None, base: LevelResult | None, metric: str, is_base: bool, alpha: float) -> MetricCell:
    if level is None:
        return MetricCell()
    value = level.metric(metric)
    samples = [v for r in level.repeats if (v := r.metrics.get(metric)) is not None]
    cell = MetricCell(value=value, samples=len(samples))
    if is_base:
        cell.verdict = "baseline"
        return cell
    if base is None or value is None:
        return cell
    base_value = base.metric(metric)
    if base_value is None:
        return cell
    base_samples = [v for r in base.repeats if (v := r.metrics.get(metric)) is not None]
    if base_value != 0:
        cell.ratio = value / base_value
    elif value == 0:
        cell.ratio = 1.0
    if len(samples) >= 2 and len(base_samples) >= 2:
        cell.p_value = welch_p_value(samples, base_samples)
        cell.verdict = "significant" if cell.p_value < alpha else "not significant"
    else:
        cell.verdict = "untested"
    return cell


def compare(reports: Sequence[RunReport], *, all_fields: bool = False, alpha: float = ALPHA) -> Comparison:
    """Compare the variant attempts of ``reports``; the first attempt of the first run is the baseline."""
    if not reports:
        raise StoreError("nothing to compare: no runs given")
    columns: list[Column] = []
    configs: list[dict[str, str]] = []
    envs: list[dict[str, str]] = []
    benches: list[BenchResult | None] = []
    seen: set[str] = set()
    for report in reports:
        restores = {r.attempt: r for r in report.restores if r.attempt is not None}
        for attempt in report.attempts:
            if attempt.role != "variant":
                continue
            key = f"{report.run_id}/{attempt.variant}"
            if key in seen:
                key = f"{key}#{attempt.index}"
            seen.add(key)
            bench = _bench_of(attempt)
            restore = restores.get(attempt.index)
            gates = f"{sum(g.passed for g in attempt.gates)}/{len(attempt.gates)} passed" if attempt.gates else ""
            columns.append(
                Column(
                    key=key,
                    run_id=report.run_id,
                    variant=attempt.variant,
                    attempt=attempt.index,
                    outcome=attempt.outcome,
                    failed_phase=attempt.failed_phase,
                    failure_kind=attempt.diagnosis.kind if attempt.diagnosis and attempt.outcome == "failed" else None,
                    restore=restore.outcome if restore else None,
                    bench_passed=bench.passed if bench else None,
                    gates=gates,
                )
            )
            configs.append(_config_of(report, attempt))
            env: dict[str, str] = {"host": report.host}
            _flatten("", report.environment, env)
            envs.append(env)
            benches.append(bench)
    if not columns:
        raise StoreError("the runs hold no variant attempts to compare")

    levels: list[tuple[str, LevelResult]] = []  # (label, first seen) in order of appearance
    for b in benches:
        for lv in b.levels if b else []:
            if lv.label not in [label for label, _ in levels]:
                levels.append((lv.label, lv))
    by_col = [{lv.label: lv for lv in b.levels} if b else {} for b in benches]
    metrics: list[MetricRow] = []
    for label, _ in levels:
        base = by_col[0].get(label)
        for metric in SHOWN_METRICS:
            cells = [_cell(col.get(label), base, metric, i == 0, alpha) for i, col in enumerate(by_col)]
            metrics.append(MetricRow(level=label, metric=metric, higher_is_better=METRICS[metric], cells=cells))

    series = []
    for col, b in zip(columns, benches, strict=True):
        if b is None:
            continue
        axis: Literal["concurrency", "request_rate"] = (
            "concurrency" if all(lv.load.concurrency is not None for lv in b.levels) else "request_rate"
        )
        series.append(
            Series(
                key=col.key,
                axis=axis,
                points=[
                    SeriesPoint(
                        x=lv.load.x, label=lv.label, output_throughput=lv.output_throughput, e2e_p90_ms=lv.e2e.p90
                    )
                    for lv in b.levels
                ],
            )
        )
    return Comparison(
        runs=[r.run_id for r in reports],
        columns=columns,
        config=_rows(configs, all_fields),
        environment=_rows(envs, all_fields, always=KEY_ENVIRONMENT),
        metrics=metrics,
        series=series,
        all_fields=all_fields,
        alpha=alpha,
    )


# ---------------------------------------------------------------------------------------------------------------------
# Renderers: plain strings


def _md_cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def to_markdown(c: Comparison) -> str:
    """The comparison as Markdown: one heading and one pipe table per section."""
    parts = [f"# Comparison: {', '.join(c.runs)}", ""]
    for s in c.sections():
        parts += [f"## {s.title}", ""]
        if not s.rows:
            parts += ["(none)", ""]
            continue
        parts.append("| " + " | ".join(_md_cell(h) for h in s.header) + " |")
        parts.append("|" + "|".join(" --- " for _ in s.header) + "|")
        parts += ["| " + " | ".join(_md_cell(v) for v in row) + " |" for row in s.rows]
        parts.append("")
    return "\n".join(parts)


def to_csv(c: Comparison) -> str:
    """The comparison as CSV: per section a header row whose first cell is the section title, its rows, a blank line."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    for i, s in enumerate(c.sections()):
        if i:
            w.writerow([])
        w.writerow([s.title, *s.header])
        for row in s.rows:
            w.writerow([s.title, *row])
    return buf.getvalue()


def to_json(c: Comparison) -> str:
    """The comparison as JSON: the structured values (raw numbers) and the rendered ``tables``."""
    doc = c.model_dump(mode="json")
    doc["tables"] = [s.model_dump() for s in c.sections()]
    return json.dumps(doc, indent=2) + "\n"
