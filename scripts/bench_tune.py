"""Trials-to-optimum of each tune strategy on the landscape (campaign/bench/landscape.py), over seeds.

    .venv/bin/python scripts/bench_tune.py [--seeds 10] [--noise 0.03] [--budget 24] [--json out.json]

Each seed runs ``campaign.tune.search.Search`` (the search loop `campaign tune` runs) with each strategy over the
48-point landscape space. The evaluator is the landscape's known function, each measurement multiplied by
``1 + N(0, noise)`` (seeded), and a max_batch=64 configuration failing with the landscape's out-of-memory kind,
so the search sees what a launch shows without 48 launches per seed. The loop itself, with real launches, is
tested by tests/test_tune.py. Reported per strategy: the trial at which the optimum was first run (None: never),
how many seeds reached it within 35 % of the space (16 trials), trials run, configurations holding a learnt failing
value that were tried after it was learnt (must be 0), and why the search stopped.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
from pathlib import Path

from campaign.bench.landscape import SPACE, optimum, throughput
from campaign.records.tune import TrialRecord, TuneReport
from campaign.tune.search import Search
from campaign.tune.space import Config, SearchConfig, Space, key
from campaign.tune.strategies import make_strategy

CONCURRENCY, TOKENS = 32, 16
BASELINE: Config = {"attention": "torch", "max_batch": 16, "cuda_graph": False, "stream_interval": 1}


def run_one(strategy: str, seed: int, noise: float, budget: int) -> dict[str, object]:
    """One search; its trajectory summarised."""
    search = SearchConfig.model_validate(
        {
            "space": {k: list(v) for k, v in SPACE.items()},
            "objective": {"metric": "output_throughput", "concurrency": CONCURRENCY},
            "budget": {"trials": budget},
            "seed": seed,
        }
    )
    space = Space(search, BASELINE)
    rng = random.Random(seed * 7919 + 1)
    report = TuneReport(
        tune_id=f"bench-{strategy}-{seed}",
        experiment="landscape",
        strategy=strategy,  # type: ignore[arg-type]
        objective=search.objective.label,
        space_size=space.size(),
        budget_trials=budget,
        started_at="",
    )

    def evaluate(number: int, config: Config, stage: str) -> TrialRecord:
        t = throughput(config, concurrency=CONCURRENCY, tokens=TOKENS)
        if t is None:
            return TrialRecord(
                number=number,
                config=config,
                outcome="failed",
                kind="gpu_oom",
                failure_class="deterministic",
                stage=stage,
                wall_s=1.0,
            )
        return TrialRecord(
            number=number,
            config=config,
            outcome="passed",
            objective=t * (1 + rng.gauss(0, noise)),
            stage=stage,
            wall_s=1.0,
        )

    with tempfile.TemporaryDirectory() as tmp:
        strat = make_strategy(strategy, journal=Path(tmp) / "journal.log", seed=seed, higher_is_better=True)
        Search(search, space, strat, report, evaluate).run()
    best = key(optimum(concurrency=CONCURRENCY, tokens=TOKENS))
    reached = next((t.number + 1 for t in report.trials if key(t.config) == best), None)
    violations = 0
    for c in report.constraints:
        learnt_at = c.learnt_at
        violations += sum(
            1 for t in report.trials if t.number > learnt_at and all(t.config.get(k) == v for k, v in c.knobs.items())
        )
    return {
        "strategy": strategy,
        "seed": seed,
        "trials_to_optimum": reached,
        "trials": len(report.trials),
        "constraints": [c.knobs for c in report.constraints],
        "retried_failing": violations,
        "stopped_because": report.stopped_because,
    }


def main() -> int:
    """Run every strategy over the seeds; print a table; write JSON."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--seeds", type=int, default=10)
    p.add_argument("--first-seed", type=int, default=0)
    p.add_argument("--noise", type=float, default=0.03)
    p.add_argument("--budget", type=int, default=24)
    p.add_argument("--strategies", default="tiered,bayes,grid")
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args()
    limit = int(0.35 * 48)
    rows = [
        run_one(s, seed, args.noise, args.budget)
        for s in args.strategies.split(",")
        for seed in range(args.first_seed, args.first_seed + args.seeds)
    ]
    print(f"{'strategy':<8} {'seed':>4} {'to optimum':>10} {'trials':>6} {'retried failing':>15}  stopped because")
    for r in rows:
        print(
            f"{r['strategy']:<8} {r['seed']:>4} {r['trials_to_optimum'] or '-':>10} {r['trials']:>6} "
            f"{r['retried_failing']:>15}  {r['stopped_because']}"
        )
    summary = {}
    for s in args.strategies.split(","):
        mine = [r for r in rows if r["strategy"] == s]
        hits = [r for r in mine if r["trials_to_optimum"] is not None and r["trials_to_optimum"] <= limit]  # type: ignore[operator]
        reached = sorted(r["trials_to_optimum"] for r in mine if r["trials_to_optimum"] is not None)  # type: ignore[type-var]
        summary[s] = {
            "seeds": len(mine),
            f"reached_within_{limit}": len(hits),
            "median_trials_to_optimum": reached[len(reached) // 2] if reached else None,
            "retried_failing": sum(int(r["retried_failing"]) for r in mine),  # type: ignore[call-overload]
        }
        print(f"{s}: optimum within {limit} trials in {len(hits)} of {len(mine)} seeds; {summary[s]}")
    doc = {"noise": args.noise, "budget": args.budget, "space": 48, "limit": limit, "summary": summary, "runs": rows}
    if args.json is not None:
        args.json.write_text(json.dumps(doc, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
