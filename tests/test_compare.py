"""Comparing stored runs: real bench results from the scheduled endpoint, written to disk and read back."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import pytest
from rich.console import Console

from campaign.bench import BenchResult, BenchSettings, run_bench
from campaign.compare import Comparison, Section, compare, to_csv, to_json, to_markdown, welch_p_value
from campaign.console.compare import render_comparison
from campaign.errors import StoreError
from campaign.plot import plot
from campaign.records import Attempt, Diagnosis, LaunchSpec, Restore, RunReport
from tests.fixtures.sse_server import ScheduledServer

SETTINGS = BenchSettings(concurrency=[1, 4], requests=8, warmup=1, repeats=3)


def _spec(itl: float) -> LaunchSpec:
    return LaunchSpec(
        recipe="refserver",
        command=["python", "-m", "campaign.refserver", "--itl", str(itl)],
        env={"HF_TOKEN": "hf_secret_value", "OMP_NUM_THREADS": "2"},
        port=30000,
        ready_marker="ready",
        health_path="/health",
    )


def _attempt(index: int, variant: str, itl: float, bench: BenchResult | None, **kw: object) -> Attempt:
    return Attempt(
        index=index,
        variant=variant,
        knobs={"attention": "mma" if itl < 5 else "torch"},
        spec=_spec(itl),
        outcome="passed" if bench else "failed",
        bench=bench.model_dump() if bench else None,
        **kw,  # type: ignore[arg-type]
    )


@pytest.fixture(scope="module")
def stored(tmp_path_factory: pytest.TempPathFactory) -> list[RunReport]:
    """Two runs written as report.json files and loaded back, as the store would hand them over."""
    with (
        ScheduledServer(ttft_ms=10, itl_ms=8, tokens=8) as slow,
        ScheduledServer(ttft_ms=10, itl_ms=3, tokens=8) as fast,
    ):
        base = run_bench(slow.url, SETTINGS)
        better = run_bench(fast.url, SETTINGS)
    run_a = RunReport(
        run_id="run-a",
        experiment="quickstart",
        host="local",
        recipe="refserver",
        started_at="2026-12-02T10:00:00Z",
        attempts=[_attempt(0, "baseline", 8, base)],
        environment={"gpu": "none", "driver": "-", "server_version": "0.1.0", "kernel_hash": "aaaa"},
    )
    run_b = RunReport(
        run_id="run-b",
        experiment="quickstart",
        host="local",
        recipe="refserver",
        started_at="2026-12-02T11:00:00Z",
        attempts=[
            _attempt(0, "mma", 3, better),
            _attempt(
                1,
                "graphs",
                8,
                None,
                failed_phase="cuda_graph",
                diagnosis=Diagnosis(kind="stream_capture_isolation", hint="disable cuda graphs"),
            ),
        ],
        restores=[Restore(outcome="restored", variant="baseline", attempt=1)],
        environment={"gpu": "none", "driver": "-", "server_version": "0.1.0", "kernel_hash": "bbbb"},
    )
    loaded = []
    for report in (run_a, run_b):
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


def _parse_csv(text: str) -> list[Section]:
    sections: list[Section] = []
    rows = list(csv.reader(io.StringIO(text)))
    current: list[list[str]] = []
    for row in [*rows, []]:
        if row:
            current.append(row)
            continue
        if current:
            title = current[0][0]
            sections.append(Section(title=title, header=current[0][1:], rows=[r[1:] for r in current[1:]]))
            current = []
    return sections


def _rich_rows(c: Comparison) -> list[list[str]]:
    console = Console(record=True, width=400, force_terminal=False, color_system=None)
    render_comparison(console, c)
    text = console.export_text()
    lines = [ln.replace("┃", "│") for ln in text.splitlines()]  # header cells are drawn with heavy bars
    return [[cell.strip() for cell in ln.strip().strip("│").split("│")] for ln in lines if "│" in ln]


def test_every_format_renders_the_same_cells(stored: list[RunReport]) -> None:
    c = compare(stored)
    sections = c.sections()
    assert [s.title for s in sections] == ["Variants", "Configuration (differences)", "Environment", "Metrics"]

    assert _parse_markdown(to_markdown(c)) == [s for s in sections if s.rows]
    assert _parse_csv(to_csv(c)) == [s for s in sections if s.rows]
    doc = json.loads(to_json(c))
    assert [Section.model_validate(t) for t in doc["tables"]] == sections
    rich_rows = _rich_rows(c)
    for s in sections:
        assert s.header in rich_rows
        for row in s.rows:
            assert row in rich_rows, row


def test_comparison_content(stored: list[RunReport]) -> None:
    c = compare(stored)
    assert [col.key for col in c.columns] == ["run-a/baseline", "run-b/mma", "run-b/graphs"]
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
    assert {"spec.port", "recipe", "spec.env.HF_TOKEN", "bench.requests"} <= full
    env = {r.field: r for r in c.environment}
    assert env["kernel_hash"].differs and not env["gpu"].differs and not env["host"].differs
    # Raw values in the JSON are the stored bench numbers.
    base = BenchResult.model_validate(stored[0].attempts[0].bench)
    doc = json.loads(to_json(c))
    row = next(m for m in doc["metrics"] if m["level"] == "c=4" and m["metric"] == "output_throughput")
    assert row["cells"][0]["value"] == base.level(concurrency=4).output_throughput  # type: ignore[union-attr]
    assert row["cells"][0]["verdict"] == "baseline" and row["cells"][2]["verdict"] == "n/a"


def test_a_real_difference_is_significant_and_has_a_ratio(stored: list[RunReport]) -> None:
    c = compare(stored)
    cells = {(m.level, m.metric): m.cells[1] for m in c.metrics}
    tput = cells[("c=1", "output_throughput")]
    # ITL 3 ms instead of 8 ms: about twice the tokens per second, far outside the noise of three repeats.
    assert tput.verdict == "significant" and tput.p_value is not None and tput.p_value < 0.01
    assert 1.6 < tput.ratio < 3.0  # type: ignore[operator]
    itl = cells[("c=1", "itl.median")]
    assert itl.verdict == "significant" and itl.ratio < 0.6  # type: ignore[operator]


def test_single_repeats_are_marked_untested(stored: list[RunReport]) -> None:
    one = [r.model_copy(deep=True) for r in stored]
    for r in one:
        for a in r.attempts:
            if a.bench:
                for lv in a.bench["levels"]:
                    lv["repeats"] = lv["repeats"][:1]
    c = compare(one)
    cell = next(m.cells[1] for m in c.metrics if m.metric == "output_throughput")
    assert cell.verdict == "untested" and cell.ratio is not None
    assert "untested" in to_markdown(c)


def test_welch_p_value() -> None:
    # t = -2 with 8 degrees of freedom: two-sided p = 0.0805 (Student's t table).
    assert welch_p_value([1, 2, 3, 4, 5], [3, 4, 5, 6, 7]) == pytest.approx(0.0805, abs=1e-4)
    assert welch_p_value([10.0, 10.2, 9.9], [10.1, 9.8, 10.05]) > 0.05
    assert welch_p_value([1.0, 1.0], [1.0, 1.0]) == 1.0
    with pytest.raises(ValueError):
        welch_p_value([1.0], [1.0, 2.0])


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
