"""The A/A test: the same experiment run twice through the real loop on the reference server, then compared.

Both runs launch each of two identical configurations three times (``bench.launches``), so every comparison
`campaign compare` makes here is between equals: a correct comparison calls no cell significant, however many
metrics and levels it tests. Runs the real CLI against the real server on CPU, as a user would.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import yaml

from campaign.comparison import Comparison
from tests.test_loop import campaign, free_port

LAUNCHES = 3


def _experiment(tmp: Path) -> Path:
    doc = {
        "name": "aa",
        "host": {"kind": "local", "workdir": str(tmp / "box")},
        "recipe": "refserver",
        "vars": {"python": sys.executable},
        "baseline": {"knobs": {"device": "cpu", "attention": "torch", "cuda_graph": False, "port": free_port()}},
        # Differs from the baseline only by a variable the server never reads: an A/A pair inside each run too.
        "variants": [{"name": "same", "env": {"CAMPAIGN_AA_LABEL": "b"}}],
        "smoke": {"questions": 2, "seed": 3, "burst": False},
        "bench": {"concurrency": [1, 2], "requests": 6, "warmup": 1, "repeats": 2, "launches": LAUNCHES},
        "timeouts": {"ready_s": 60, "stop_grace_s": 5},
        "at_end": "stop",
    }
    path = tmp / "aa.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def test_the_same_experiment_twice_differs_in_no_cell(tmp_path: Path) -> None:
    path = _experiment(tmp_path)
    runs = tmp_path / "runs"
    plan = json.loads(campaign("run", str(path), "--dry-run", "--json", runs=runs).stdout)
    assert plan["bench"].endswith(f"on each of {LAUNCHES} launches of a variant")
    run_ids = []
    for _ in range(2):
        res = campaign("run", str(path), "--json", runs=runs)
        assert res.returncode == 0, res.stderr
        doc = json.loads(res.stdout)
        # Each variant was launched LAUNCHES times, each launch benched, in rounds: the box's drift over the run
        # falls on both variants alike instead of on the difference between them.
        roles = [(a["variant"], a["role"], a["launch"], a["outcome"]) for a in doc["attempts"]]
        assert roles == [
            (name, "variant" if i == 0 else "relaunch", i, "passed")
            for i in range(LAUNCHES)
            for name in ("baseline", "same")
        ]
        run_ids.append(doc["run_id"])

    res = campaign("compare", *run_ids, "--json", runs=runs)
    assert res.returncode == 0, res.stderr
    c = Comparison.model_validate(json.loads(res.stdout))
    keys = [col.key for col in c.columns]
    assert [col.launches for col in c.columns] == [LAUNCHES] * 4
    # Same-named variants are paired across runs; the first run's variant is compared with its baseline.
    assert [col.reference for col in c.columns] == [None, keys[0], keys[0], keys[1]]
    tested = [cell for m in c.metrics for cell in m.cells if cell.p_value is not None]
    # Across the two runs the other configuration, unchanged, measures the box's drift between them (run-2/same
    # against run-1/same has run-2/baseline against run-1/baseline as its control, and the other way round).
    across = [cell for m in c.metrics for cell in m.cells[2:] if cell.p_value is not None]
    assert across and all(cell.drift_sd is not None for cell in across)
    # 3 compared columns x 2 levels x 8 metrics that vary (the error rate is 0 everywhere: equal, not tested).
    assert len(tested) >= 40
    significant = [
        (m.level, m.metric, c.columns[i].key, cell.p_value, cell.p_adjusted)
        for m in c.metrics
        for i, cell in enumerate(m.cells)
        if cell.verdict == "significant"
    ]
    assert significant == []
    text = campaign("compare", *run_ids, "--md", runs=runs).stdout
    # Not significant comes before any ratio; no cell reads "better ...x (p=...)" or "worse ...".
    assert "not significant (p=" in text and "x (p=" not in text

    # --baseline RUN:VARIANT compares every column with that one; a wrong one is a usage error, not a traceback.
    res = campaign("compare", *run_ids, "--baseline", "last:same", "--json", runs=runs)
    assert res.returncode == 0, res.stderr
    by_same = Comparison.model_validate(json.loads(res.stdout))
    assert [col.reference for col in by_same.columns] == [keys[3], keys[3], keys[3], None]
    for wrong, says in (("same", "expected RUN:VARIANT"), (f"{run_ids[0]}:ghost", "not among the compared columns")):
        res = campaign("compare", *run_ids, "--baseline", wrong, runs=runs)
        assert res.returncode == 2 and says in res.stderr and "Traceback" not in res.stderr, res.stderr

    # The long-format CSV holds every repeat of every launch: numbers a spreadsheet reads as numbers.
    rows = campaign("compare", *run_ids, "--csv", runs=runs).stdout.splitlines()
    assert rows[0] == "run,variant,launch,repeat,level,concurrency,request_rate,metric,unit,value"
    body = [r.split(",") for r in rows[1:]]
    assert {r[2] for r in body} == {str(i) for i in range(LAUNCHES)}
    ttft = [float(r[9]) for r in body if r[7] == "ttft.median"]
    assert len(ttft) == 4 * LAUNCHES * 2 * 2 and all(v > 0 for v in ttft)
    assert {r[8] for r in body if r[7] == "ttft.median"} == {"ms"}
