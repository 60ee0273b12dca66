"""Bench gates over real bench results: a slower variant misses a throughput ratio, errors miss an error-rate cap."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from campaign.bench import run_bench
from campaign.bench.testing import ScheduledServer
from campaign.gates import check_gates
from campaign.records import BenchResult, BenchSettings, Gate

SETTINGS = BenchSettings(concurrency=[1, 4], requests=16, warmup=1, max_error_rate=0.5)


@pytest.fixture(scope="module")
def results() -> dict[str, BenchResult]:
    with (
        ScheduledServer(ttft_ms=5, itl_ms=3, tokens=6) as fast,
        ScheduledServer(ttft_ms=5, itl_ms=9, tokens=6) as slow,
        ScheduledServer(ttft_ms=5, itl_ms=3, tokens=6, fail_mode="error_event", fail_every=4) as flaky,
    ):
        return {
            "fast": run_bench(fast.url, SETTINGS),
            "fast_again": run_bench(fast.url, SETTINGS),
            "slow": run_bench(slow.url, SETTINGS),
            "flaky": run_bench(flaky.url, SETTINGS),
        }


# ITL 9 ms against 3 ms is a third of the throughput; 0.6x leaves room for the noise of a shared two-core box.
THROUGHPUT_AT_4 = Gate(metric="output_throughput", concurrency=4, min_ratio=0.6)
ERRORS = Gate(metric="error_rate", max=0.01)


def test_slower_variant_misses_the_throughput_ratio(results: dict[str, BenchResult]) -> None:
    (same,) = check_gates(results["fast_again"], results["fast"], [THROUGHPUT_AT_4])
    assert same.passed, same.detail
    (slow,) = check_gates(results["slow"], results["fast"], [THROUGHPUT_AT_4])
    assert not slow.passed
    assert "ratio below 0.6x" in slow.detail and slow.name == "output_throughput@c=4 >= 0.6x baseline"


def test_error_rate_gate_applies_to_every_level(results: dict[str, BenchResult]) -> None:
    flaky = check_gates(results["flaky"], None, [ERRORS])
    assert [g.passed for g in flaky] == [False, False]
    assert all("above the maximum" in g.detail for g in flaky)
    assert all(g.passed for g in check_gates(results["fast"], None, [ERRORS]))


def test_ratio_without_baseline_is_not_checked(results: dict[str, BenchResult]) -> None:
    (g,) = check_gates(results["slow"], None, [THROUGHPUT_AT_4])
    assert g.passed and "no baseline" in g.detail


def test_latency_bounds_and_missing_levels(results: dict[str, BenchResult]) -> None:
    fast = results["fast"]
    loose = Gate(metric="ttft.p90", concurrency=1, max=1000)
    tight = Gate(metric="e2e.median", concurrency=1, max=1)  # 6 tokens at 3 ms cannot finish within 1 ms
    missing = Gate(metric="output_throughput", concurrency=32, min=1)
    a, b, c = check_gates(fast, None, [loose, tight, missing])
    assert a.passed and not b.passed and not c.passed
    assert "no c=32 level" in c.detail


def test_gates_are_validated() -> None:
    with pytest.raises(ValidationError, match="unknown gate metric"):
        Gate(metric="throughput", min=1)
    with pytest.raises(ValidationError, match="at least one of"):
        Gate(metric="error_rate")
    with pytest.raises(ValidationError):
        Gate.model_validate({"metric": "error_rate", "max": 0.01, "maximum": 2})
