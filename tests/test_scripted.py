"""The pipeline in-process at the Host seam (the fast tier): restore failing, retries, the deadline, resume,
isolation, known failures and fleets, each against the scripted server of tests/scripted, in seconds.

The same behaviours are tested end to end through the CLI against the reference server in the integration tier
(tests/test_faults.py, tests/test_longrun.py, tests/test_attribution_loop.py, tests/test_fleet.py).
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from rich.console import Console

from campaign.console.run import render_report
from campaign.errors import CampaignError
from campaign.outcome import exit_code
from tests.fixtures.refserver import free_port
from tests.scripted import Fault, ScriptedHost, experiment, fleet_hosts, run, run_fleet, stop_what_runs


@pytest.fixture(autouse=True)
def _servers_end_with_the_test() -> Iterator[None]:
    """Each run leaves its known-good serving, as `campaign run` does; the test stops them when it ends."""
    yield
    stop_what_runs()


def _tried(report: object) -> list[tuple[str, str, str, str | None]]:
    """(variant, role, outcome, diagnosed kind) of every attempt, in order."""
    return [
        (a.variant, a.role, a.outcome, a.diagnosis.kind if a.diagnosis else None)
        for a in report.attempts  # type: ignore[attr-defined]
    ]


def test_a_failed_variant_is_diagnosed_and_the_known_good_proven_again(tmp_path: Path) -> None:
    path = experiment(tmp_path, free_port(), [{"name": "oom", "script": "die:gpu_oom--sglang"}])
    report = run(path, tmp_path / "runs")
    assert _tried(report)[:2] == [("baseline", "variant", "passed", None), ("oom", "variant", "failed", "gpu_oom")]
    assert [r.outcome for r in report.restores] == ["restored"] and report.restores[0].variant == "baseline"
    # The report says how it came back (a relaunch: nothing was parked) and what that took, part by part.
    (restore,) = report.restores
    (again,) = [a for a in report.attempts if a.role == "restore"]
    assert restore.mode == "relaunch"
    assert restore.phases == {
        "stop_s": again.timings.stop_s,
        "launch_to_ready_s": again.timings.launch_to_ready_s,
        "smoke_s": again.timings.smoke_s,
    }
    assert all(v is not None and v >= 0 for v in restore.phases.values())
    shown = Console(record=True, width=300)
    render_report(shown, report)
    assert f"restore after #{restore.attempt} by relaunch: ready in" in shown.export_text()
    assert report.status == "failed" and exit_code(report) == 1
    assert report.final.healthy and report.final.variant == "baseline"
    # The build that ran is in the report: the commit campaign ran from (git's own answer), and the version naming it.
    head = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
    assert (report.environment.campaign_commit or "").startswith(head)
    assert f"+g{head[:12]}" in (report.environment.campaign_version or "")


def test_a_restore_that_fails_leaves_the_run_unproven_exit_3(tmp_path: Path) -> None:
    # The baseline serves at its first launch and dies at its second: the restore after the variant's failure.
    typo = {"name": "typo", "script": "die:bad_args--refserver"}
    path = experiment(tmp_path, free_port(), [typo], baseline="ok,die:gpu_oom--sglang")
    report = run(path, tmp_path / "runs")
    assert _tried(report) == [
        ("baseline", "variant", "passed", None),
        ("typo", "variant", "failed", "bad_args"),
        ("baseline", "restore", "failed", "gpu_oom"),
    ]
    assert report.status == "restore_failed" and exit_code(report) == 3
    assert [r.mode for r in report.restores] == ["relaunch"]  # tried as a relaunch, and failed
    assert not report.final.healthy and "did not come back" in (report.final.detail or "")


def test_a_transient_failure_is_retried_and_passes(tmp_path: Path) -> None:
    path = experiment(tmp_path, free_port(), [{"name": "flaky", "script": "die:nccl_error,ok"}])
    report = run(path, tmp_path / "runs")
    flaky = [a for a in report.attempts if a.variant == "flaky"]
    assert [(a.outcome, a.diagnosis.kind if a.diagnosis else None) for a in flaky] == [
        ("failed", "nccl_error"),
        ("passed", None),
    ]
    assert flaky[1].retry_of == flaky[0].index
    assert report.status == "passed" and exit_code(report) == 0


def test_a_deterministic_failure_is_tried_once_and_skipped_as_known_next_time(tmp_path: Path) -> None:
    port = free_port()
    path = experiment(tmp_path, port, [{"name": "typo", "script": "die:bad_args--refserver"}])
    first = run(path, tmp_path / "runs")
    assert [a.outcome for a in first.attempts if a.variant == "typo"] == ["failed"]  # not retried: deterministic
    again = run(path, tmp_path / "runs")
    (typo,) = [a for a in again.attempts if a.variant == "typo"]
    assert (typo.known_failure or "").startswith(f"{first.run_id}#")
    assert typo.timings.launch_to_ready_s is None  # never launched
    forced = run(path, tmp_path / "runs", retry_known=True)
    assert [a.known_failure for a in forced.attempts if a.variant == "typo"] == [None]


def test_the_deadline_ends_the_run_cleanly_and_resume_runs_the_rest(tmp_path: Path) -> None:
    port = free_port()
    variants = [{"name": "a", "script": "ok"}, {"name": "b", "script": "ok"}]
    history = run(experiment(tmp_path, port, variants), tmp_path / "runs")  # what the estimate learns from
    assert history.status == "passed"
    short = run(experiment(tmp_path, port, variants, deadline=0.001), tmp_path / "runs")
    assert short.status == "passed" and short.attempts == []
    assert short.not_run == ["baseline", "a", "b"] and "deadline" in (short.ended_early or "")
    resumed = run(experiment(tmp_path, port, variants), tmp_path / "runs", resume=short)
    assert resumed.run_id == short.run_id and resumed.not_run == []
    assert [(a.variant, a.outcome) for a in resumed.attempts] == [
        ("baseline", "passed"),
        ("a", "passed"),
        ("b", "passed"),
    ]
    assert [r.remaining for r in resumed.resumes] == [["baseline", "a", "b"]]


def test_isolation_names_the_knob_that_explains_the_failure(tmp_path: Path) -> None:
    path = experiment(
        tmp_path, free_port(), [{"name": "both", "script": "die:bad_args--refserver", "flavor": "spicy"}], isolate=True
    )
    report = run(path, tmp_path / "runs")
    # One knob back at a time: the script back to the baseline's serves, the flavor back still fails.
    isolating = {a.knobs["script"]: a.outcome for a in report.attempts if a.role == "isolation"}
    assert isolating == {"ok": "passed", "die:bad_args--refserver": "failed"}
    (finding,) = [f for f in report.attribution if f.status == "explained"]
    assert finding.cause == {"script": "die:bad_args--refserver"}


def test_a_fleet_runs_every_variant_once_over_its_hosts(tmp_path: Path) -> None:
    variants = [{"name": f"v{i}", "script": "ok"} for i in range(3)]
    path = experiment(tmp_path, free_port(), variants, hosts=fleet_hosts(tmp_path, [free_port(), free_port()]))
    a, b = ScriptedHost(name="box-a"), ScriptedHost(name="box-b")
    report = run_fleet(path, tmp_path / "runs", [a, b])
    assert report.status == "passed" and exit_code(report) == 0
    ran = [(att.variant, att.host) for att in report.attempts if att.role == "variant"]
    assert sorted(v for v, _ in ran if v != "baseline") == ["v0", "v1", "v2"]  # each claimed once
    assert sorted(h for v, h in ran if v == "baseline") == ["box-a", "box-b"]  # each box proves its own baseline
    assert {h.host for h in report.hosts} == {"box-a", "box-b"}
    assert a.calls and b.calls


def test_a_host_that_fails_mid_run_ends_it_unproven_with_the_lock_released(tmp_path: Path) -> None:
    # The baseline's launch runs; the variant's launch command meets a host that cannot run it.
    host = ScriptedHost(faults=[Fault(r"launch\.sh", error="connection reset by peer", skip=1)])
    path = experiment(tmp_path, free_port(), [{"name": "v", "script": "ok"}])
    try:
        report = run(path, tmp_path / "runs", host=host)
    except CampaignError as e:
        assert e.exit_code == 3, e
    else:
        raise AssertionError(f"the run ended {report.status}")
    assert not (tmp_path / "hoststate" / "lock").exists()
