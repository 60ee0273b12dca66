"""Effective configuration: a variant whose server says it runs something else is `config_not_applied`, with the line.

Unit cases read recorded logs of the real servers (tests/data/logs/README.md says where each line comes from); the
loop cases launch the real reference server, asked for CUDA graphs on this CPU host with its fallback mode on, through
`campaign run`, and read what a user reads: --json, `show`, and attribution.
"""

from __future__ import annotations

import json
import stat
import sys
from pathlib import Path
from typing import Any

import yaml

from campaign.config import load_recipe
from campaign.effective import verify
from tests.fixtures.refserver import free_port
from tests.test_flags import cli

REPO = Path(__file__).resolve().parents[1]
LOGS = REPO / "tests" / "data" / "logs"


def lines_of(name: str) -> list[tuple[int, str]]:
    return list(enumerate((LOGS / name).read_text().splitlines(), start=1))


def test_vllm_override_to_none_is_config_not_applied_with_the_line() -> None:
    lines = lines_of("vllm-cudagraph-override-none.log")
    found = verify(load_recipe("vllm"), {"torch_compile": False, "cuda_graph": True, "port": 8000}, lines)
    diagnosis = found.diagnosis("vllm")
    assert diagnosis is not None and diagnosis.kind == "config_not_applied"
    assert [e.text for e in diagnosis.evidence] == [lines[0][1]]
    assert "Overriding to NONE" in diagnosis.evidence[0].text and diagnosis.evidence[0].line == 1
    assert "asked cuda_graph=on, the server runs off" in diagnosis.summary
    assert "FULL_DECODE_ONLY" in diagnosis.hint
    # The same line is no news for a variant that asked for no graphs; torch_compile was not stated at all.
    calm = verify(load_recipe("vllm"), {"torch_compile": False, "cuda_graph": False}, lines)
    assert calm.diagnosis() is None and calm.unverified == ["torch_compile"]


def test_vllm_034s_override_to_full_decode_only_keeps_graphs_on() -> None:
    # vLLM 0.34.0's own format string (vllm/config/vllm.py, _normalize_piecewise_cudagraph_mode) with its values.
    line = (
        "Cudagraph mode FULL_AND_PIECEWISE is not compatible with compilation mode 0. Overriding to FULL_DECODE_ONLY."
    )
    found = verify(load_recipe("vllm"), {"cuda_graph": True}, [(7, line)])
    assert found.diagnosis() is None and [(s.knob, s.stated) for s in found.stated] == [("cuda_graph", True)]


def test_sglang_replacing_the_asked_backend_is_config_not_applied_with_the_line() -> None:
    lines = lines_of("sglang-fa3-fp8-e5m2-fallback.log")
    found = verify(load_recipe("sglang"), {"attention": "fa3", "port": 30000}, lines)
    diagnosis = found.diagnosis("sglang")
    assert diagnosis is not None and diagnosis.kind == "config_not_applied"
    assert diagnosis.evidence[-1].line == 6
    assert diagnosis.evidence[-1].text.endswith("Setting attention backend to triton.")
    assert "asked attention=fa3, the server runs triton" in diagnosis.summary
    assert verify(load_recipe("sglang"), {"attention": "triton"}, lines).diagnosis() is None


# -- the loop, end to end ----------------------------------------------------------------------------------------------


def refserver_experiment(tmp: Path, **extra: Any) -> Path:
    doc: dict[str, Any] = {
        "name": "fallback",
        "host": {"kind": "local", "workdir": str(tmp / "box")},
        "recipe": "refserver",
        "vars": {"python": sys.executable},
        "baseline": {"knobs": {"device": "cpu", "attention": "torch", "cuda_graph": False, "port": free_port()}},
        "smoke": {"questions": 2, "seed": 1},
        "timeouts": {"ready_s": 90, "stop_grace_s": 5},
        "at_end": "stop",
        **extra,
    }
    path = tmp / "fallback.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def test_the_reference_server_falling_back_from_graphs_is_config_not_applied_end_to_end(tmp_path: Path) -> None:
    exp = refserver_experiment(
        tmp_path,
        variants=[
            {"name": "graphs", "knobs": {"cuda_graph": True, "cuda_graph_fallback": True}},
            {"name": "eager-fallback-on", "knobs": {"cuda_graph_fallback": True}},
        ],
        isolate=True,
    )
    runs = tmp_path / "runs"
    res = cli("run", str(exp), "--json", runs=runs)
    assert res.returncode == 1, res.stderr
    doc = json.loads(res.stdout)
    att = {a["variant"]: a for a in doc["attempts"] if a["role"] == "variant"}
    assert att["baseline"]["outcome"] == "passed"
    assert att["eager-fallback-on"]["outcome"] == "passed"  # asked for no graphs, runs none: in effect
    graphs = att["graphs"]
    assert graphs["outcome"] == "failed" and graphs["failed_phase"] == "config"
    assert graphs["diagnosis"]["kind"] == "config_not_applied"
    texts = [e["text"] for e in graphs["diagnosis"]["evidence"]]
    assert any("falling back to eager decode" in t for t in texts)
    assert "cuda_graph=False" in texts[-1]
    assert graphs["restore"]["outcome"] == "restored"
    # The live view said so as it happened.
    live = " ".join(res.stderr.split())  # rich wraps long lines at the terminal's width
    assert "config not applied: asked cuda_graph=on, the server runs off" in live, res.stderr
    assert "failed in config: config_not_applied" in live
    # Attribution considers the kind: it is explained by the knob that was not in effect.
    statements = [f["statement"] for f in doc["attribution"]]
    assert any(s.startswith("config_not_applied") and "cuda_graph" in s for s in statements), (statements, live)
    shown = cli("show", doc["run_id"], runs=runs)
    assert shown.returncode == 0, shown.stderr
    assert "config_not_applied" in shown.stdout and "cuda_graph=False" in shown.stdout


def test_sglang_capture_banner_of_current_builds_is_the_graph_capture_phase(tmp_path: Path) -> None:
    """A start that stalls right after current SGLang's capture banner is reported in graph_capture, not in kv."""
    recipe = yaml.safe_load((REPO / "campaign" / "recipes" / "sglang.yaml").read_text())
    server = tmp_path / "fake-sglang"
    # Lines in the shapes of SGLang 0.5.23's model_runner and cuda_graph_setup.py log calls; then it hangs there.
    server.write_text(
        "#!/bin/sh\n"
        "echo '[2026-12-03 07:00:00 TP0] Load weight begin. avail mem=78.11 GB'\n"
        "echo '[2026-12-03 07:00:01 TP0] KV Cache is allocated. #tokens: 4096'\n"
        "echo '[2026-12-03 07:00:01 TP0] Capture target decode CUDA graph begin. backend=full, "
        "num_tokens_per_req=1, bs=[1, 2, 4], avail mem=70.00 GB'\n"
        "exec sleep 60\n"
    )
    server.chmod(server.stat().st_mode | stat.S_IXUSR)
    recipe.update(name="sglang-standin", command=[str(server)], help=None, probes={})
    recipe_path = tmp_path / "sglang-standin.yaml"
    recipe_path.write_text(yaml.safe_dump(recipe, sort_keys=False))
    exp = tmp_path / "stall.yaml"
    exp.write_text(
        yaml.safe_dump(
            {
                "name": "stall",
                "host": {"kind": "local", "workdir": str(tmp_path / "box")},
                "recipe": str(recipe_path),
                "baseline": {"knobs": {}},
                "timeouts": {"ready_s": 3, "stop_grace_s": 2},
                "at_end": "stop",
            }
        )
    )
    res = cli("run", str(exp), "--json", runs=tmp_path / "runs")
    doc = json.loads(res.stdout)
    assert doc["attempts"][0]["failed_phase"] == "graph_capture", res.stderr
