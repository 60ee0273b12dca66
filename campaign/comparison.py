"""The comparison document: its columns, field rows and metric cells, laid out as tables and rendered as text.

``Comparison`` is what ``campaign.compare.compare`` returns and what ``campaign compare --json`` prints.
``Comparison.sections()`` lays it out as titled tables of plain strings, and the Markdown, JSON (``tables``) and
rich (campaign/console/compare.py) renderings draw those same strings, so all formats agree cell by cell.
``to_csv`` writes the measurements in long form instead: one observation a row (run, variant, launch, repeat,
level, metric, unit, value), numbers as numbers. Units are in the JSON keys (``ttft_median_ms``).
"""

from __future__ import annotations

import csv
import io
from typing import Literal

from pydantic import BaseModel, Field, computed_field

from campaign.records import unit_of
from campaign.statistics import Correction

ALPHA = 0.05
CONFIDENCE = 0.95
#: The smallest change a verdict calls significant, as a fraction of the reference (criterion's noise threshold):
#: launch-to-launch drift of a few percent is real but is not what a variant changed, and an A/A run shows it.
MIN_EFFECT = 0.05
CORRECTION_NAMES: dict[str, str] = {"holm": "Holm", "bh": "Benjamini-Hochberg", "none": "no correction"}


def metric_key(metric: str) -> str:
    """A metric's name with its unit, as a JSON key: ``ttft_median_ms``, ``output_throughput_tok_s``."""
    unit = unit_of(metric)
    name = metric.replace(".", "_")
    return name if unit == "fraction" else f"{name}_{unit.replace('/', '_')}"


class Column(BaseModel):
    """One variant of one run, over its launches."""

    key: str
    run_id: str
    variant: str
    #: Index of the variant's first attempt in its run.
    attempt: int
    #: Launches benched (the samples of a significance test).
    launches: int = 0
    outcome: str
    failed_phase: str | None = None
    failure_kind: str | None = None
    restore: str | None = None
    bench_passed: bool | None = None
    gates: str = ""
    #: Key of the column this one is compared with (None for a column compared with nothing).
    reference: str | None = None


class FieldRow(BaseModel):
    """One configuration or environment field across the columns (None where a column lacks it)."""

    field: str
    values: list[str | None]
    differs: bool


Verdict = Literal["baseline", "significant", "negligible", "not significant", "untested", "equal", "n/a"]


class MetricCell(BaseModel):
    """One column's value of a metric at a level, and how it stands against its reference column.

    ``verdict``: ``baseline`` (compared with nothing), ``significant`` / ``not significant`` (by the adjusted
    p-value), ``negligible`` (significant by p but the ratio is within the minimum effect of 1), ``untested``
    (fewer than two launches on a side), ``equal`` (every sample the same on both sides,
    nothing to test), ``n/a`` (no value here or in the reference).
    """

    value: float | None = None
    #: One value per launch: the launch's in-launch repeats averaged.
    samples: list[float] = Field(default_factory=list)
    ratio: float | None = None
    ci_low: float | None = None
    ci_high: float | None = None
    p_value: float | None = None
    p_adjusted: float | None = None
    verdict: Verdict = "n/a"
    #: For a significant cell: whether the change is for the better by the metric's direction.
    direction: Literal["better", "worse"] | None = None
    #: A cell compared across runs: the between-run standard deviation of its log ratio, measured on the
    #: configurations both runs hold unchanged and counted in its p-value and interval (None: not across runs, or
    #: no such configuration to measure it on).
    drift_sd: float | None = None


class MetricRow(BaseModel):
    """A metric at one level, across the columns."""

    level: str
    metric: str
    unit: str
    #: The metric's name with its unit, e.g. ``ttft_median_ms``.
    key: str
    higher_is_better: bool
    cells: list[MetricCell]


class SeriesPoint(BaseModel):
    """One level of one column, for a plot: values and 95% interval half-widths keyed by ``metric_key``."""

    x: float
    label: str
    values: dict[str, float | None]
    errors: dict[str, float | None]


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


class Observation(BaseModel):
    """One measured value: a metric of one repeat of one level of one launch of a variant."""

    run: str
    variant: str
    launch: int
    repeat: int
    level: str
    concurrency: int | None
    request_rate: float | None
    metric: str
    unit: str
    value: float | None


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
    confidence: float = CONFIDENCE
    correction: Correction = "holm"
    #: The minimum effect a significant cell must show (|ratio - 1|), as a fraction.
    min_effect: float = MIN_EFFECT
    #: Every measured value (the long-format CSV); left out of the JSON document, which carries the summaries.
    observations: list[Observation] = Field(default_factory=list, exclude=True)
    #: Each column's profile breakdown, where its run profiled (``campaign.profile``).
    profiles: list[ProfileColumn] = Field(default_factory=list)

    @computed_field  # type: ignore[prop-decorator]
    @property
    def tables(self) -> list[Section]:
        """The rendered tables (``sections()``), so the JSON document carries what the terminal shows."""
        return self.sections()

    def sections(self) -> list[Section]:
        """The comparison as titled tables of strings, in display order."""
        out = [
            Section(
                title="Variants",
                header=[
                    "column",
                    "launches",
                    "compared with",
                    "outcome",
                    "failed phase",
                    "failure kind",
                    "restore",
                    "bench",
                    "gates",
                ],
                rows=[
                    [
                        c.key,
                        str(c.launches),
                        c.reference or "",
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
        keys = [c.key for c in self.columns]
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
        header = ["level", "metric"]
        for col in self.columns:
            header.append(col.key)
            if col.reference is not None:
                header.append(f"{col.key} vs {col.reference}")
        rows: list[list[str]] = []
        for m in self.metrics:
            row = [m.level, f"{m.metric} ({m.unit})"]
            for col, cell in zip(self.columns, m.cells, strict=True):
                row.append(_fmt_value(cell.value, m.metric))
                if col.reference is not None:
                    row.append(_fmt_verdict(cell, self.confidence))
            rows.append(row)
        title = (
            f"Metrics (mean over launches; ratio with its {self.confidence:.0%} interval; "
            f"p-values adjusted: {CORRECTION_NAMES[self.correction]}, alpha {self.alpha:g}, "
            f"minimum effect {self.min_effect:.0%})"
        )
        out.append(Section(title=title, header=header, rows=rows))
        out += profile_sections(self.profiles)
        return out


def _fmt_value(value: float | None, metric: str) -> str:
    if value is None:
        return "-"
    if metric == "error_rate":
        return f"{100 * value:.2f}%"
    return f"{value:.4g}" if abs(value) < 1000 else f"{value:.0f}"


def _fmt_verdict(cell: MetricCell, confidence: float) -> str:
    if cell.verdict in ("n/a", "baseline") or cell.ratio is None:
        return "-"
    if cell.verdict == "equal":
        return "equal"
    if cell.verdict == "untested":
        return f"untested (needs 2+ launches a side): {cell.ratio:.3f}x"
    interval = (
        f", {confidence:.0%} CI {cell.ci_low:.3f}-{cell.ci_high:.3f}"
        if cell.ci_low is not None and cell.ci_high is not None
        else ""
    )
    if cell.verdict == "not significant":
        return f"not significant (p={cell.p_adjusted:.2f}; {cell.ratio:.3f}x{interval})"
    if cell.verdict == "negligible":
        return f"negligible (under the minimum effect; p={cell.p_adjusted:.2g}; {cell.ratio:.3f}x{interval})"
    return f"{cell.direction} {cell.ratio:.3f}x (p={cell.p_adjusted:.2g}{interval})"


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


CSV_FIELDS = tuple(Observation.model_fields)


def to_csv(c: Comparison) -> str:
    """Every measured value in long form: a header row, then one observation a row; numbers are written as numbers."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(CSV_FIELDS)
    for o in c.observations:
        w.writerow(["" if v is None else v for v in (getattr(o, f) for f in CSV_FIELDS)])
    return buf.getvalue()


def to_json(c: Comparison) -> str:
    """The comparison as JSON: the structured values (raw numbers) and the rendered ``tables``."""
    return c.model_dump_json(indent=2) + "\n"


# ---------------------------------------------------------------------------------------------------------------------
# The profile section


class ProfileColumn(BaseModel):
    """One column's profile (its first launch's): where the profiled level's time went; times in ms."""

    key: str
    status: Literal["measured", "unavailable", "failed"]
    note: str = ""
    level: str | None = None
    device: str | None = None
    scope: str | None = None
    total_ms: float | None = None
    attention_ms: float | None = None
    gemm_ms: float | None = None
    other_ms: float | None = None
    attention_share: float | None = None
    gemm_share: float | None = None
    other_share: float | None = None


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"


def profile_sections(profiles: list[ProfileColumn]) -> list[Section]:
    """The Profile section (one column per profiled variant), or none when no column was profiled."""
    if not profiles:
        return []
    rows = [
        ["level", *(p.level or "-" for p in profiles)],
        ["measured", *(f"{p.device} {p.scope}" if p.status == "measured" else p.status for p in profiles)],
        ["attention share", *(_pct(p.attention_share) for p in profiles)],
        ["attention (ms)", *(_ms(p.attention_ms) for p in profiles)],
        ["gemm share", *(_pct(p.gemm_share) for p in profiles)],
        ["gemm (ms)", *(_ms(p.gemm_ms) for p in profiles)],
        ["other share", *(_pct(p.other_share) for p in profiles)],
        ["other (ms)", *(_ms(p.other_ms) for p in profiles)],
        ["total (ms)", *(_ms(p.total_ms) for p in profiles)],
    ]
    if any(p.note for p in profiles):
        rows.append(["note", *(p.note for p in profiles)])
    title = "Profile (one profiled level per variant, profiler overhead included: shares, not speeds)"
    return [Section(title=title, header=["", *(p.key for p in profiles)], rows=rows)]
