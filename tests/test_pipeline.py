"""The pipeline in process: `campaign run`'s path over the real reference server on this machine.

What a user cannot see but every later change depends on: the run renders its plan once (after the flag check)
and hands it down; before this, one run rendered every variant three times and the baseline a fourth.
"""

from __future__ import annotations

import sys
from pathlib import Path

import yaml

from campaign import config
from campaign.operations import Operations
from tests.test_loop import free_port


def test_a_run_renders_its_plan_once(tmp_path: Path) -> None:
    """Every planned variant rendered once by the run: load checks each one renders, the plan renders it for use."""
    doc = {
        "name": "once",
        "host": {"kind": "local", "workdir": str(tmp_path / "box")},
        "recipe": "refserver",
        "vars": {"python": sys.executable},
        "baseline": {"knobs": {"device": "cpu", "attention": "torch", "cuda_graph": False, "port": free_port()}},
        "variants": [{"name": "small-batch", "knobs": {"max_batch": 2}}],
        "smoke": {"questions": 2, "seed": 3},
        "timeouts": {"ready_s": 120, "stop_grace_s": 5},
        "at_end": "stop",
    }
    path = tmp_path / "once.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    runs = tmp_path / "runs"

    before = config.renders()
    config.load(str(path))
    assert config.renders() - before == 2  # the load checks that the baseline and the variant each render

    # The whole command, as the CLI calls it: the load's check, then the plan made once after the flag check.
    before = config.renders()
    report = Operations(runs).run(str(path), (), (), None)
    assert report.status == "passed", report.final
    assert [a.variant for a in report.attempts] == ["baseline", "small-batch"]
    assert config.renders() - before == 2 + 2
