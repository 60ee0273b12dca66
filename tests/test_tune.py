"""campaign tune: the search on the landscape's known function, a bad search: block, and a tune through the CLI."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from campaign.bench.landscape import SPACE, optimum
from campaign.errors import ConfigError
from campaign.tune.space import key
from scripts.bench_tune import run_one
from tests.helpers import run_cli

DATA = Path(__file__).parent / "data" / "tune"


@pytest.mark.parametrize("strategy", ["tiered", "bayes"])
def test_search_reaches_the_optimum_and_never_retries_a_learnt_failure(strategy: str) -> None:
    reached = 0
    for seed in range(10):
        row = run_one(strategy, seed, noise=0.03, budget=20)
        hit = row["trials_to_optimum"]
        reached += hit is not None and int(hit) <= 16  # type: ignore[call-overload]
        assert row["retried_failing"] == 0
        assert int(row["trials"]) <= 20  # type: ignore[call-overload]
        if strategy == "tiered":  # its one-factor stage runs max_batch=64 alone: the cause is named at once
            assert row["constraints"] == [{"max_batch": 64}]
    # Done when: at most 35 % of the 48 points (16 trials) in at least 8 of 10 seeds.
    assert reached >= 8


def test_budget_stops_the_search() -> None:
    row = run_one("grid", 0, noise=0.03, budget=7)
    assert row["trials"] == 7 and row["stopped_because"] == "budget: 7 trials"


def test_a_bad_search_block_names_file_line_and_field(tmp_path: Path) -> None:
    from campaign import config as cfg
    from campaign.tune.space import load_search

    text = (DATA / "landscape.yaml").read_text().replace("stream_interval: [1, 4]", "stream_intervals: [1, 4]")
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as e:
        load_search(cfg.load(str(path)))
    assert e.value.field == "search.space.stream_intervals"
    assert e.value.line == text.splitlines().index("    stream_intervals: [1, 4]") + 1
    assert "no knob 'stream_intervals'" in e.value.detail


def test_landscape_optimum_is_in_the_space() -> None:
    best = optimum()
    assert all(best[k] in v for k, v in SPACE.items())
    assert key(best) == key({"attention": "mma", "max_batch": 32, "cuda_graph": True, "stream_interval": 4})


@pytest.mark.integration  # launches real servers through the CLI: make test, not make check
@pytest.mark.timeout(600)
def test_tune_through_the_loop_promotes_a_proven_winner(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    runs = tmp_path / "runs"
    monkeypatch.setenv("CAMPAIGN_HOST_STATE", str(tmp_path / "state"))
    try:
        res = run_cli("tune", str(DATA / "landscape.yaml"), "--budget", "5", "--json", runs=runs)
    finally:
        stopped = run_cli("stop", str(DATA / "landscape.yaml"), runs=runs)  # the kept configuration still serves
    assert stopped.returncode == 0, stopped.stderr
    assert res.returncode == 0, res.stderr
    report = json.loads(res.stdout)
    assert report["status"] == "finished"
    assert [t["outcome"] for t in report["trials"]][:2] == ["passed", "passed"]
    assert len(report["trials"]) == 5
    assert "trial 5 of 5" in res.stderr
    final = report["final"]
    assert final["box_proven"] is True
    # Every trial is a run in the store, as `campaign show` reads it.
    for t in report["trials"]:
        assert (runs / t["run_id"] / "report.json").is_file()
    shown = run_cli("show", final["run_id"], "--json", runs=runs)
    assert shown.returncode in (0, 1), shown.stderr
    assert (runs / report["tune_id"] / "tune.json").is_file()
    # The attention backends are 1.25x and 1.5x faster on the landscape: a winner must be one of them and proven.
    if final["promoted"] is not None:
        assert final["promoted_config"]["attention"] in ("simt", "mma")
    else:
        assert final["detail"].startswith("no significant gain")
