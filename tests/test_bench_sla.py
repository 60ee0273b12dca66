"""The SLA search, the first test request and the real-server options, against the scheduled endpoint over HTTP.

The endpoint's TTFT grows with the requests in flight (``ttft + k * n``), so under a closed loop at concurrency c
every request's TTFT is at most ``ttft + k * c`` and the highest c whose TTFT p90 meets a bound T is
``floor((T - ttft) / k)``: the knee is known before the search runs.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from pydantic import ValidationError

from campaign.bench import run_bench
from campaign.bench.testing import ScheduledServer
from campaign.errors import BenchError
from campaign.gates import check_gates
from campaign.records import BenchResult, BenchSettings, Gate, RequestRow, SlaSettings
from campaign.store import Store
from tests.test_cli import ENTRY, campaign
from tests.test_loop import experiment

BASE_MS = 10.0
PER_INFLIGHT_MS = 20.0
KNEE = 6
#: The bound sits half a step above the knee's TTFT, so a few ms of client noise cannot move the answer.
TTFT_BOUND_MS = BASE_MS + PER_INFLIGHT_MS * (KNEE + 0.5)


@pytest.fixture(scope="module")
def loaded() -> Iterator[ScheduledServer]:
    with ScheduledServer(ttft_ms=BASE_MS, itl_ms=2, tokens=3, ttft_per_inflight_ms=PER_INFLIGHT_MS) as srv:
        yield srv


def _search(high: int = 16, **slo: float) -> BenchSettings:
    sla = SlaSettings(slo=slo or {"ttft.p90": TTFT_BOUND_MS}, low=1, high=high)
    return BenchSettings(sla=sla, requests=24, warmup=0)


def test_search_finds_the_known_knee_in_a_bounded_number_of_trials(loaded: ScheduledServer) -> None:
    assert math.floor((TTFT_BOUND_MS - BASE_MS) / PER_INFLIGHT_MS) == KNEE
    settings = _search()
    bound = settings.trial_count()
    assert bound == 2 + math.ceil(math.log2(16 - 1))  # low, high, then halvings of 15 down to 1

    result = run_bench(loaded.url, settings)

    sla = result.sla
    assert sla is not None and result.passed and sla.converged
    assert sla.max is not None and abs(sla.max - KNEE) <= 1
    assert sla.missed == sla.max + 1
    assert len(sla.trials) <= bound and len(result.levels) == len(sla.trials)
    assert [t.value for t in sla.trials][:2] == [1, 16]
    for trial, level in zip(sla.trials, result.levels, strict=True):
        assert trial.label == level.label
        # Every trial's verdict is what its own measurement says about the bound.
        assert trial.met == (level.ttft.p90 is not None and level.ttft.p90 <= TTFT_BOUND_MS)
        if not trial.met:
            assert any("ttft.p90" in v for v in trial.violations)
    best = result.level(concurrency=int(sla.max))
    assert best is not None and sla.goodput == best.output_throughput
    assert sla.request_goodput == best.request_throughput
    assert BenchResult.model_validate_json(result.model_dump_json()) == result

    gates = check_gates(result, None, [Gate(metric="sla.max", min=KNEE - 1), Gate(metric="sla.max", min=KNEE + 2)])
    assert [g.passed for g in gates] == [True, False]
    assert f"sla.max = {sla.max:g}" in gates[1].detail and "below the minimum" in gates[1].detail
    # Against a baseline that held twice the load, the ratio gate fails.
    baseline = result.model_copy(update={"sla": sla.model_copy(update={"max": 2 * sla.max})})
    (ratio,) = check_gates(result, baseline, [Gate(metric="sla.max", min_ratio=0.9)])
    assert not ratio.passed and "ratio 0.500x" in ratio.detail


def test_a_search_whose_lowest_load_misses_fails_the_bench(loaded: ScheduledServer) -> None:
    result = run_bench(loaded.url, _search(**{"ttft.p90": BASE_MS / 2}))
    assert result.sla is not None and result.sla.max is None and not result.passed
    assert [t.value for t in result.sla.trials] == [1]  # nothing above the lowest load is tried
    (gate,) = check_gates(result, None, [Gate(metric="sla.goodput", min=1)])
    assert not gate.passed and "no load met the SLOs" in gate.detail


def test_sla_settings_reject_what_cannot_be_searched() -> None:
    with pytest.raises(ValidationError, match="not a metric an SLO bounds"):
        SlaSettings(slo={"output_throughput": 10})
    with pytest.raises(ValidationError, match="whole numbers"):
        SlaSettings(slo={"ttft.p90": 10}, high=7.5)
    with pytest.raises(ValidationError, match="leave concurrency and request_rate out"):
        BenchSettings(concurrency=[1], sla=SlaSettings(slo={"ttft.p90": 10}))
    with pytest.raises(ValidationError, match="selects no level"):
        Gate(metric="sla.max", concurrency=8, min=1)
    rate = SlaSettings(over="request_rate", slo={"e2e.p99": 500}, low=1, high=33)
    assert rate.resolution == 2 and rate.trial_bound() == 2 + 4
    assert "at most 6 trials" in BenchSettings(sla=rate).describe()


def test_completions_endpoint_with_exact_input_lengths_and_an_api_key() -> None:
    rows: list[RequestRow] = []
    with ScheduledServer(ttft_ms=2, itl_ms=1, tokens=4, api_key="sk-test-secret-1234") as srv:
        with pytest.raises(BenchError, match=r"\(http_401\): invalid API key") as info:
            run_bench(srv.url, BenchSettings(concurrency=[2], requests=4, warmup=0))
        assert "--api-key" in (info.value.hint or "")
        settings = BenchSettings(
            concurrency=[2],
            requests=6,
            warmup=1,
            endpoint="completions",
            prompts="random",
            input_len=20,
            api_key="sk-test-secret-1234",
            headers={"X-Team": "bench", "X-Api-Key": "another-secret"},
        )
        result = run_bench(srv.url, settings, on_request=rows.append)
    (lv,) = result.levels
    assert result.passed and lv.successful == 6 and lv.output_tokens == 6 * 4
    assert result.input_lengths == "tokenize" and lv.input_tokens == 6 * 20
    assert lv.input_throughput == pytest.approx(lv.input_tokens / lv.duration_s)
    assert lv.total_throughput == pytest.approx((lv.input_tokens + lv.output_tokens) / lv.duration_s)
    assert [r.prompt_tokens for r in rows] == [20] * 6 and all(r.ok and r.ttft_ms for r in rows)
    stored = result.model_dump_json()
    assert "sk-test-secret" not in stored and "another-secret" not in stored
    assert result.settings.api_key == "***" and result.settings.headers == {"X-Team": "bench", "X-Api-Key": "***"}


def test_without_a_tokenize_endpoint_lengths_are_approximate() -> None:
    with ScheduledServer(ttft_ms=2, itl_ms=1, tokens=2, tokenize=False) as srv:
        assert httpx.post(srv.url + "/tokenize", json={"prompt": "a b c"}).status_code == 404
        result = run_bench(srv.url, BenchSettings(concurrency=[1], requests=2, warmup=0, prompts="random", input_len=9))
    assert result.input_lengths == "approximate"
    assert json.loads(result.model_dump_json())["input_lengths"] == "approximate"
    (lv,) = result.levels
    assert lv.input_tokens == 2 * 9  # words, as the endpoint's usage counted them


def test_cli_searches_writes_the_result_and_every_request_masked(loaded: ScheduledServer, tmp_path: Path) -> None:
    out, rows = tmp_path / "result.json", tmp_path / "requests.jsonl"
    res = campaign(
        "bench", loaded.url, "--sla", f"ttft.p90={TTFT_BOUND_MS}", "--sla-range", "1:8", "-n", "16", "--warmup", "0",
        "--header", "X-Team: bench", "--header", "Cookie: session=s3cr3t-cookie",
        "--output", str(out), "--export-requests", str(rows),
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    assert "SLA search over concurrency" in res.stdout and "highest concurrency within the SLOs" in res.stdout
    result = BenchResult.model_validate_json(out.read_text())
    assert result.sla is not None and result.sla.max is not None and abs(result.sla.max - KNEE) <= 1
    lines = [RequestRow.model_validate_json(line) for line in rows.read_text().splitlines()]
    assert len(lines) == 16 * len(result.sla.trials) and {r.level for r in lines} == {lv.label for lv in result.levels}
    for text in (res.stdout, res.stderr, out.read_text(), rows.read_text()):
        assert "s3cr3t-cookie" not in text
    assert result.settings.headers == {"X-Team": "bench", "Cookie": "***"}

    bad = campaign("bench", loaded.url, "--sla", "ttft.p90", "--sla-range", "1:8")
    assert bad.returncode == 2 and "expected NAME=VALUE" in bad.stderr


def test_dry_run_shows_the_search_and_its_trial_count(tmp_path: Path) -> None:
    sla = {"slo": {"ttft.p90": 200, "tpot.p90": 50}, "low": 1, "high": 128}
    path = experiment(tmp_path, "sla", {"kind": "local"}, [], bench={"sla": sla, "requests": 128})
    res = campaign("run", str(path), "--dry-run", "--json", runs=tmp_path / "runs")
    assert res.returncode == 0, res.stderr
    plan = json.loads(res.stdout)
    assert plan["bench_trials"] == 2 + math.ceil(math.log2(127)) == 9
    assert "SLA search over concurrency 1..128" in plan["bench"] and "at most 9 trials of 128 requests" in plan["bench"]
    text = campaign("run", str(path), "--dry-run", runs=tmp_path / "runs")
    assert "at most 9 trials" in text.stdout and "ttft.p90 <= 200 ms" in text.stdout


def test_the_search_runs_inside_the_loop_and_gates_a_variant(tmp_path: Path) -> None:
    """Each variant's bench is the search; its answer is stored, shown, and gated against the baseline's."""
    sla = {"slo": {"ttft.p90": 60_000}, "low": 1, "high": 3}
    bench = {"sla": sla, "requests": 6, "warmup": 1, "gates": [{"metric": "sla.max", "min_ratio": 1.0}]}
    variants = [{"name": "batch4", "knobs": {"max_batch": 4}}]
    path = experiment(tmp_path, "sla-loop", {"kind": "local"}, variants, bench=bench, at_end="stop")
    runs = tmp_path / "runs"
    res = campaign("run", str(path), "--json", runs=runs)
    assert res.returncode == 0, res.stderr
    report = Store(runs).load_report("last")
    for att in report.attempts:
        assert att.bench is not None and att.bench.sla is not None
        # A bound every level meets: the search measures low and high and stops there.
        assert [t.value for t in att.bench.sla.trials] == [1, 3] and att.bench.sla.max == 3
    (gate,) = report.attempts[-1].gates
    assert gate.passed and "sla.max = 3; baseline 3, ratio 1.000x" in gate.detail
    shown = campaign("show", "last", runs=runs)
    assert "SLA search: highest c=3 within ttft.p90 <= 60000 ms" in shown.stdout


def test_a_rate_search_with_a_small_budget_says_it_did_not_converge(loaded: ScheduledServer) -> None:
    sla = SlaSettings(over="request_rate", slo={"ttft.p90": TTFT_BOUND_MS}, low=20, high=400, max_trials=3)
    result = run_bench(loaded.url, BenchSettings(sla=sla, requests=16, warmup=0, max_concurrency=64))
    found = result.sla
    assert found is not None and [t.value for t in found.trials][:2] == [20, 400] and len(found.trials) == 3
    # 400 req/s of requests that each hold a slot for 30 ms or more cannot keep TTFT under 140 ms; 20 req/s can.
    assert found.trials[0].met and not found.trials[1].met
    assert not found.converged and found.max is not None and found.missed is not None
    assert result.levels[0].label == "rate=20/s,c<=64"


def test_cli_takes_the_api_key_from_the_environment_and_never_shows_it(tmp_path: Path) -> None:
    key = "sk-from-env-98765"
    out = tmp_path / "r.json"
    with ScheduledServer(ttft_ms=2, itl_ms=1, tokens=2, api_key=key) as srv:
        args = [str(ENTRY), "bench", srv.url, "-c", "2", "-n", "4", "--warmup", "0", "--output", str(out)]
        env = {**os.environ, "COLUMNS": "240"}
        refused = subprocess.run(args, capture_output=True, text=True, timeout=60, env=env)
        served = subprocess.run(args, capture_output=True, text=True, timeout=60, env={**env, "CAMPAIGN_API_KEY": key})
    assert refused.returncode == 2 and "invalid API key" in refused.stderr and "--api-key" in refused.stderr
    assert served.returncode == 0, served.stderr
    assert BenchResult.model_validate_json(out.read_text()).settings.api_key == "***"
    assert key not in served.stdout + served.stderr + out.read_text()
