"""Recipes checked against the server they launch: flags from the server's own --help, spellings by version.

The help texts in tests/data/help/ are recorded from the real vLLM 0.34.0 and SGLang 0.5.23 packages (see its
README). The CLI tests put them behind a stand-in interpreter / `vllm` executable on PATH (the seam is the host's
program, which answers --version and --help as the real one did); the reference server's tests use the real one.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from campaign.config import Experiment, load_recipe, plan
from campaign.errors import ConfigError
from campaign.flags import ServerHelp, check_plan, parse_help, rendered_flags

REPO = Path(__file__).resolve().parents[1]
HELP = REPO / "tests" / "data" / "help"
SGLANG = "0.5.23"
VLLM = "0.34.0"


def recorded(name: str, version: str) -> ServerHelp:
    text = (HELP / f"{name}-{version}.txt").read_text()
    return ServerHelp(name, "local", version, "host", parse_help(text), text)


def every_knob(recipe: str, extra: dict[str, list[Any]]) -> Experiment:
    """An experiment whose matrix gives every knob of the recipe each of its kinds of value."""
    axes: dict[str, list[Any]] = {"torch_compile": [False, True], "cuda_graph": [False, True], **extra}
    return Experiment.model_validate(
        {
            "name": f"all-{recipe}",
            "recipe": recipe,
            "vars": {"model": "deepseek-ai/DeepSeek-V3.2-Exp"},
            "baseline": {"knobs": {"port": 30001}},
            "matrix": {"axes": axes},
        }
    )


SGLANG_AXES: dict[str, list[Any]] = {
    "attention": ["flashinfer"],
    "dsa_decode": ["flashmla_kv"],
    "dsa_prefill": ["flashmla_sparse"],
    "cuda_graph_max_bs": [16],
    "mem_fraction": [0.8],
    "max_batch": [64],
    "tp": [8],
}
VLLM_AXES: dict[str, list[Any]] = {"attention": ["FLASH_ATTN"], "mem_fraction": [0.8], "max_batch": [64], "tp": [8]}


def test_the_sglang_recipe_renders_only_flags_the_current_sglang_lists() -> None:
    recipe = load_recipe("sglang")
    exp = every_knob("sglang", SGLANG_AXES)
    planned = plan(exp, recipe, server_version=SGLANG)
    assert len(planned) == 1 + 4  # the baseline, then torch_compile x cuda_graph (every other axis has one value)
    notes = check_plan(exp, recipe, planned, recorded("sglang", SGLANG))
    assert notes == []
    words = {w for p in planned for w in p.spec.command}
    assert {"--cuda-graph-max-bs-decode", "--disable-decode-cuda-graph", "--dsa-decode-backend"} <= words
    assert "--cuda-graph-max-bs" not in words and "--disable-cuda-graph" not in words


def test_the_vllm_recipe_renders_only_flags_the_current_vllm_lists() -> None:
    recipe = load_recipe("vllm")
    exp = every_knob("vllm", VLLM_AXES)
    planned = plan(exp, recipe, server_version=VLLM)
    assert check_plan(exp, recipe, planned, recorded("vllm", VLLM)) == []
    assert {f for p in planned for f in rendered_flags(p.spec.command, 2)} >= {"-cc", "--attention-backend"}


def test_vllm_compile_off_with_graphs_on_asks_for_full_graphs_instead_of_running_eager() -> None:
    recipe = load_recipe("vllm")
    exp = every_knob("vllm", {})
    by_knobs = {(p.knobs.get("torch_compile"), p.knobs.get("cuda_graph")): p.spec.command for p in plan(exp, recipe)}
    assert by_knobs[(False, True)][-2:] == ["-cc.mode=0", "-cc.cudagraph_mode=FULL_DECODE_ONLY"]
    assert "-cc.cudagraph_mode=FULL_DECODE_ONLY" not in by_knobs[(True, True)]
    assert by_knobs[(False, False)][-2:] == ["-cc.mode=0", "-cc.cudagraph_mode=NONE"]


@pytest.mark.parametrize(
    ("version", "expected", "gone"),
    [
        ("0.5.10", {"--cuda-graph-max-bs", "--disable-cuda-graph", "--nsa-decode-backend"}, {"--dsa-decode-backend"}),
        ("0.5.13", {"--cuda-graph-max-bs", "--disable-cuda-graph", "--dsa-decode-backend"}, set()),
        ("0.5.19", {"--cuda-graph-max-bs-decode", "--disable-cuda-graph"}, {"--cuda-graph-max-bs"}),
        ("0.5.20", {"--cuda-graph-max-bs-decode", "--disable-prefill-cuda-graph"}, {"--disable-cuda-graph"}),
        ("0.5.23.post1", {"--cuda-graph-max-bs-decode", "--disable-decode-cuda-graph"}, {"--cuda-graph-max-bs"}),
    ],
)
def test_sglang_spellings_follow_the_servers_version(version: str, expected: set[str], gone: set[str]) -> None:
    words = {
        w
        for p in plan(every_knob("sglang", SGLANG_AXES), load_recipe("sglang"), server_version=version)
        for w in p.spec.command
    }
    assert expected <= words
    assert not gone & words


def test_an_old_spelling_is_refused_with_the_version_and_the_nearest_current_ones() -> None:
    recipe = load_recipe("sglang")
    exp = every_knob("sglang", {"cuda_graph_max_bs": [16]})
    old = plan(exp, recipe, server_version="0.5.13")  # rendered for an old build, checked against the current one
    with pytest.raises(ConfigError) as err:
        check_plan(exp, recipe, old, recorded("sglang", SGLANG))
    assert "sglang 0.5.23" in str(err.value) and "--cuda-graph-max-bs" in str(err.value)
    assert "knob cuda_graph_max_bs" in str(err.value)
    assert err.value.hint is not None and "--cuda-graph-max-bs-decode" in err.value.hint


def test_option_lines_count_and_prose_does_not() -> None:
    flags = parse_help((HELP / f"vllm-{VLLM}.txt").read_text())
    # "--port" appears in prose of --grpc's description too; both it and the aliases on option lines count once.
    assert {"--port", "-cc", "--compilation-config", "-tp", "--tensor-parallel-size"} <= flags.flags
    sglang = parse_help((HELP / f"sglang-{SGLANG}.txt").read_text())
    assert "--disable-cuda-graph" in sglang.deprecated
    # Named only in the help of --disable-cuda-graph ("Use --cuda-graph-backend-{decode,prefill}=disabled").
    assert "--cuda-graph-backend-{decode,prefill}" not in sglang.flags
    assert rendered_flags(["vllm", "serve", "m", "-cc.mode=0", "--x=1", "-1", "--max-num-seqs", "8"], 2) == [
        "-cc",
        "--x",
        "--max-num-seqs",
    ]


# -- the CLI, as a user runs it ----------------------------------------------------------------------------------------


def stand_in(tmp: Path) -> Path:
    """A folder with `python3-sglang` and `python3-vllm` programs that answer version and --help as recorded."""
    bin_dir = tmp / "bin"
    bin_dir.mkdir()
    scripts = {
        "python3-sglang": (
            f'case "$*" in *"import sglang"*) echo {SGLANG};; *"sglang.launch_server --help"*) '
            f'cat "{HELP}/sglang-{SGLANG}.txt";; *) echo "not this build: $*" >&2; exit 1;; esac'
        ),
        # The recipe's version probe and --help; the parser dump (`-c SOURCE vllm`) fails as on a box whose vLLM
        # cannot build its parser, so the recorded help is what the plan is checked against.
        "python3-vllm": (
            f'case "$*" in *"import vllm; print"*) echo {VLLM};; '
            f'*"vllm.entrypoints.openai.api_server --help=all"*) cat "{HELP}/vllm-{VLLM}.txt";; '
            '*) echo "not this build: $*" >&2; exit 1;; esac'
        ),
    }
    for name, body in scripts.items():
        path = bin_dir / name
        path.write_text("#!/bin/sh\n" + body + "\n")
        path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return bin_dir


def cli(*args: str, runs: Path, path: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    if path is not None:
        env["PATH"] = f"{path}:{env['PATH']}"
    return subprocess.run(
        [sys.executable, "-m", "campaign.cli", "--runs-dir", str(runs), *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )


def write(tmp: Path, doc: dict[str, Any]) -> Path:
    path = tmp / f"{doc['name']}.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def test_dry_run_of_a_flag_sglang_does_not_have_exits_2_naming_flag_and_version(tmp_path: Path) -> None:
    bin_dir = stand_in(tmp_path)
    box = tmp_path / "box"
    exp = write(
        tmp_path,
        {
            "name": "sgl",
            "host": {"kind": "local", "workdir": str(box)},
            "recipe": "sglang",
            "vars": {"python": str(bin_dir / "python3-sglang"), "model": "m"},
            "baseline": {"knobs": {"attention": "flashinfer"}},
            "variants": [{"name": "old-max-bs", "args": ["--cuda-graph-max-bs", "16"]}],
        },
    )
    res = cli("run", str(exp), "--dry-run", runs=tmp_path / "runs", path=bin_dir)
    assert res.returncode == 2, res.stderr
    assert "sglang 0.5.23" in res.stderr and "no flag --cuda-graph-max-bs " in res.stderr
    assert "old-max-bs" in res.stderr and "--cuda-graph-max-bs-decode" in res.stderr
    assert f"{exp}:" in res.stderr  # file:line of the variant, for an editor to jump to
    assert "Traceback" not in res.stderr
    assert not box.exists()  # nothing was prepared, stopped or launched


def test_dry_run_checks_the_vllm_plan_and_reads_help_once_per_version(tmp_path: Path) -> None:
    bin_dir = stand_in(tmp_path)
    doc = {
        "name": "vl",
        "host": {"kind": "local", "workdir": str(tmp_path / "box")},
        "recipe": "vllm",
        "vars": {"python": str(bin_dir / "python3-vllm"), "model": "m"},
        "matrix": {"axes": {"torch_compile": [False, True], "cuda_graph": [False, True]}},
    }
    exp = write(tmp_path, doc)
    runs = tmp_path / "runs"
    first = cli("run", str(exp), "--dry-run", "--json", runs=runs, path=bin_dir)
    assert first.returncode == 0, first.stderr
    plan_doc = json.loads(first.stdout)
    flags = plan_doc["flags"]
    assert (flags["checked"], flags["server_version"], flags["source"]) == (True, VLLM, "host"), flags
    assert [n for n in flags["notes"] if "parser not used" in n and "checked against --help" in n], flags
    again = cli("run", str(exp), "--dry-run", "--json", runs=runs, path=bin_dir)
    assert json.loads(again.stdout)["flags"]["source"] == "cache"
    doc["variants"], doc["matrix"] = [{"name": "typo", "args": ["--max-num-seq", "8"]}], None
    bad = cli("run", str(write(tmp_path, doc)), "--dry-run", runs=runs, path=bin_dir)
    assert bad.returncode == 2
    assert "vllm 0.34.0" in bad.stderr and "--max-num-seq " in bad.stderr and "--max-num-seqs" in bad.stderr


@pytest.mark.integration  # the real reference server's --help, through the CLI
def test_the_reference_server_refuses_an_unknown_flag_before_anything_runs(tmp_path: Path) -> None:
    box = tmp_path / "box"
    doc = {
        "name": "ref",
        "host": {"kind": "local", "workdir": str(box)},
        "recipe": "refserver",
        "vars": {"python": sys.executable},
        "baseline": {"knobs": {"device": "cpu", "cuda_graph": False, "port": 31997}},
        "variants": [{"name": "typo", "args": ["--cuda-graph-max-bz", "8"]}],
    }
    exp = write(tmp_path, doc)
    dry = cli("run", str(exp), "--dry-run", runs=tmp_path / "runs")
    assert dry.returncode == 2, dry.stderr
    assert "refserver 0.1.0+" in dry.stderr and "--cuda-graph-max-bz" in dry.stderr
    assert "--cuda-graph-max-bs" in dry.stderr
    real = cli("run", str(exp), "--json", runs=tmp_path / "runs")
    assert real.returncode == 2, real.stderr
    assert "--cuda-graph-max-bz" in real.stderr
    reports = list((tmp_path / "runs").glob("*/report.json"))
    assert len(reports) == 1
    report = json.loads(reports[0].read_text())
    assert report["status"] == "aborted" and report["attempts"] == []  # nothing was stopped or launched


def test_a_value_the_servers_help_does_not_list_is_refused() -> None:
    recipe = load_recipe("sglang")
    exp = every_knob("sglang", {"attention": ["mma"]})
    with pytest.raises(ConfigError) as err:
        check_plan(exp, recipe, plan(exp, recipe, server_version=SGLANG), recorded("sglang", SGLANG))
    assert "does not accept --attention-backend mma" in str(err.value) and "sglang 0.5.23" in str(err.value)
    assert err.value.hint is not None and "registered" in err.value.hint


def test_the_deepseek_example_selects_its_kernel_with_a_flag_the_current_sglang_lists() -> None:
    from campaign.config import load

    loaded = load(str(REPO / "configs" / "sglang-deepseek.yaml"))
    planned = plan(loaded.experiment, loaded.recipe, server_version=SGLANG)
    assert check_plan(loaded.experiment, loaded.recipe, planned, recorded("sglang", SGLANG)) == []
    commands = [p.spec.command for p in planned]
    assert all("--attention-backend" not in c for c in commands)
    assert {c[c.index("--dsa-decode-backend") + 1] for c in commands} == {"flashmla_sparse", "flashmla_kv"}


def test_a_server_that_is_not_installed_leaves_the_flags_unchecked_and_says_why(tmp_path: Path) -> None:
    exp = write(
        tmp_path,
        {
            "name": "nosgl",
            "host": {"kind": "local", "workdir": str(tmp_path / "box")},
            "recipe": "sglang",
            "vars": {"python": sys.executable, "model": "m"},  # campaign's own interpreter has no sglang
        },
    )
    res = cli("run", str(exp), "--dry-run", "--json", runs=tmp_path / "runs")
    assert res.returncode == 0, res.stderr
    flags = json.loads(res.stdout)["flags"]
    assert flags["checked"] is False and "No module named 'sglang'" in flags["detail"]
    assert "flags not checked" in res.stderr
