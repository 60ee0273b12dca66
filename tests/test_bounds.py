"""The fault matrix's bounds and clean output (docs/reliability.md, review of 2026-12-05): a reply that trickles, a
gigabyte log line, a marker without a newline, escape sequences from a log or a planted lock, secrets on a command line.

Real servers (``tests/data/fault_server.py`` through a recipe file) and the real CLI; each case asserts the exit code,
the record and what reached the terminal.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.test_faults import runs, show
from tests.test_shared_box import REPO, fault_experiment, run_cli, state_env

__all__ = ["runs"]  # the fixture: a test's run store, and what its runs leave running killed afterwards


# -- N5, N11, N33: bounded ---------------------------------------------------------------------------------------------


def variant_attempt(report: dict[str, Any]) -> dict[str, Any]:
    """The attempt of variant ``v`` in a stored report."""
    return next(a for a in report["attempts"] if a["variant"] == "v" and a["role"] == "variant")


def test_a_reply_that_trickles_ends_at_the_smoke_deadline(tmp_path: Path, runs: Path) -> None:
    """N5: a reply that sends one byte every 2 s fails its question at ``smoke.timeout_s`` (3 s), the variant fails,
    the box is restored: exit 1 well before the review's 150 s."""
    path = fault_experiment(tmp_path, "n5", mode="drip", smoke={"questions": 1, "seed": 1, "burst": False})
    t0 = time.monotonic()
    res = run_cli(
        tmp_path / "state", runs, "run", str(path), "--set", "smoke.timeout_s=3", "--retry-known", timeout=240
    )
    took = time.monotonic() - t0
    assert res.returncode == 1, res.stdout + res.stderr
    att = variant_attempt(show(runs))
    assert att["outcome"] == "failed" and att["failed_phase"] == "smoke", att
    errors = [c["error"] for c in att["smoke"]["checks"]]
    assert errors and all("no reply within 3.0 s" in (e or "") for e in errors), errors
    assert took < 120, took
    assert show(runs)["final"]["healthy"]


@pytest.mark.xfail(
    reason="issue 28 open: the clean-clone CI run of 2026-12-05 measured the CLI's peak RSS at 797 MB (death noticed, "
    "variant failed, box restored, all in time); a reader after the bounded log copy still holds the line",
    strict=False,
)
def test_a_gigabyte_line_without_newline_keeps_the_deadline_and_memory(tmp_path: Path, runs: Path) -> None:
    """N11 (at 256 MiB, to spare the shared CI disk): a server writes a line with no newline and dies; the death is
    noticed, the variant fails in launch, the box is restored, and the CLI's peak RSS stays under 200 MB."""
    path = fault_experiment(tmp_path, "n11", mode="bigline")
    doc = yaml.safe_load(path.read_text())
    doc["variants"][0]["env"] = {"BIGLINE_MB": "256"}
    doc["timeouts"]["ready_s"] = 60
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    t0 = time.monotonic()
    # /usr/bin/time-like: the CLI's own peak RSS, read from its rusage when it is reaped.
    proc = subprocess.Popen(
        [sys.executable, "-m", "campaign.cli", "--runs-dir", str(runs), "run", str(path), "--retry-known"],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env=state_env(tmp_path / "state"),
    )
    assert proc.stderr is not None
    err = proc.stderr.read()
    proc.stderr.close()
    _pid, status, usage = os.wait4(proc.pid, 0)
    took = time.monotonic() - t0
    peak_kb = usage.ru_maxrss
    proc.returncode = os.waitstatus_to_exitcode(status)
    assert os.waitstatus_to_exitcode(status) == 1, err.decode(errors="replace")[-3000:]
    att = variant_attempt(show(runs))
    assert att["outcome"] == "failed" and att["exit_code"] == 1, att
    assert peak_kb < 200_000, f"peak RSS {peak_kb} kB"
    assert took < 200, took


def test_a_ready_marker_without_newline_is_seen(tmp_path: Path, runs: Path) -> None:
    """N33: a server that prints its ready marker with no newline and then serves is ready (not three timeouts)."""
    path = fault_experiment(tmp_path, "n33", mode="marker-nonl", at_end="stop")
    res = run_cli(tmp_path / "state", runs, "run", str(path), "--set", "timeouts.ready_s=15")
    assert res.returncode == 0, res.stdout + res.stderr
    assert variant_attempt(show(runs))["outcome"] == "passed"


# -- N6, N32: a clean terminal; N8, N26: secrets -----------------------------------------------------------------------


ESCAPES = ("\x1b]0;", "\x1b]52;", "\x1b[2J", "\x07")


def test_escape_sequences_from_a_log_or_a_planted_lock_never_reach_the_terminal(tmp_path: Path, runs: Path) -> None:
    """N6: a server log with OSC 0 / OSC 52 / CSI 2J shown by `diagnose`, `logs`; N32: a lock record holding them
    (as another user could plant) printed in the refusal: every control character shows as a visible escape."""
    log = tmp_path / "f.log"
    log.write_bytes(b"x\n\x1b]52;c;cm0gLXJmIH4vKgo=\x1b\\RuntimeError: CUDA out of memory.\n\x1b]0;PWNED\x07\n")
    diag = run_cli(tmp_path / "state", runs, "diagnose", str(log))
    assert not any(e in diag.stdout + diag.stderr for e in ESCAPES), repr(diag.stdout + diag.stderr)
    assert "\\x1b]52;" in diag.stdout + diag.stderr or "oom" in (diag.stdout + diag.stderr).lower()

    state = tmp_path / "state"
    path = fault_experiment(tmp_path, "n32", at_end="stop")
    assert run_cli(state, runs, "stop", str(path)).returncode == 0
    (state / "lock").mkdir()
    (state / "lock" / "owner.json").write_text(
        json.dumps({"user": "alice\x1b]52;c;cm0K\x1b\\", "run_id": "r\x1b[2J", "machine": "laptop\x1b]0;owned\x07"})
    )
    for command in ("run", "status"):
        res = run_cli(state, runs, command, str(path))
        text = res.stdout + res.stderr
        assert "alice" in text and not any(e in text for e in ESCAPES), repr(text)
        assert "\\x1b" in text
    assert run_cli(state, runs, "run", str(path)).returncode == 2


def test_a_secret_flag_is_masked_in_the_records_the_plan_and_the_followed_log(tmp_path: Path, runs: Path) -> None:
    """N8/N26: ``--api-key`` in args and ``HF_TOKEN`` in env: masked in report.json, experiment.yaml, the dry-run
    plan, the stored log and `logs --follow` (which learns them from the launch script on the host)."""
    path = fault_experiment(tmp_path, "n8", mode="secret-echo", at_end="last")
    doc = yaml.safe_load(path.read_text())
    doc["variants"][0]["args"] = ["--api-key", "sk-live-ARGSECRET-4242"]
    doc["variants"][0]["env"] = {"HF_TOKEN": "hf_ENVSECRET_9137"}
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    secrets_ = ("sk-live-ARGSECRET-4242", "hf_ENVSECRET_9137")
    plan = run_cli(tmp_path / "state", runs, "run", str(path), "--dry-run")
    assert plan.returncode == 0, plan.stderr
    assert "--api-key" in plan.stdout + plan.stderr
    assert not any(s in plan.stdout + plan.stderr for s in secrets_)
    res = run_cli(tmp_path / "state", runs, "run", str(path), "--variant", "v")
    assert res.returncode == 0, res.stdout + res.stderr
    assert not any(s in res.stdout + res.stderr for s in secrets_)
    # The known-good keeps its exact spec, secrets included (a restore needs them): 0600 files in a 0700 folder, as
    # the index; every other file of the store is masked.
    known = runs / ".known-goods"
    assert (known.stat().st_mode & 0o777) == 0o700
    assert all((f.stat().st_mode & 0o777) == 0o600 for f in known.iterdir())
    for stored in runs.rglob("*"):
        if stored.is_file() and stored.suffix != ".sqlite" and known not in stored.parents:
            assert not any(s.encode() in stored.read_bytes() for s in secrets_), stored
    follow = _follow_briefly(tmp_path, runs, variant_attempt(show(runs))["index"])
    assert "env HF_TOKEN=***" in follow and "--api-key ***" in follow, follow
    assert not any(s in follow for s in secrets_)
    assert run_cli(tmp_path / "state", runs, "stop", str(path)).returncode == 0


def _follow_briefly(tmp_path: Path, runs: Path, attempt: int) -> str:
    """`campaign logs last --attempt N --follow` for a few seconds (the server still runs), its output."""
    argv = ["logs", "last", "--attempt", str(attempt), "--follow"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "campaign.cli", "--runs-dir", str(runs), *argv],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env=state_env(tmp_path / "state"),
    )
    time.sleep(6)
    proc.terminate()
    out, _ = proc.communicate(timeout=20)
    return out.decode(errors="replace")


# -- N12, N13: YAML bounds ---------------------------------------------------------------------------------------------


def test_an_alias_bomb_and_deep_nesting_are_config_errors_at_once(tmp_path: Path) -> None:
    """N12: a 'billion laughs' tree (9 aliases a level, 10 levels) in args is one config error, exit 2, quickly and
    in little memory (it took 3 GB and was killed at 120 s); N13: 5 000 nested brackets, exit 2 with the file (it
    was exit 70, RecursionError)."""
    bomb = 'l0: &l0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]\n'
    for i in range(1, 10):
        bomb += f"l{i}: &l{i} [" + ",".join([f"*l{i - 1}"] * 9) + "]\n"
    bomb += "name: bomb\nhost: {kind: local}\nrecipe: refserver\nbaseline:\n  args: *l9\n"
    cases = {"bomb": (bomb, "expands to more than"), "deep": ("name: deep\nx: " + "[" * 5000 + "]" * 5000, "nested")}
    for name, (text, what) in cases.items():
        path = tmp_path / f"{name}.yaml"
        path.write_text(text)
        t0 = time.monotonic()
        res = run_cli(tmp_path / "state", tmp_path / "runs", "run", str(path), "--dry-run", timeout=60)
        assert res.returncode == 2, res.stderr
        assert f"{path}" in res.stderr and what in res.stderr, res.stderr
        assert time.monotonic() - t0 < 30


# -- N25: logs --follow and a rotated log ------------------------------------------------------------------------------


def test_follow_says_when_the_log_is_rotated_and_follows_the_new_one(tmp_path: Path, runs: Path) -> None:
    """N25: `logs --follow` on a log that is rotated (`mv server.log server.log.1`, a new server.log) says so and
    shows the new file's lines (it went silent)."""
    state = tmp_path / "state"
    path = fault_experiment(tmp_path, "n25", at_end="last")
    res = run_cli(state, runs, "run", str(path), "--variant", "v")
    assert res.returncode == 0, res.stdout + res.stderr
    att = variant_attempt(show(runs))
    log = Path(att["remote_dir"]) / "server.log"
    argv = ["logs", "last", "--attempt", str(att["index"]), "--follow"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "campaign.cli", "--runs-dir", str(runs), *argv],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env=state_env(state),
    )
    try:
        time.sleep(4)
        with log.open("a") as f:
            f.write("line-before-rotation\n")
        time.sleep(2)
        log.rename(log.with_name("server.log.1"))
        log.write_text("line-after-rotation\n")
        time.sleep(4)
    finally:
        proc.terminate()
        out, _ = proc.communicate(timeout=20)
    text = out.decode(errors="replace")
    assert "line-before-rotation" in text and "line-after-rotation" in text, text
    assert "was replaced (rotated?)" in text, text
    assert run_cli(state, runs, "stop", str(path)).returncode == 0


# -- N4, N24: an unresponsive server ----------------------------------------------------------------------------------


def test_a_server_that_never_answers_is_unresponsive_not_a_numerics_bug(tmp_path: Path, runs: Path) -> None:
    """N4: /health answers 200 but completions never do: the variant is `unresponsive` with its process state (it was
    `wrong_output`, "a numerics bug"), the box restored, exit 1."""
    path = fault_experiment(tmp_path, "n4", mode="hang", smoke={"questions": 1, "seed": 1, "burst": False})
    res = run_cli(
        tmp_path / "state", runs, "run", str(path), "--set", "smoke.timeout_s=3", "--retry-known", timeout=300
    )
    assert res.returncode == 1, res.stdout + res.stderr
    att = variant_attempt(show(runs))
    assert att["diagnosis"]["kind"] == "unresponsive", att["diagnosis"]
    assert "process state: PID" in att["diagnosis"]["summary"] and "(sleeping)" in att["diagnosis"]["summary"]
    assert show(runs)["final"]["healthy"]
