"""The `campaign` command as a user runs it: the installed entry point, in a subprocess.

Usage errors exit 2 with the usage line and the help hint; bad input exits 2 with one clear line (never a traceback,
never "internal error"); every ``--json`` document is a record's JSON, checked against that record's schema.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from campaign import __version__
from campaign.bench.testing import ScheduledServer
from campaign.compare import Comparison
from campaign.records import (
    BenchResult,
    Diagnosis,
    ErrorDocument,
    FailureGroup,
    Healing,
    HostStatus,
    RunPlan,
    RunReport,
    RunRow,
    StopReport,
)
from campaign.version import BASE
from tests.fixtures.stored import kept

REPO = Path(__file__).resolve().parents[1]
ENTRY = Path(sys.executable).with_name("campaign")
STORED = REPO / "tests" / "data" / "reports" / "schema1-bench-isolate.json"
A_LOG = next((REPO / "tests" / "data" / "variants").glob("*.log"))


def campaign(*args: str, runs: Path | None = None, shell: str | None = None) -> subprocess.CompletedProcess[str]:
    """Run the installed `campaign` script (its console-script entry point) as a user would (from ``shell``)."""
    assert ENTRY.exists(), f"the entry point {ENTRY} is not installed: run `make setup`"
    pre = ["--runs-dir", str(runs)] if runs is not None else []
    # Wide enough that no message is wrapped inside the error panel.
    env = {**os.environ, "COLUMNS": "240"} | ({"SHELL": shell} if shell else {})
    return subprocess.run([str(ENTRY), *pre, *args], cwd=REPO, capture_output=True, text=True, timeout=120, env=env)


def _no_crash(res: subprocess.CompletedProcess[str]) -> None:
    text = res.stdout + res.stderr
    assert "Traceback" not in text and "internal error" not in text, text


@pytest.mark.parametrize(
    ("args", "command", "says"),
    [
        ((), "campaign", "Missing command"),
        (("nosuch",), "campaign", "No such command 'nosuch'"),
        (("run", "--bogus", "quickstart"), "campaign run", "No such option: --bogus"),
        (("run",), "campaign run", "Missing argument"),
        (("runs", "--limit", "many"), "campaign runs", "Invalid value for '--limit'"),
        (("bench", "http://127.0.0.1:1", "--concurrency", "1,x"), "campaign bench", "expected numbers"),
        (("compare", "a", "b", "--md", "--csv"), "campaign compare", "choose one of"),
    ],
)
def test_usage_errors_exit_2_with_the_usage_and_the_help_hint(args: tuple[str, ...], command: str, says: str) -> None:
    res = campaign(*args)
    assert res.returncode == 2, res.stderr
    assert f"Usage: {command} " in res.stderr
    assert f"Try '{command} --help' for help." in res.stderr
    assert says in res.stderr
    assert res.stdout == ""
    _no_crash(res)


@pytest.mark.parametrize("flag", ["-h", "--help"])
def test_help(flag: str) -> None:
    top = campaign(flag)
    assert top.returncode == 0 and "Usage: campaign [OPTIONS] COMMAND" in top.stdout
    assert "bench" in top.stdout and "compare" in top.stdout
    sub = campaign("run", flag)
    assert sub.returncode == 0 and "Usage: campaign run [OPTIONS]" in sub.stdout and "--dry-run" in sub.stdout


@pytest.mark.parametrize("flag", ["--version", "-V"])
def test_version_names_the_commit(flag: str) -> None:
    res = campaign(flag)
    assert res.returncode == 0 and res.stdout == f"campaign {__version__}\n"
    head = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, cwd=REPO, check=True).stdout
    assert res.stdout.startswith(f"campaign {BASE}+g{head[:12]}")


def test_without_git_the_version_is_the_release(tmp_path: Path) -> None:
    """An installed copy (no checkout around it) says the release alone and records no commit."""
    copy = tmp_path / "site" / "campaign"
    copy.mkdir(parents=True)
    shutil.copy(REPO / "campaign" / "version.py", copy / "version.py")
    code = "import version; print(version.version(), version.commit())"
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=copy, check=True)
    assert res.stdout.split() == [BASE, "None"]


def test_shell_completion_script() -> None:
    # From bash, whatever runs the tests: typer finds the shell from the process tree, and make runs its recipes
    # (pytest among them) under /bin/sh, which it cannot complete for. `; exit` keeps bash from exec-ing the command.
    env = {**os.environ, "SHELL": "/bin/bash"}
    res = subprocess.run(
        ["bash", "-c", f"'{ENTRY}' --show-completion bash; exit $?"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert res.returncode == 0, res.stderr
    assert "complete" in res.stdout and "_CAMPAIGN_COMPLETE" in res.stdout


def test_a_binary_config_file_is_a_config_error(tmp_path: Path) -> None:
    binary = tmp_path / "exp.yaml"
    binary.write_bytes(bytes(range(256)))
    res = campaign("run", str(binary), "--dry-run")
    assert res.returncode == 2
    assert f"{binary}: not a text file" in res.stderr
    _no_crash(res)


def test_a_port_out_of_range_is_a_clear_error() -> None:
    res = campaign("bench", "http://127.0.0.1:99999", "-c", "1", "--requests", "1")
    assert res.returncode == 2
    assert "port 99999" in res.stderr and "out of range" in res.stderr
    _no_crash(res)


def test_a_runs_dir_that_is_a_file(tmp_path: Path) -> None:
    not_a_dir = tmp_path / "runs"
    not_a_dir.write_text("")
    res = campaign("runs", runs=not_a_dir)
    assert res.returncode == 2
    assert "--runs-dir" in res.stderr and "is a file" in res.stderr
    _no_crash(res)


def test_an_unknown_run_is_a_store_error(tmp_path: Path) -> None:
    res = campaign("show", "no-such-run", runs=tmp_path)
    assert res.returncode == 2 and "error:" in res.stderr
    _no_crash(res)


# -- --json documents are records -------------------------------------------------------------------------------------


def _as(model: type[BaseModel], text: str) -> dict[str, Any]:
    """``text`` parsed, after checking it is exactly ``model``'s serialisation (no key more, none less)."""
    doc: dict[str, Any] = json.loads(text)
    value = model.model_validate_json(text)
    assert json.loads(value.model_dump_json()) == doc
    return doc


def _as_list(model: type[BaseModel], text: str) -> list[dict[str, Any]]:
    """``text`` parsed, after checking it is a list whose every item is exactly ``model``'s serialisation."""
    docs = json.loads(text)
    assert isinstance(docs, list)
    return [_as(model, json.dumps(doc)) for doc in docs]


@pytest.fixture
def store_with_a_run(tmp_path: Path) -> tuple[Path, str]:
    raw = json.loads(STORED.read_text())
    run_dir = tmp_path / "runs" / raw["run_id"]
    run_dir.mkdir(parents=True)
    shutil.copy(STORED, run_dir / "report.json")
    return tmp_path / "runs", str(raw["run_id"])


def test_dry_run_json_is_a_run_plan(tmp_path: Path) -> None:
    res = campaign("run", "quickstart", "--dry-run", "--json", "--set", f"host.workdir={tmp_path}", runs=tmp_path)
    assert res.returncode == 0, res.stderr
    doc = _as(RunPlan, res.stdout)
    assert [v["name"] for v in doc["variants"]] == ["baseline", "cuda-graphs", "max-batch-8"]
    assert not (tmp_path / "index.sqlite").exists()  # a dry run touches nothing


def test_show_json_is_the_report(store_with_a_run: tuple[Path, str]) -> None:
    runs, run_id = store_with_a_run
    res = campaign("show", run_id, "--json", runs=runs)
    assert res.returncode == 0, res.stderr
    kept(json.loads(STORED.read_text()), _as(RunReport, res.stdout))


def test_compare_json_is_a_comparison(store_with_a_run: tuple[Path, str]) -> None:
    runs, run_id = store_with_a_run
    res = campaign("compare", run_id, run_id, "--json", runs=runs)
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout)
    assert Comparison.model_validate(doc).model_dump(mode="json") == doc
    assert doc["tables"] and doc["runs"] == [run_id, run_id]


def test_runs_json_is_a_list_of_rows(tmp_path: Path) -> None:
    res = campaign("runs", "--json", runs=tmp_path)
    assert res.returncode == 0, res.stderr
    assert _as_list(RunRow, res.stdout) == []


def test_runs_and_failures_json_of_a_stored_run(store_with_a_run: tuple[Path, str]) -> None:
    runs, run_id = store_with_a_run
    listed = campaign("runs", "--json", runs=runs)
    assert listed.returncode == 0, listed.stderr
    (row,) = _as_list(RunRow, listed.stdout)
    assert row["run_id"] == run_id and row["failed"] == 2
    failures = campaign("runs", "--failures", "--json", runs=runs)
    assert failures.returncode == 0, failures.stderr
    (group,) = _as_list(FailureGroup, failures.stdout)
    assert group["count"] == 2 and group["runs"] == [run_id]


def test_doctor_json_is_the_healing(store_with_a_run: tuple[Path, str]) -> None:
    runs, _ = store_with_a_run
    res = campaign("doctor", "--json", runs=runs)
    assert res.returncode == 0, res.stderr
    doc = _as(Healing, res.stdout)
    assert doc["rebuilt"] == "asked" and doc["reports"] == 1 and doc["unreadable"] == []


def test_bench_json_is_a_bench_result() -> None:
    with ScheduledServer(ttft_ms=2, itl_ms=1, tokens=2) as srv:
        res = campaign("bench", srv.url, "-c", "1", "-n", "2", "--warmup", "0", "--json")
    assert res.returncode == 0, res.stderr
    doc = _as(BenchResult, res.stdout)
    assert [lv["label"] for lv in doc["levels"]] == ["c=1"]


def test_status_and_stop_json_on_a_quiet_host(tmp_path: Path) -> None:
    box = f"host.workdir={tmp_path / 'box'}"
    status = campaign("status", "quickstart", "--set", box, "--json", runs=tmp_path)
    assert status.returncode == 0, status.stderr
    doc = _as(HostStatus, status.stdout)
    assert doc["running"] is None and doc["host"] == "local"
    stop = campaign("stop", "quickstart", "--set", box, "--json", runs=tmp_path)
    assert stop.returncode == 0, stop.stderr
    report = _as(StopReport, stop.stdout)
    assert report["clean"] and not report["stopped"]


def test_diagnose_json_is_a_diagnosis() -> None:
    res = campaign("diagnose", str(A_LOG), "--json")
    assert res.returncode == 0, res.stderr
    assert _as(Diagnosis, res.stdout)["kind"]


def test_an_error_under_json_is_an_error_document(tmp_path: Path) -> None:
    unknown = campaign("show", "no-such-run", "--json", runs=tmp_path)
    assert unknown.returncode == 2
    doc = _as(ErrorDocument, unknown.stdout)
    assert doc["kind"] == "StoreError" and doc["exit_code"] == 2 and doc["file"] is None
    binary = tmp_path / "exp.yaml"
    binary.write_bytes(bytes(range(256)))
    bad = campaign("run", str(binary), "--dry-run", "--json", runs=tmp_path)
    assert bad.returncode == 2
    doc = _as(ErrorDocument, bad.stdout)
    assert doc["kind"] == "ConfigError" and doc["file"] == str(binary)
