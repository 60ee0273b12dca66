"""Comparing stored runs: real bench results from the scheduled endpoint, written to disk and read back; the
statistics against values worked out by hand or read from tables."""

from __future__ import annotations

import csv
import io
import json
import math
from pathlib import Path

import pytest
from rich.console import Console

from campaign.bench import run_bench
from campaign.bench.testing import ScheduledServer
from campaign.compare import compare
from campaign.comparison import Comparison, MetricCell, Section, to_csv, to_json, to_markdown
from campaign.console.compare import render_comparison
from campaign.errors import StoreError, UsageError
from campaign.plot import plot
from campaign.records import METRICS, Attempt, BenchResult, BenchSettings, Diagnosis, LaunchSpec, Restore, RunReport
from campaign.statistics import adjust, benjamini_hochberg, holm, ratio_interval, t_quantile, welch_p_value

SETTINGS = BenchSettings(concurrency=[1, 4], requests=6, warmup=1, repeats=2, launches=4)
LAUNCHES = 4


def _spec(itl: float) -> LaunchSpec:
    return LaunchSpec(
        recipe="refserver",
        command=["python", "-m", "campaign.refserver", "--itl", str(itl)],
        env={"HF_TOKEN": "hf_secret_value", "OMP_NUM_THREADS": "2"},
        port=30000,
        ready_marker="ready",
        health_path="/health",
    )


def _launches(first: int, variant: str, itl: float, benches: list[BenchResult]) -> list[Attempt]:
    """A variant's attempt and its relaunches, one bench each, as a ``bench.launches`` run records them."""
    return [
        Attempt(
            index=first + i,
            variant=variant,
            role="variant" if i == 0 else "relaunch",
            launch=i,
            knobs={"attention": "mma" if itl < 5 else "torch"},
            spec=_spec(itl),
            outcome="passed",
            bench=b,
        )
        for i, b in enumerate(benches)
    ]


def _report(run_id: str, attempts: list[Attempt], kernel_hash: str, **kw: object) -> RunReport:
    return RunReport(
        run_id=run_id,
        experiment="quickstart",
        host="local",
        recipe="refserver",
        started_at="2026-12-02T10:00:00Z",
        attempts=attempts,
        environment={"gpu": "none", "driver": "-", "server_version": "0.1.0", "kernel_hash": kernel_hash},
        **kw,  # type: ignore[arg-type]
    )


@pytest.fixture(scope="module")
def stored(tmp_path_factory: pytest.TempPathFactory) -> list[RunReport]:
    """Three runs written as report.json files and loaded back, as the store would hand them over.

    run-a: the baseline (ITL 8 ms); run-b: ``mma`` (ITL 3 ms, a real difference) and a variant that failed;
    run-c: run-a again (an A/A pair with it). Each benched variant has four launches, each its own bench.
    """
    with (
        ScheduledServer(ttft_ms=10, itl_ms=8, tokens=8) as slow,
        ScheduledServer(ttft_ms=10, itl_ms=3, tokens=8) as fast,
    ):
        base = [run_bench(slow.url, SETTINGS) for _ in range(LAUNCHES)]
        again = [run_bench(slow.url, SETTINGS) for _ in range(LAUNCHES)]
        better = [run_bench(fast.url, SETTINGS) for _ in range(LAUNCHES)]
    failed = Attempt(
        index=LAUNCHES,
        variant="graphs",
        knobs={"attention": "torch"},
        spec=_spec(8),
        outcome="failed",
        failed_phase="cuda_graph",
        diagnosis=Diagnosis(kind="stream_capture_isolation", hint="disable cuda graphs"),
    )
    reports = [
        _report("run-a", _launches(0, "baseline", 8, base), "aaaa"),
        _report(
            "run-b",
            [*_launches(0, "mma", 3, better), failed],
            "bbbb",
            restores=[Restore(outcome="restored", variant="baseline", attempt=LAUNCHES)],
        ),
        _report("run-c", _launches(0, "baseline", 8, again), "aaaa"),
    ]
    loaded = []
    for report in reports:
        folder = tmp_path_factory.mktemp(report.run_id)
        (folder / "report.json").write_text(report.model_dump_json(indent=2))
        loaded.append(RunReport.model_validate_json((folder / "report.json").read_text()))
    return loaded


def _parse_markdown(text: str) -> list[Section]:
    sections: list[Section] = []
    for block in text.split("\n## ")[1:]:
        lines = block.strip().splitlines()
        title = lines[0]
        table = [ln for ln in lines[1:] if ln.startswith("|")]
        cells = [[c.strip().replace("\\|", "|") for c in ln.strip("|").split(" | ")] for ln in table]
        sections.append(Section(title=title, header=cells[0] if cells else [], rows=cells[2:]))
    return sections


def _rich_rows(c: Comparison) -> list[list[str]]:
    console = Console(record=True, width=700, force_terminal=False, color_system=None)
    render_comparison(console, c)
    text = console.export_text()
    lines = [ln.replace("┃", "│") for ln in text.splitlines()]  # header cells are drawn with heavy bars
    return [[cell.strip() for cell in ln.strip().strip("│").split("│")] for ln in lines if "│" in ln]


def _cells(c: Comparison, column: str) -> dict[tuple[str, str], MetricCell]:
    i = [col.key for col in c.columns].index(column)
    return {(m.level, m.metric): m.cells[i] for m in c.metrics}


def test_every_format_renders_the_same_cells(stored: list[RunReport]) -> None:
    c = compare(stored)
    sections = c.sections()
    assert [s.title for s in sections][:3] == ["Variants", "Configuration (differences)", "Environment"]
    assert sections[3].title.startswith("Metrics") and "Holm" in sections[3].title

    assert _parse_markdown(to_markdown(c)) == [s for s in sections if s.rows]
    doc = json.loads(to_json(c))
    assert [Section.model_validate(t) for t in doc["tables"]] == sections
    rich_rows = _rich_rows(c)
    for s in sections:
        assert s.header in rich_rows
        for row in s.rows:
            assert row in rich_rows, row


def test_comparison_content(stored: list[RunReport]) -> None:
    c = compare(stored)
    assert [col.key for col in c.columns] == ["run-a/baseline", "run-b/mma", "run-b/graphs", "run-c/baseline"]
    assert [col.launches for col in c.columns] == [LAUNCHES, LAUNCHES, 0, LAUNCHES]
    failed = c.columns[2]
    assert (failed.outcome, failed.failure_kind, failed.restore, failed.failed_phase) == (
        "failed",
        "stream_capture_isolation",
        "restored",
        "cuda_graph",
    )
    fields = {r.field: r for r in c.config}
    # Only what differs: the command and the knob differ; the port and recipe do not.
    assert "knobs.attention" in fields and "spec.command" in fields
    assert "spec.port" not in fields and "recipe" not in fields
    assert all("hf_secret_value" not in v for r in c.config for v in r.values if v)
    assert all("hf_secret_value" not in v for r in compare(stored, all_fields=True).config for v in r.values if v)
    full = {r.field for r in compare(stored, all_fields=True).config}
    assert {"spec.port", "recipe", "spec.env.HF_TOKEN", "bench.requests", "bench.launches"} <= full
    env = {r.field: r for r in c.environment}
    assert env["kernel_hash"].differs and not env["gpu"].differs and not env["host"].differs
    # A cell's value is the mean over launches of each launch's repeats averaged, from the stored numbers.
    per_launch = []
    for a in stored[0].attempts:
        level = BenchResult.model_validate(a.bench).level(concurrency=4)
        assert level is not None
        per_launch.append(sum(r.metrics["output_throughput"] or 0.0 for r in level.repeats) / len(level.repeats))
    doc = json.loads(to_json(c))
    row = next(m for m in doc["metrics"] if m["level"] == "c=4" and m["metric"] == "output_throughput")
    assert row["unit"] == "tok/s" and row["key"] == "output_throughput_tok_s"
    assert row["cells"][0]["samples"] == pytest.approx(per_launch)
    assert row["cells"][0]["value"] == pytest.approx(sum(per_launch) / LAUNCHES)
    assert row["cells"][0]["verdict"] == "baseline" and row["cells"][2]["verdict"] == "n/a"
    # Units are in the plot series' keys.
    assert set(doc["series"][0]["points"][0]["values"]) == {
        "output_throughput_tok_s",
        "ttft_median_ms",
        "tpot_median_ms",
        "e2e_p90_ms",
    }


def test_columns_are_paired_by_name_or_with_the_given_baseline(stored: list[RunReport]) -> None:
    c = compare(stored)
    # run-c's baseline is compared with run-a's; run-b's mma has no namesake in run-a: the first column.
    assert [col.reference for col in c.columns] == [None, "run-a/baseline", "run-a/baseline", "run-a/baseline"]
    by_mma = compare(stored, baseline=("run-b", "mma"))
    assert [col.reference for col in by_mma.columns] == ["run-b/mma", None, "run-b/mma", "run-b/mma"]
    assert "run-a/baseline vs run-b/mma" in by_mma.sections()[3].header
    with pytest.raises(UsageError, match="run-b:nope"):
        compare(stored, baseline=("run-b", "nope"))


def test_a_real_difference_is_significant_with_its_interval(stored: list[RunReport]) -> None:
    c = compare(stored)
    cells = _cells(c, "run-b/mma")
    tput = cells[("c=1", "output_throughput")]
    # ITL 3 ms instead of 8 ms: about twice the tokens per second, far outside the launch-to-launch noise.
    assert tput.verdict == "significant" and tput.direction == "better"
    assert tput.p_adjusted is not None and tput.p_value is not None and tput.p_adjusted < 0.05
    assert 1.6 < tput.ratio < 3.0  # type: ignore[operator]
    assert 1.0 < tput.ci_low < tput.ratio < tput.ci_high  # type: ignore[operator]
    itl = cells[("c=1", "itl.median")]
    assert itl.verdict == "significant" and itl.direction == "better" and itl.ratio < 0.6  # type: ignore[operator]
    text = to_markdown(c)
    assert f"better {tput.ratio:.3f}x (p=" in text
    # Worse is marked by the metric's direction too: the baseline against mma.
    flipped = _cells(compare(stored, baseline=("run-b", "mma")), "run-a/baseline")
    assert flipped[("c=1", "output_throughput")].direction == "worse"
    assert flipped[("c=1", "itl.median")].direction == "worse"
    # The terminal colours them: green for better, red for worse.
    console = Console(record=True, width=700, force_terminal=True, color_system="standard")
    render_comparison(console, c)
    styled = console.export_text(styles=True)
    assert "\x1b[1;32mbetter" in styled


def test_the_same_configuration_twice_is_not_significant(stored: list[RunReport]) -> None:
    c = compare(stored)
    aa = _cells(c, "run-c/baseline")
    tested = [cell for cell in aa.values() if cell.p_value is not None]
    assert len(tested) >= 12
    assert all(cell.verdict == "not significant" for cell in tested), [
        (k, cell.p_value) for k, cell in aa.items() if cell.verdict == "significant"
    ]
    # No errors anywhere: the error rate is equal, not tested (no p-value, not counted in the correction).
    rate = aa[("c=1", "error_rate")]
    assert rate.verdict == "equal" and rate.p_value is None
    text = to_markdown(c)
    assert "not significant (p=" in text


def test_single_launches_are_marked_untested(stored: list[RunReport]) -> None:
    one = [r.model_copy(update={"attempts": [a for a in r.attempts if a.role != "relaunch"]}) for r in stored]
    c = compare(one)
    cell = _cells(c, "run-b/mma")[("c=1", "output_throughput")]
    assert cell.verdict == "untested" and cell.ratio is not None and cell.p_value is None
    assert "untested (needs 2+ launches a side)" in to_markdown(c)


def test_long_format_csv(stored: list[RunReport]) -> None:
    rows = list(csv.DictReader(io.StringIO(to_csv(compare(stored)))))
    header = ["run", "variant", "launch", "repeat", "level", "concurrency", "request_rate", "metric", "unit", "value"]
    assert list(rows[0]) == header
    # One observation a row: 3 benched columns x 4 launches x 2 levels x 2 repeats x every metric.
    assert len(rows) == 3 * LAUNCHES * 2 * SETTINGS.repeats * len(METRICS)
    assert {(r["run"], r["variant"]) for r in rows} == {("run-a", "baseline"), ("run-b", "mma"), ("run-c", "baseline")}
    assert {r["launch"] for r in rows} == {str(i) for i in range(LAUNCHES)}
    assert {r["repeat"] for r in rows} == {"0", "1"}
    tput = [r for r in rows if r["metric"] == "output_throughput"]
    assert {r["unit"] for r in tput} == {"tok/s"} and all(float(r["value"]) > 0 for r in tput)
    # Every metric in its own unit (input throughput was once labelled ms).
    units = {r["metric"]: r["unit"] for r in rows}
    assert units["input_throughput"] == units["total_throughput"] == "tok/s"
    assert units["request_throughput"] == "req/s" and units["error_rate"] == "fraction"
    assert units["ttft.p90"] == units["e2e.median"] == "ms"
    assert {int(r["concurrency"]) for r in tput} == {1, 4} and {r["request_rate"] for r in tput} == {""}


def test_holm_and_benjamini_hochberg() -> None:
    p = [0.01, 0.04, 0.03, 0.005]
    # Holm: sorted 0.005, 0.01, 0.03, 0.04 times 4, 3, 2, 1 = 0.02, 0.03, 0.06, 0.04 -> running max 0.06 at the end.
    assert holm(p) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    # BH: p * 4 / rank = 0.02, 0.02, 0.04, 0.04 (ranks 1..4), running min from the largest down.
    assert benjamini_hochberg(p) == pytest.approx([0.02, 0.04, 0.04, 0.02])
    assert adjust(p, "none") == p
    assert holm([0.5]) == [0.5] and holm([]) == []
    assert max(holm([0.4, 0.6, 0.9])) <= 1.0


def test_t_quantiles_and_welch() -> None:
    # Student's t table, 97.5th percentiles.
    for df, t in ((1, 12.7062), (2, 4.3027), (4, 2.7764), (10, 2.2281), (1000, 1.9623)):
        assert t_quantile(0.975, df) == pytest.approx(t, abs=1e-4)
    # t = -2 with 8 degrees of freedom: two-sided p = 0.0805 (Student's t table).
    assert welch_p_value([1, 2, 3, 4, 5], [3, 4, 5, 6, 7]) == pytest.approx(0.0805, abs=1e-4)
    assert welch_p_value([10.0, 10.2, 9.9], [10.1, 9.8, 10.05]) > 0.05
    assert welch_p_value([1.0, 1.0], [1.0, 1.0]) == 1.0
    with pytest.raises(ValueError):
        welch_p_value([1.0], [1.0, 2.0])


def test_ratio_interval_by_hand() -> None:
    a, b = [10.0, 12.0, 11.0], [5.0, 6.0, 5.5]
    # mean 11 and 5.5, variance 1 and 0.25: each side's squared relative standard error is 1/363, so the
    # Welch-Satterthwaite df is exactly 4 (t = 2.776445) and se(log ratio) = sqrt(2/363).
    half = 2.776445 * math.sqrt(2 / 363)
    r = ratio_interval(a, b)
    assert r is not None
    assert r.ratio == pytest.approx(2.0)
    assert (r.low, r.high) == pytest.approx((2 * math.exp(-half), 2 * math.exp(half)), rel=1e-6)
    assert (r.low, r.high) == pytest.approx((1.6275, 2.4577), abs=1e-3)
    assert ratio_interval([1.0], [1.0, 2.0]) is None and ratio_interval([0.0, 0.0], [1.0, 2.0]) is None


def test_plot_is_written(stored: list[RunReport], tmp_path: Path) -> None:
    out = plot(compare(stored), tmp_path / "sub" / "cmp.png")
    data = out.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000


def test_nothing_to_compare_is_a_store_error(stored: list[RunReport]) -> None:
    with pytest.raises(StoreError):
        compare([])
    empty = stored[0].model_copy(update={"attempts": []})
    with pytest.raises(StoreError, match="no variant attempts"):
        compare([empty])


def test_a_small_real_difference_is_negligible_under_the_minimum_effect(tmp_path: Path) -> None:
    # ITL 8.3 ms against 8 ms: a real, steady 4% difference that six launches a side resolve, below the 5% default
    # (six, not four: one launch slowed by a busy CI box must not cost the significance).
    n = 6
    one_level = BenchSettings(concurrency=[1], requests=6, warmup=1, repeats=2, launches=n)
    with (
        ScheduledServer(ttft_ms=10, itl_ms=8, tokens=8) as base,
        ScheduledServer(ttft_ms=10, itl_ms=8.3, tokens=8) as slower,
    ):
        a = [run_bench(base.url, one_level) for _ in range(n)]
        b = [run_bench(slower.url, one_level) for _ in range(n)]
    reports = [
        _report("run-a", _launches(0, "baseline", 8, a), "aaaa"),
        _report("run-b", _launches(0, "x", 8, b), "aaaa"),
    ]
    default = _cells(compare(reports), "run-b/x")[("c=1", "itl.median")]
    assert default.verdict == "negligible" and default.direction is None
    assert 1.0 < default.ratio < 1.05 and default.p_adjusted is not None and default.p_adjusted < 0.05  # type: ignore[operator]
    assert "negligible (under the minimum effect; p=" in to_markdown(compare(reports))
    # With no threshold the same cell is a finding: slower ITL is worse.
    strict = _cells(compare(reports, min_effect=0.0), "run-b/x")[("c=1", "itl.median")]
    assert strict.verdict == "significant" and strict.direction == "worse"


def test_drift_between_runs_is_measured_on_the_unchanged_configurations() -> None:
    """Two runs of the same two configurations, the box 12% slower in the second (ITL 9 ms instead of 8).

    Launches within a run cannot show that drift, so a plain test calls the unchanged variant "significant" across
    the runs. The baseline, unchanged in both runs and in the same environment, measures the drift, which then
    counts in the variant's test: not significant, with the drift stated. With the environment changed (new
    kernels), the baseline is no control and the difference stands.
    """
    # Five launches a side: with three, one launch slowed by a busy CI box was enough to lose the changed case's
    # significance after the correction over the 24 tested cells.
    n = 5
    settings = BenchSettings(concurrency=[2], requests=6, warmup=1, launches=n)
    with (
        ScheduledServer(ttft_ms=10, itl_ms=8, tokens=8) as quiet,
        ScheduledServer(ttft_ms=10, itl_ms=9, tokens=8) as busy,
    ):
        before = [[run_bench(quiet.url, settings) for _ in range(n)] for _ in range(2)]
        after = [[run_bench(busy.url, settings) for _ in range(n)] for _ in range(2)]

    def run(run_id: str, benches: list[list[BenchResult]], kernel_hash: str) -> RunReport:
        attempts = [*_launches(0, "baseline", 8, benches[0]), *_launches(n, "same", 8, benches[1])]
        for a in attempts[n:]:
            a.spec = a.spec.model_copy(update={"env": {**a.spec.env, "CAMPAIGN_AA_LABEL": "b"}})
            a.spec_hash = "same"
        for a in attempts[:n]:
            a.spec_hash = "baseline"
        return _report(run_id, attempts, kernel_hash)

    itl = ("c=2", "itl.median")
    drifted = _cells(compare([run("run-1", before, "aaaa"), run("run-2", after, "aaaa")]), "run-2/same")[itl]
    assert 1.08 < drifted.ratio < 1.17  # type: ignore[operator]
    assert drifted.drift_sd is not None and drifted.drift_sd > 0.05
    assert drifted.verdict == "not significant", (drifted.p_value, drifted.p_adjusted)
    assert drifted.ci_low is not None and drifted.ci_low < 1.0 < drifted.ci_high  # type: ignore[operator]

    changed = _cells(compare([run("run-1", before, "aaaa"), run("run-2", after, "bbbb")]), "run-2/same")[itl]
    assert changed.drift_sd is None
    assert changed.verdict == "significant" and changed.direction == "worse"
