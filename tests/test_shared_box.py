"""The fault matrix on a box several users share (docs/reliability.md, review of 2026-12-05): ownership decides trust.

A real second Unix user (``campaign-other``, created here with ``useradd`` when missing; the tests need root or
password-less sudo, and are skipped without either) plays the other engineer on the box. It writes records, makes
folders first and plants symbolic links, with ``sh``, ``mkdir`` and ``ln`` only; the CLI runs as the test's user.
Each case asserts what a user would check: the exit code, the victim process alive, the victim file and folder
unchanged, nothing of campaign's left running.

The servers are ``tests/data/fault_server.py`` through a recipe file (an experiment's ``recipe:`` may be a path).
"""

from __future__ import annotations

import json
import os
import socket
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from campaign.hosts.local import LocalHost
from campaign.processes import tree
from tests.test_faults import alive, free_port, ours_running, runs, show

__all__ = ["runs"]  # the fixture: a test's run store, and what its runs leave running killed afterwards

REPO = Path(__file__).resolve().parents[1]
FAULT = REPO / "tests" / "data" / "fault_server.py"
OTHER = "campaign-other"


# -- the other user and the shared scratch folder ----------------------------------------------------------------------


def _privileged() -> list[str] | None:
    """How this test becomes root (nothing when it is), or None when it cannot."""
    if os.geteuid() == 0:
        return []
    ok = subprocess.run(["sudo", "-n", "true"], capture_output=True).returncode == 0
    return ["sudo", "-n"] if ok else None


@pytest.fixture(scope="session")
def other_user() -> tuple[int, int]:
    """The second Unix user (uid, gid), created if missing."""
    sudo = _privileged()
    if sudo is None:
        pytest.skip("needs root or password-less sudo to create a second Unix user")
    got = subprocess.run(["id", "-u", OTHER], capture_output=True, text=True)
    if got.returncode != 0:
        made = subprocess.run(
            [*sudo, "useradd", "--system", "--no-create-home", "--shell", "/bin/sh", OTHER],
            capture_output=True,
            text=True,
        )
        assert made.returncode == 0, made.stderr
    uid = int(subprocess.run(["id", "-u", OTHER], capture_output=True, text=True, check=True).stdout)
    gid = int(subprocess.run(["id", "-g", OTHER], capture_output=True, text=True, check=True).stdout)
    return uid, gid


def as_other(user: tuple[int, int], command: str) -> subprocess.CompletedProcess[str]:
    """Run ``command`` under ``sh`` as the other user."""
    sudo = _privileged() or []
    uid, gid = user
    argv = [*sudo, "setpriv", f"--reuid={uid}", f"--regid={gid}", "--clear-groups", "sh", "-c", command]
    return subprocess.run(argv, capture_output=True, text=True, timeout=30)


@pytest.fixture
def pub() -> Iterator[Path]:
    """A folder like /tmp: sticky, world-writable, owned by the test's user (the other user can reach it)."""
    path = Path(tempfile.mkdtemp(prefix="campaign-shared-", dir="/tmp"))
    path.chmod(0o1777)
    try:
        yield path
    finally:
        sudo = _privileged() or []
        subprocess.run([*sudo, "rm", "-rf", str(path)], check=False)


@pytest.fixture
def victim() -> Iterator[int]:
    """A process of the test's user in a group of its own that campaign never started (``setsid sleep``)."""
    proc = subprocess.Popen(["sleep", "3590"], start_new_session=True)
    try:
        yield proc.pid
    finally:
        proc.kill()
        proc.wait(10)


def fault_experiment(tmp: Path, name: str, *, mode: str = "ok", workdir: Path | None = None, **extra: Any) -> Path:
    """An experiment over the fault server: a baseline (mode ok) and a variant ``v`` in ``mode``."""
    recipe = {
        "name": "fault",
        "command": ["{python}", str(FAULT)],
        "env": {"PYTHONUNBUFFERED": "1"},
        "ready_marker": "FAULT SERVER READY",
        "health_path": "/health",
        "phases": {"load": "fault server starting", "ready": "FAULT SERVER READY"},
        "knobs": {"port": {"flag": "--port"}, "mode": {"flag": "--mode"}},
    }
    recipe_path = tmp / "fault-recipe.yaml"
    recipe_path.write_text(yaml.safe_dump(recipe))
    doc: dict[str, Any] = {
        "name": name,
        "host": {"kind": "local", "workdir": str(workdir or tmp / "box")},
        "recipe": str(recipe_path),
        "vars": {"python": sys.executable},
        "baseline": {"knobs": {"mode": "ok", "port": free_port()}},
        "variants": [{"name": "v", "knobs": {"mode": mode}}],
        "smoke": {"questions": 2, "seed": 1, "burst": False},
        "timeouts": {"ready_s": 20, "stop_grace_s": 3},
        **extra,
    }
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def state_env(state: Path) -> dict[str, str]:
    """The environment of a CLI whose host state folder is ``state``."""
    return {**os.environ, "CAMPAIGN_HOST_STATE": str(state)}


def run_cli(state: Path, runs: Path, *args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    """The CLI with its own state folder, to its end."""
    return subprocess.run(
        [sys.executable, "-m", "campaign.cli", "--runs-dir", str(runs), *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=state_env(state),
    )


def forged(pid: int) -> str:
    """A current.json naming ``pid`` as campaign's server, with no token (as another user would write it)."""
    return json.dumps(
        {
            "pid": pid,
            "pgid": pid,
            "port": 41999,
            "remote_dir": "/x",
            "log_path": "/x/l",
            "started_at": 0,
            "spec_hash": "x",
            "variant": "innocent",
            "run_id": "r",
            "attempt": 1,
            "token": "",
        }
    )


# -- N1, N30, N29: the state folder ----------------------------------------------------------------------------------


def test_a_record_another_user_wrote_signals_nothing(
    tmp_path: Path, pub: Path, runs: Path, victim: int, other_user: tuple[int, int]
) -> None:
    """N1: the other user writes a record naming our process, where the old layout kept it and in our own part;
    neither is trusted: stop and run signal nothing, and the record cannot even be written into our part."""
    state = pub / "campaign"
    path = fault_experiment(tmp_path, "n1", at_end="stop")
    first = run_cli(state, runs, "stop", str(path))
    assert first.returncode == 0, first.stderr
    ours = state / f"user-{os.getuid()}"
    assert ours.is_dir() and (ours.stat().st_mode & 0o777) == 0o700 and ours.stat().st_uid == os.getuid()
    assert (state.stat().st_mode & 0o7777) == 0o1777
    record = forged(victim).replace("'", "")
    shared = as_other(other_user, f"printf '%s' '{record}' > {state}/current.json")
    assert shared.returncode == 0, shared.stderr
    mine = as_other(other_user, f"printf '%s' '{record}' > {ours}/current.json")
    assert mine.returncode != 0 and not (ours / "current.json").exists()
    stop = run_cli(state, runs, "stop", str(path))
    assert stop.returncode == 0, stop.stderr
    assert "innocent" not in stop.stdout + stop.stderr
    status = run_cli(state, runs, "status", str(path), "--json")
    assert status.returncode == 0, status.stderr
    assert json.loads(status.stdout)["running"] is None and str(victim) not in status.stdout
    assert alive(victim)
    # Our own part damaged the same way (a record with no token, ours by location only): still nothing signalled.
    (ours / "current.json").write_text(forged(victim))
    stop = run_cli(state, runs, "stop", str(path))
    assert stop.returncode == 0, stop.stderr
    assert alive(victim)
    run = run_cli(state, runs, "run", str(path), "--json")
    assert run.returncode == 0, run.stderr
    assert alive(victim) and ours_running(runs) == []


def test_a_state_folder_another_user_made_or_linked_is_refused(
    tmp_path: Path, pub: Path, runs: Path, victim: int, other_user: tuple[int, int]
) -> None:
    """N30: a state folder the other user made first is refused (exit 2, nothing touched); N29: so is one the other
    user planted as a symbolic link, and the folder it points to keeps its mode; so is our part made by them."""
    path = fault_experiment(tmp_path, "n30", at_end="stop")
    made = pub / "made-by-other"
    assert as_other(other_user, f"mkdir {made} && chmod 1777 {made}").returncode == 0
    for command in (["run", str(path)], ["stop", str(path)], ["status", str(path)]):
        res = run_cli(made, runs, *command)
        assert res.returncode == 2, (command, res.stdout, res.stderr)
        assert f"belongs to uid {other_user[0]}" in res.stderr, res.stderr
    assert not list(made.iterdir()) and not (tmp_path / "box").exists()

    target = tmp_path / "victimdir"
    target.mkdir(mode=0o755)
    target.chmod(0o755)
    link = pub / "linked"
    assert as_other(other_user, f"ln -s {target} {link}").returncode == 0
    for command in (["stop", str(path)], ["run", str(path)]):
        res = run_cli(link, runs, *command)
        assert res.returncode == 2 and "symbolic link" in res.stderr, res.stderr
    assert (target.stat().st_mode & 0o7777) == 0o755 and not list(target.iterdir())

    state = pub / "campaign"
    state.mkdir()
    state.chmod(0o1777)
    assert as_other(other_user, f"mkdir -m 777 {state}/user-{os.getuid()}").returncode == 0
    res = run_cli(state, runs, "stop", str(path))
    assert res.returncode == 2 and "not to you" in res.stderr, res.stderr
    assert alive(victim)


# -- N27, N28: the workdir -------------------------------------------------------------------------------------------


def test_a_workdir_another_user_controls_is_refused(
    tmp_path: Path, pub: Path, runs: Path, other_user: tuple[int, int]
) -> None:
    """N28: a workdir inside the other user's folder (where they could plant ``server.log -> victim``) is refused;
    N27: a workdir that is their symbolic link is refused and their folder keeps its mode; nothing is written."""
    victim_file = tmp_path / "victim.txt"
    victim_file.write_text("root's own file\n")
    area = pub / "area"
    assert as_other(other_user, f"mkdir -m 777 {area}").returncode == 0
    path = fault_experiment(tmp_path, "n28", workdir=area / "w", at_end="stop")
    res = run_cli(tmp_path / "state", runs, "run", str(path))
    assert res.returncode == 2, res.stdout + res.stderr
    assert f"{area} belongs to uid {other_user[0]}" in res.stderr
    assert not (area / "w").exists() and victim_file.read_text() == "root's own file\n"

    theirs = pub / "theirs"
    assert as_other(other_user, f"mkdir -m 755 {theirs} && ln -s {theirs} {pub}/wlink").returncode == 0
    path = fault_experiment(tmp_path, "n27", workdir=pub / "wlink", at_end="stop")
    res = run_cli(tmp_path / "state", runs, "run", str(path))
    assert res.returncode == 2 and "symbolic link" in res.stderr, res.stderr
    assert (theirs.stat().st_mode & 0o777) == 0o755 and not list(theirs.iterdir())
    assert ours_running(runs) == []


# -- D1: a process proves it is ours ---------------------------------------------------------------------------------


def test_a_group_of_one_or_less_and_a_record_without_token_take_nothing(tmp_path: Path, victim: int) -> None:
    """The tree of a record is only what carries its token: no token, nothing (even naming a live group); a token
    with group 1 takes the token's holder and never PID 1's group."""
    host = LocalHost()
    assert tree(host, "", victim) == []
    token = f"t-{os.getpid()}:1:abc"
    marked = subprocess.Popen(["sleep", "3591"], env={**os.environ, "CAMPAIGN_TREE": token}, start_new_session=True)
    try:
        deadline = time.monotonic() + 5
        found = tree(host, token, 1)
        while not found and time.monotonic() < deadline:
            time.sleep(0.05)
            found = tree(host, token, 1)
        assert [p.pid for p in found] == [marked.pid]
        assert [p.pid for p in tree(host, token, 0)] == [marked.pid]
    finally:
        marked.kill()
        marked.wait(10)


# -- N2: our own damaged state ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("damage", ["deleted", "corrupt"])
def test_our_server_is_found_by_its_token_when_current_json_is_lost(tmp_path: Path, runs: Path, damage: str) -> None:
    """N2: with current.json deleted (a /tmp cleaner) or corrupt, the known-good campaign left running is still
    ours: status names it, a new run replaces it (no "process campaign did not start"), stop stops it."""
    state = tmp_path / "state"
    path = fault_experiment(tmp_path, "n2", at_end="known_good")
    first = run_cli(state, runs, "run", str(path), "--json")
    assert first.returncode == 0, first.stderr
    record = state / f"user-{os.getuid()}" / "current.json"
    assert record.is_file() and len(ours_running(runs)) >= 1

    def damage_it() -> None:
        if damage == "deleted":
            record.unlink()
        else:
            record.write_text('{"pid": 12, "garbage')

    damage_it()
    status = run_cli(state, runs, "status", str(path), "--json")
    assert status.returncode == 0, status.stderr
    running = json.loads(status.stdout)["running"]
    assert running is not None and running["variant"] == "v" and running["alive"], status.stdout
    assert running["pid"] == running["pgid"] and "token" in running["recovered"]
    again = run_cli(state, runs, "run", str(path), "--json")
    assert again.returncode == 0, again.stdout + again.stderr
    assert "did not start" not in again.stdout + again.stderr
    assert show(runs)["status"] == "passed"
    damage_it()
    stop = run_cli(state, runs, "stop", str(path), "--json")
    assert stop.returncode == 0, stop.stderr
    # `stop` names the experiment, variant and port of what it stops (the ecosystem review: "stopped baseline").
    detail = json.loads(stop.stdout)["detail"]
    assert json.loads(stop.stdout)["stopped"] and f"stopped v of experiment n2 on port {running['port']}" in detail
    assert ours_running(runs) == []
    restore = run_cli(state, runs, "restore", str(path))
    assert restore.returncode == 0, restore.stderr
    stop = run_cli(state, runs, "stop", str(path))
    assert stop.returncode == 0 and ours_running(runs) == []


def test_force_never_breaks_the_lock_of_a_live_cli_on_this_machine(tmp_path: Path, runs: Path) -> None:
    """N43: `run --force` while the holder (a campaign CLI) is alive on this machine is refused with exit 2, naming
    it; once that CLI is gone, the lock is taken over without --force."""
    state = tmp_path / "state"
    path = fault_experiment(tmp_path, "n43", at_end="stop")
    assert run_cli(state, runs, "stop", str(path)).returncode == 0
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)", "campaign", "run"])
    try:
        (state / "lock").mkdir()
        owner = {"user": "me", "machine": socket.gethostname(), "pid": holder.pid, "run_id": "r-live", "since": "now"}
        (state / "lock" / "owner.json").write_text(json.dumps(owner))
        res = run_cli(state, runs, "run", str(path), "--force")
        assert res.returncode == 2 and "still runs on this machine" in res.stderr, res.stderr
        assert (state / "lock").is_dir()
    finally:
        holder.kill()
        holder.wait(10)
    res = run_cli(state, runs, "stop", str(path), "--json")
    assert res.returncode == 0, res.stderr
    assert "took over (its CLI was gone) the lock of run r-live" in json.loads(res.stdout)["detail"]


# -- N20, N15b: the clock and the store ------------------------------------------------------------------------------


def test_a_wall_clock_step_during_the_wait_records_true_durations(tmp_path: Path, runs: Path) -> None:
    """N20: the CLI's wall clock steps back 2 h while a variant starts (NTP): no negative `launch_to_ready_s`, no
    "ready in -7191 s"; durations come from the monotonic clock."""
    shift = tmp_path / "shift"
    shift.write_text("0")
    patch = tmp_path / "clockpatch"
    patch.mkdir()
    (patch / "sitecustomize.py").write_text(
        "import time\n_wall = time.time\n"
        f"def _shifted():\n    return _wall() + float(open({str(shift)!r}).read() or 0)\n"
        "time.time = _shifted\n"
    )
    path = fault_experiment(tmp_path, "n20", mode="slow-start", at_end="stop")
    env = {**state_env(tmp_path / "state"), "PYTHONPATH": str(patch)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "campaign.cli", "--runs-dir", str(runs), "run", str(path), "--variant", "v"],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
        text=True,
    )
    assert proc.stderr is not None
    for line in proc.stderr:
        if " pid " in line and "v" in line:
            break
    shift.write_text("-7200")
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, out + err
    assert "ready in -" not in out + err
    for att in show(runs)["attempts"]:
        assert att["timings"]["launch_to_ready_s"] is None or att["timings"]["launch_to_ready_s"] >= 0, att


def test_doctor_on_a_read_only_store_is_a_clear_error(tmp_path: Path, runs: Path) -> None:
    """N15b: `doctor` on a store mounted read-only exits 2 naming the store (it was exit 70, OSError)."""
    sudo = _privileged()
    if sudo is None:
        pytest.skip("needs root or password-less sudo to mount the store read-only")
    path = fault_experiment(tmp_path, "n15", at_end="stop")
    assert run_cli(tmp_path / "state", runs, "run", str(path), "--variant", "v").returncode == 0
    mounted = subprocess.run([*sudo, "mount", "--bind", str(runs), str(runs)], capture_output=True, text=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot bind-mount here: {mounted.stderr.strip()}")
    try:
        ro = subprocess.run([*sudo, "mount", "-o", "remount,ro,bind", str(runs)], capture_output=True, text=True)
        assert ro.returncode == 0, ro.stderr
        res = run_cli(tmp_path / "state", runs, "doctor")
        assert res.returncode == 2, res.stdout + res.stderr
        assert "cannot rebuild the run index" in res.stderr and "internal error" not in res.stderr
    finally:
        subprocess.run([*sudo, "umount", str(runs)], check=False)


# -- N16b: a store error in the middle of a run ------------------------------------------------------------------------


def test_an_index_locked_mid_run_releases_the_lock_and_leaves_no_unproven_variant(tmp_path: Path, runs: Path) -> None:
    """N16b: another process holds the run index (`BEGIN EXCLUSIVE`) from the moment the variant launches: the run
    ends with exit 3 (the box unproven: its record could not be written), the host lock is released, and the
    variant under test is not left serving (it was: exit 2, lock kept, no restore)."""
    state = tmp_path / "state"
    path = fault_experiment(tmp_path, "n16", mode="slow-start")
    doc = yaml.safe_load(path.read_text())
    doc["variants"][0]["env"] = {"SLOW_S": "4"}
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    proc = subprocess.Popen(
        [sys.executable, "-m", "campaign.cli", "--runs-dir", str(runs), "run", str(path), "--retry-known"],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=state_env(state),
        text=True,
    )
    assert proc.stderr is not None
    seen = []
    for line in proc.stderr:
        seen.append(line)
        if line.strip().startswith("#1 pid"):
            break
    con = sqlite3.connect(runs / "index.sqlite", timeout=30)
    con.execute("BEGIN EXCLUSIVE")
    try:
        out, err = proc.communicate(timeout=240)
    finally:
        con.rollback()
        con.close()
    text = "".join(seen) + err
    assert proc.returncode == 3, out + text
    assert not (state / "lock").exists(), text
    tokens = {tok for _pid, tok in ours_running(runs)}
    assert not any(tok.split(":")[1] == "1" for tok in tokens), (tokens, text)


# -- N22b: a failing baseline with no known-good -----------------------------------------------------------------------


def test_a_failing_baseline_with_no_known_good_leaves_the_box_clean_and_runs_the_rest(
    tmp_path: Path, runs: Path
) -> None:
    """N22b: a new experiment whose baseline fails (it exits at once) and no known-good: the box is left clean, the
    remaining variant still runs (and passes), exit 1 (it was exit 3, restore_failed, the variant dropped)."""
    path = fault_experiment(tmp_path, "n22b", at_end="stop")
    doc = yaml.safe_load(path.read_text())
    doc["baseline"]["knobs"]["mode"] = "ready-then-die"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    res = run_cli(tmp_path / "state", runs, "run", str(path), "--retry-known")
    assert res.returncode == 1, res.stdout + res.stderr
    report = show(runs)
    assert report["status"] == "failed"
    outcomes = {a["variant"]: a["outcome"] for a in report["attempts"] if a["role"] == "variant"}
    assert outcomes == {"baseline": "failed", "v": "passed"}, outcomes
    assert ours_running(runs) == []
