"""The fault matrix of docs/reliability.md: each case run as a user meets it, each ending in its documented state.

Real processes throughout: the CLI as a subprocess, the reference server on CPU, real signals, a foreign
``http.server`` on a port, a real sshd on loopback that goes down for good. Each case asserts what a user would
check afterwards: the exit code, the record (``campaign show --json``), and the box: nothing campaign started still
running unless the case says so (every process carrying one of the run's ``CAMPAIGN_TREE`` tokens is looked up in
/proc), the port free or held by its foreign owner, the lock released.

Each test gets its own host state folder (tests/conftest.py), so its lock and current.json are its own.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from campaign.errors import LockHeld
from campaign.hosts.local import LocalHost
from campaign.hosts.ssh.testing import SSHServer, start_test_sshd
from campaign.lock import HostLock
from tests.fixtures.refserver import free_port
from tests.helpers import run_cli

REPO = Path(__file__).resolve().parents[1]
WEIGHTS = REPO / "campaign" / "refserver" / "weights" / "arith.safetensors"


# -- helpers ----------------------------------------------------------------------------------------------------------


def cli(*args: str, runs: Path, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """Run the CLI to the end, as a user would (a fault test that hangs fails after 5 minutes, not 10)."""
    return run_cli(*args, runs=runs, timeout=timeout)


class Background:
    """A CLI started in the background, its stderr in a file that ``wait_for`` watches."""

    def __init__(self, tmp: Path, *args: str, runs: Path) -> None:
        self.err_path = tmp / f"cli-{time.monotonic_ns()}.err"
        self._err = self.err_path.open("wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "campaign.cli", "--runs-dir", str(runs), *args],
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=self._err,
            start_new_session=True,  # signals go to the CLI alone, as the review sent them
            # A CLI that never ends is aborted by ``finish``; this makes it print every thread's stack first.
            env={**os.environ, "PYTHONFAULTHANDLER": "1"},
        )

    @property
    def err(self) -> str:
        """The CLI's stderr so far."""
        return self.err_path.read_text(errors="replace")

    def wait_for(self, text: str, timeout: float = 120) -> None:
        """Wait until ``text`` shows in stderr; fail with the output if the CLI ends first."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if text in self.err:
                return
            if self.proc.poll() is not None:
                pytest.fail(f"the CLI ended ({self.proc.returncode}) before {text!r}:\n{self.err}")
            time.sleep(0.05)
        pytest.fail(f"no {text!r} after {timeout} s:\n{self.err}")

    def signal(self, sig: int) -> None:
        """Send ``sig`` to the CLI's PID only."""
        os.kill(self.proc.pid, sig)

    def finish(self, timeout: float = 180) -> tuple[int, str, str]:
        """Wait for the end: (exit code, stdout, stderr); a CLI still running after ``timeout`` fails the test.

        The failure shows where it was stuck: SIGABRT makes the CLI's fault handler print each thread's stack.
        """
        try:
            out, _ = self.proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.signal(signal.SIGABRT)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.communicate(timeout=20)
            pytest.fail(f"the CLI still ran {timeout:g} s later; its stderr, then its stacks:\n{self.err[-12000:]}")
        self._err.close()
        return self.proc.returncode, out.decode(errors="replace"), self.err

    def kill(self) -> None:
        """End it (test cleanup) if it still runs."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        self._err.close()


def experiment(
    tmp: Path,
    name: str,
    variants: list[dict[str, Any]],
    *,
    port: int | None = None,
    workdir: Path | None = None,
    host: dict[str, Any] | None = None,
    **extra: Any,
) -> Path:
    """An experiment file for the reference server on CPU (quick smoke, short timeouts)."""
    doc: dict[str, Any] = {
        "name": name,
        "host": {**(host or {"kind": "local"}), "workdir": str(workdir or tmp / "box")},
        "recipe": "refserver",
        "vars": {"python": sys.executable},
        "baseline": {
            "knobs": {"device": "cpu", "attention": "torch", "cuda_graph": False, "port": port or free_port()}
        },
        "variants": variants,
        "smoke": {"questions": 2, "seed": 1, "burst": False},
        "timeouts": {"ready_s": 60, "stop_grace_s": 3},
        **extra,
    }
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def behaviour(tmp: Path, name: str, code: str) -> dict[str, str]:
    """The env of a variant whose server runs ``code`` at interpreter start (a sitecustomize on its PYTHONPATH)."""
    folder = tmp / name
    folder.mkdir(exist_ok=True)
    (folder / "sitecustomize.py").write_text(code)
    return {"PYTHONPATH": str(folder)}


HANG = "import sys, time\nsys.stderr.write('sitecustomize: hanging\\n'); sys.stderr.flush()\ntime.sleep(3600)\n"


def show(runs: Path, ref: str = "last") -> dict[str, Any]:
    """The stored report of a run."""
    res = cli("show", ref, "--json", runs=runs)
    assert res.returncode == 0, res.stderr
    doc: dict[str, Any] = json.loads(res.stdout)
    return doc


def alive(pid: int) -> bool:
    """True while ``pid`` is a live process (a zombie counts as gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def ours_running(runs: Path) -> list[tuple[int, str]]:
    """Live processes that carry a CAMPAIGN_TREE token of one of the store's runs: what campaign left running."""
    run_ids = [p.name for p in runs.iterdir() if (p / "report.json").is_file()] if runs.is_dir() else []
    found = []
    for environ in Path("/proc").glob("[0-9]*/environ"):
        try:
            env = environ.read_bytes().split(b"\0")
        except OSError:
            continue
        for item in env:
            if item.startswith(b"CAMPAIGN_TREE="):
                token = item.split(b"=", 1)[1].decode(errors="replace")
                pid = int(environ.parent.name)
                if any(token.startswith(r + ":") for r in run_ids) and alive(pid):
                    found.append((pid, token))
    return found


def listening(port: int) -> bool:
    """True when something accepts connections on 127.0.0.1:port."""
    with socket.socket() as s:
        s.settimeout(1)
        return s.connect_ex(("127.0.0.1", port)) == 0


def lock_dir() -> Path:
    """This test's host lock (the state folder tests/conftest.py gives it)."""
    return Path(os.environ["CAMPAIGN_HOST_STATE"]) / "lock"


def start_foreign(tmp: Path, port: int) -> subprocess.Popen[bytes]:
    """A process campaign did not start, listening on ``port``: ``python -m http.server``."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1"],
        cwd=tmp,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 20
    while not listening(port) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert listening(port)
    return proc


@pytest.fixture
def foreign(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[bytes], int]]:
    """A foreign listener on a free port, killed afterwards."""
    port = free_port()
    proc = start_foreign(tmp_path, port)
    try:
        yield proc, port
    finally:
        proc.kill()
        proc.wait(10)


def cleanup(runs: Path) -> None:
    """Stop whatever a failed test left (by PID, only processes carrying this store's tokens)."""
    for pid, _token in ours_running(runs):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


@pytest.fixture
def runs(tmp_path: Path) -> Iterator[Path]:
    """The run store of a test; anything its runs leave running is killed afterwards."""
    path = tmp_path / "runs"
    try:
        yield path
    finally:
        cleanup(path)


# -- ours vs not ours -------------------------------------------------------------------------------------------------


def test_foreign_listener_on_a_variants_port(
    tmp_path: Path, runs: Path, foreign: tuple[subprocess.Popen[bytes], int]
) -> None:
    """The variant fails port_in_use naming the foreign PID; the baseline is restored; exit 1; foreigner untouched."""
    proc, fport = foreign
    path = experiment(tmp_path, "f-var", [{"name": "porttaken", "knobs": {"port": fport}}])
    res = cli("run", str(path), "--json", runs=runs)
    assert res.returncode == 1, res.stderr
    doc = json.loads(res.stdout)
    base, *taken, restore = doc["attempts"]  # port_in_use is transient: retried within the budget
    assert base["outcome"] == "passed" and restore["role"] == "restore" and restore["outcome"] == "passed"
    assert taken and all(a["variant"] == "porttaken" and a["outcome"] == "failed" for a in taken)
    assert all(a["diagnosis"]["kind"] == "port_in_use" for a in taken)
    report = show(runs)
    for att in report["attempts"][1:-1]:
        assert f"PID {proc.pid}" in att["note"] and "http.server" in att["note"] and "did not start" in att["note"]
        assert att["pid"] is None  # never launched next to the foreign listener
    assert doc["restore"]["outcome"] == "restored" and doc["final"]["healthy"]
    # The box: the baseline runs (the known-good), the foreign process is alive and still owns its port.
    assert proc.poll() is None and listening(fport)
    assert len({tok for _pid, tok in ours_running(runs)}) == 1
    stop = cli("stop", str(path), runs=runs)
    assert stop.returncode == 0, stop.stderr
    assert ours_running(runs) == [] and proc.poll() is None and listening(fport)


def test_foreign_listener_on_the_baselines_port(tmp_path: Path, runs: Path) -> None:
    """The known-good's port is held by someone else: nothing can be restored, exit 3, the foreigner untouched."""
    port = free_port()
    path = experiment(tmp_path, "f-base", [], port=port)
    assert cli("run", str(path), runs=runs).returncode == 0  # the baseline becomes the known-good
    assert cli("stop", str(path), runs=runs).returncode == 0
    proc = start_foreign(tmp_path, port)
    try:
        res = cli("run", str(path), "--json", runs=runs)
        assert res.returncode == 3, res.stderr
        doc = json.loads(res.stdout)
        kinds = [a["diagnosis"]["kind"] for a in doc["attempts"]]
        assert len(kinds) >= 2 and set(kinds) == {"port_in_use"}  # the baseline (retried), then the restore
        assert doc["attempts"][-1]["role"] == "restore"
        assert doc["status"] == "restore_failed" and f"PID {proc.pid}" in doc["final"]["detail"]
        assert proc.poll() is None and listening(port) and ours_running(runs) == []
        assert not lock_dir().exists()
    finally:
        proc.kill()
        proc.wait(10)
    # Once the port is free, `campaign restore` brings the known-good back.
    back = cli("restore", str(path), runs=runs)
    assert back.returncode == 0, back.stderr
    assert listening(port)


# -- signals ----------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("sig", "code"),
    [(signal.SIGINT, 130), (signal.SIGTERM, 143), (signal.SIGHUP, 129)],
    ids=["SIGINT", "SIGTERM", "SIGHUP"],
)
def test_a_signal_while_a_variant_waits_for_ready(tmp_path: Path, runs: Path, sig: int, code: int) -> None:
    """One Ctrl-C, SIGTERM or SIGHUP mid-ready: the variant stopped, the known-good back and proven, all recorded."""
    path = experiment(tmp_path, "sig", [{"name": "hang", "env": behaviour(tmp_path, "hang", HANG)}])
    run = Background(tmp_path, "run", str(path), runs=runs)
    try:
        run.wait_for("#1 pid")
        time.sleep(0.3)
        run.signal(sig)
        rc, _out, err = run.finish()
    finally:
        run.kill()
    assert rc == code, err
    name = signal.Signals(sig).name
    assert "a second signal leaves at once" in err and f"{name}: interrupted by {name}" in err
    report = show(runs)
    assert report["status"] == "interrupted" and report["signal"] == name
    hang = report["attempts"][1]
    assert hang["variant"] == "hang" and hang["outcome"] == "interrupted" and hang["log_file"]
    assert report["attempts"][2]["role"] == "restore" and report["attempts"][2]["outcome"] == "passed"
    assert report["final"]["healthy"] and report["final"]["variant"] == "baseline"
    # What was measured before the signal is kept: the stop, the attempt up to the signal; it never got ready.
    t = hang["timings"]
    assert t["stop_s"] is not None and t["attempt_s"] is not None and t["attempt_s"] >= 0.3
    assert t["launch_to_ready_s"] is None and t["smoke_s"] is None and t["bench_s"] is None
    assert not alive(hang["pgid"])
    assert [tok.split(":")[1] for _pid, tok in ours_running(runs)] == ["2"] * len(ours_running(runs))
    assert not lock_dir().exists()


def test_one_ctrl_c_during_smoke(tmp_path: Path, runs: Path) -> None:
    """One Ctrl-C while a ready variant answers its smoke questions: the same clean end as mid-ready, exit 130."""
    path = experiment(
        tmp_path,
        "smokeint",
        [{"name": "asked", "knobs": {"max_batch": 4}}],
        smoke={"questions": 60, "seed": 1, "burst": False},
    )
    run = Background(tmp_path, "run", str(path), runs=runs)
    try:
        run.wait_for("#1 ready in", timeout=240)
        run.signal(signal.SIGINT)
        rc, _out, err = run.finish()
    finally:
        run.kill()
    assert rc == 130, err
    before = err.split("SIGINT", 1)[0]
    assert "#1 ready in" in before and "#1 smoke:" not in before  # it came after ready, before smoke's verdict
    report = show(runs)
    assert report["status"] == "interrupted" and report["signal"] == "SIGINT"
    asked = report["attempts"][1]
    assert asked["variant"] == "asked" and asked["outcome"] == "interrupted"
    restore = report["attempts"][2]
    assert restore["role"] == "restore" and restore["outcome"] == "passed"
    assert report["final"]["healthy"] and report["final"]["variant"] == "baseline"
    # The record keeps what was measured up to the signal: the ready time (as printed), the attempt's time to the
    # signal; the smoke it cut has no duration, the bench never ran.
    t = asked["timings"]
    printed = float(re.search(r"#1 ready in ([\d.]+) s", before)[1])  # type: ignore[index]
    assert t["launch_to_ready_s"] is not None and abs(t["launch_to_ready_s"] - printed) <= 0.0051
    assert t["ready_detect_lag_s"] is not None and t["stop_s"] is not None
    assert t["attempt_s"] is not None and t["attempt_s"] >= t["stop_s"] + t["launch_to_ready_s"] - 1.0
    assert t["smoke_s"] is None and t["bench_s"] is None
    assert not alive(asked["pgid"]) and not lock_dir().exists()


def test_ctrl_c_twice(tmp_path: Path, runs: Path) -> None:
    """The second Ctrl-C leaves at once and says what still runs and the command that cleans it up."""
    path = experiment(tmp_path, "twice", [{"name": "hang", "env": behaviour(tmp_path, "hang", HANG)}])
    run = Background(tmp_path, "run", str(path), runs=runs)
    try:
        run.wait_for("#1 pid")
        run.signal(signal.SIGINT)
        run.wait_for("a second signal leaves at once")
        run.wait_for("#2 pid")  # the restore is under way
        run.signal(signal.SIGINT)
        rc, _out, err = run.finish()
    finally:
        run.kill()
    assert rc == 130, err
    report = show(runs)
    assert report["status"] == "interrupted" and report["signal"] == "SIGINT"
    detail = report["final"]["detail"]
    assert "second signal" in detail and "still running: baseline" in detail and f"campaign stop {path}" in detail
    assert detail in err.replace("\n", " ") or "still running" in err
    assert not lock_dir().exists()
    # What it named is what runs; the command it gave cleans it up.
    assert ours_running(runs)
    stop = cli("stop", str(path), runs=runs)
    assert stop.returncode == 0, stop.stderr
    assert ours_running(runs) == []


def test_a_dead_cli_is_reconciled_by_the_next_command(tmp_path: Path, runs: Path) -> None:
    """SIGKILL leaves a server and a stale lock; the next command records the run interrupted and cleans up."""
    path = experiment(tmp_path, "dead", [{"name": "hang", "env": behaviour(tmp_path, "hang", HANG)}], at_end="stop")
    run = Background(tmp_path, "run", str(path), runs=runs)
    try:
        run.wait_for("#1 pid")
        run.signal(signal.SIGKILL)
        rc, _out, _err = run.finish()
    finally:
        run.kill()
    assert rc == -signal.SIGKILL
    assert ours_running(runs) and lock_dir().exists()
    status = cli("status", str(path), "--json", runs=runs)
    assert status.returncode == 0, status.stderr
    doc = json.loads(status.stdout)
    assert doc["lock"]["stale"] and doc["running"]["variant"] == "hang" and doc["running"]["alive"]
    assert len(doc["reconciled"]) == 1
    report = show(runs)
    assert report["status"] == "interrupted" and "found afterwards: hang" in report["final"]["detail"]
    assert report["attempts"][1]["outcome"] == "interrupted"
    stop = cli("stop", str(path), runs=runs)
    assert stop.returncode == 0, stop.stderr
    assert ours_running(runs) == [] and not lock_dir().exists()


# -- one pair of hands per box ----------------------------------------------------------------------------------------


def test_the_box_is_refused_to_other_hands_while_a_run_holds_it(tmp_path: Path, runs: Path) -> None:
    """stop, restore, a second run and a run from another workdir all exit 2 naming the holder; the run passes."""
    go = tmp_path / "go"
    # The variant starts only once the test has tried every other pair of hands (at most 120 s).
    slow = behaviour(
        tmp_path,
        "slow",
        f"import os, time\nt = time.time()\nwhile not os.path.exists({str(go)!r}) and time.time() - t < 120:\n"
        "    time.sleep(0.05)\n",
    )
    port = free_port()
    path = experiment(tmp_path, "held", [{"name": "slow", "env": slow}], port=port, at_end="stop")
    other = experiment(tmp_path, "held2", [], port=free_port(), workdir=tmp_path / "box2")
    run = Background(tmp_path, "run", str(path), "--json", runs=runs)
    try:
        run.wait_for("#1 pid")
        owner = json.loads((lock_dir() / "owner.json").read_text())
        folders = sorted(p.name for p in runs.iterdir())
        for args in (("stop", str(path)), ("restore", str(path)), ("run", str(path)), ("run", str(other), "--json")):
            res = cli(*args, runs=runs)
            assert res.returncode == 2, (args, res.stderr)
            for part in (owner["run_id"], f"pid {owner['pid']}", owner["user"], owner["since"]):
                assert part in res.stderr, (args, part, res.stderr)
        assert json.loads(res.stdout)["kind"] == "LockHeld"
        assert sorted(p.name for p in runs.iterdir()) == folders  # refused runs left nothing in the store
        go.write_text("")
        rc, out, err = run.finish()
    finally:
        run.kill()
    assert rc == 0, err
    assert [a["outcome"] for a in json.loads(out)["attempts"]] == ["passed", "passed"]
    assert ours_running(runs) == [] and not lock_dir().exists()


def test_force_breaks_a_lock_and_says_whose(tmp_path: Path, runs: Path) -> None:
    """A lock held from another machine is never guessed stale; --force breaks it and the run records it."""
    lock = lock_dir()
    lock.mkdir(parents=True)
    holder = {"user": "alice", "machine": "laptop-9", "pid": 4242, "run_id": "r-alice", "since": "yesterday"}
    (lock / "owner.json").write_text(json.dumps(holder))
    path = experiment(tmp_path, "forced", [], at_end="stop")
    refused = cli("run", str(path), runs=runs)
    assert refused.returncode == 2 and "alice@laptop-9 pid 4242" in refused.stderr
    assert not runs.exists() or not any(runs.iterdir())
    res = cli("run", str(path), "--force", runs=runs)
    assert res.returncode == 0, res.stderr
    taken = show(runs)["lock_taken_over"]
    assert taken["how"] == "forced" and taken["user"] == "alice" and taken["run_id"] == "r-alice"
    assert not lock.exists() and ours_running(runs) == []
    # `stop --force` says whose lock it broke.
    lock.mkdir()
    (lock / "owner.json").write_text(json.dumps(holder))
    assert cli("stop", str(path), runs=runs).returncode == 2
    stop = cli("stop", str(path), "--force", "--json", runs=runs)
    assert stop.returncode == 0, stop.stderr
    assert "broke with --force the lock of run r-alice" in json.loads(stop.stdout)["detail"]
    assert not lock.exists()


def test_two_clis_taking_over_one_stale_lock_end_with_one_holder(tmp_path: Path) -> None:
    """B judges a dead CLI's lock stale; before B acts, A takes it over. B must not remove A's lock: it is refused."""
    state = str(tmp_path / "state")
    Path(state, "lock").mkdir(parents=True)
    dead = {"user": "root", "machine": socket.gethostname(), "pid": _dead_pid(), "run_id": "r-dead", "since": "then"}
    Path(state, "lock", "owner.json").write_text(json.dumps(dead))
    first = HostLock(LocalHost(), run_id="r-first", experiment="x", state_dir=state)
    second = HostLock(LocalHost(), run_id="r-second", experiment="x", state_dir=state)
    judged: list[dict[str, Any]] = []

    def judge_then_lose_the_race(owner: dict[str, Any]) -> bool:
        judged.append(owner)
        if len(judged) == 1:  # the dead CLI's record, stale; the first CLI wins the takeover meanwhile
            first.acquire()
            return True
        return False  # the first CLI's record: alive

    second._stale = judge_then_lose_the_race  # type: ignore[method-assign]
    with pytest.raises(LockHeld, match="run r-first"):
        second.acquire()
    assert judged[0]["run_id"] == "r-dead" and first.replaced == dead and first.replaced_how == "stale"
    assert json.loads(Path(state, "lock", "owner.json").read_text())["run_id"] == "r-first"
    assert not second.held and not Path(state, "lock.breaking").exists()
    first.release()
    assert not Path(state, "lock").exists()


def _dead_pid() -> int:
    """The PID of a process that has ended (and been reaped)."""
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


# -- the store heals --------------------------------------------------------------------------------------------------


def test_an_empty_or_corrupt_index_is_rebuilt_from_the_reports(tmp_path: Path, runs: Path) -> None:
    """The index is a cache: deleted, emptied, garbled or stale, it comes back from the run folders, known-good too."""
    path = experiment(tmp_path, "heal", [], at_end="stop")
    for _ in range(2):
        res = cli("run", str(path), runs=runs)
        assert res.returncode == 0, res.stderr
    listed = json.loads(cli("runs", "--json", runs=runs).stdout)
    assert len(listed) == 2
    index = runs / "index.sqlite"
    for damage in (None, b"", os.urandom(20000)):  # deleted, emptied, garbled
        if damage is None:
            index.unlink()
        else:
            index.write_bytes(damage)
        again = cli("runs", "--json", runs=runs)
        assert again.returncode == 0, again.stderr
        assert json.loads(again.stdout) == listed
        status = json.loads(cli("status", str(path), "--json", runs=runs).stdout)
        assert status["known_good"]["variant"] == "baseline"
    assert len(list(runs.glob("index.sqlite.corrupt-*"))) == 1  # the garbled one is kept aside, nothing else
    # A run folder removed by hand: its row goes too.
    gone = listed[0]["run_id"]
    for f in sorted((runs / gone).rglob("*"), reverse=True):
        f.unlink() if f.is_file() else f.rmdir()
    (runs / gone).rmdir()
    assert [r["run_id"] for r in json.loads(cli("runs", "--json", runs=runs).stdout)] == [listed[1]["run_id"]]
    doctor = cli("doctor", "--json", runs=runs)
    assert doctor.returncode == 0 and json.loads(doctor.stdout)["reports"] == 1
    assert oct(index.stat().st_mode & 0o777) == "0o600"


def test_known_good_is_per_experiment(tmp_path: Path, runs: Path) -> None:
    """Another experiment's server is named as such by status, and restore brings back this experiment's own."""
    mine = experiment(tmp_path, "mine", [])
    theirs = experiment(tmp_path, "theirs", [])
    assert cli("run", str(mine), runs=runs).returncode == 0
    assert cli("run", str(theirs), runs=runs).returncode == 0  # stops mine first: one server per box
    status = json.loads(cli("status", str(mine), "--json", runs=runs).stdout)
    assert status["running"]["experiment"] == "theirs" and status["running"]["other_experiment"]
    assert status["known_good"]["run_id"] != status["running"]["run_id"]
    res = cli("restore", str(mine), "--json", runs=runs)
    assert res.returncode == 0, res.stderr
    status = json.loads(cli("status", str(mine), "--json", runs=runs).stdout)
    assert status["running"]["experiment"] == "mine" and not status["running"]["other_experiment"]
    assert len({tok for _pid, tok in ours_running(runs)}) == 1


# -- truthful ends ----------------------------------------------------------------------------------------------------


def test_ssh_lost_for_good_exits_3_within_the_reconnect_budget(tmp_path: Path, runs: Path) -> None:
    """sshd killed for good while a variant waits for ready: exit 3 (box unproven) 60 s on, restore fixes it after.

    The end has two parts, each asserted: the reconnect budget, from the first call that found the connection down to
    ``HostLost`` (60 s, a hard deadline: not less, and not a connect timeout more), then the CLI's own end (noticing
    the loss at the next 0.1 s poll before it, saving the report and exiting after it), which gets a 5 s margin.
    """
    (tmp_path / "sshd").mkdir()
    server, sshd = start_test_sshd(tmp_path / "sshd")
    host = {**_host_of(server), "connect_timeout": 3}
    path = experiment(
        tmp_path,
        "sshlost",
        [{"name": "hang", "env": behaviour(tmp_path, "hang", HANG)}],
        host=host,
        timeouts={"ready_s": 100, "stop_grace_s": 3},
    )
    run = Background(tmp_path, "run", str(path), "--json", runs=runs)
    try:
        run.wait_for("#1 pid")
        killed_at = time.monotonic()
        _kill_sshd(sshd)
        rc, out, err = run.finish(timeout=150)
        took = time.monotonic() - killed_at
    finally:
        run.kill()
        if sshd.poll() is None:
            _kill_sshd(sshd)
    assert rc == 3, err
    doc = json.loads(out)
    assert doc["kind"] == "BoxUnproven"
    budget = re.search(r"could not be re-established within 60 s \(\d+ attempts over ([\d.]+) s\)", doc["error"])
    assert budget, doc["error"]
    reconnecting = float(budget[1])
    assert 60.0 <= reconnecting < 61.0, f"{reconnecting} s of reconnect attempts"
    assert took < 65.0, f"{took:.1f} s after the connection was lost ({took - reconnecting:.1f} s outside the budget)"
    assert "unproven" in err and "campaign restore" in err
    report = show(runs)
    assert report["status"] == "aborted" and report["attempts"][1]["variant"] == "hang"
    assert report["attempts"][1]["outcome"] == "interrupted" and "lost" in report["attempts"][1]["note"]
    assert ours_running(runs)  # the host was unreachable: the hang may (and does) still run there
    restarted = _restart_sshd(server)
    try:
        back = cli("restore", str(path), runs=runs)
        assert back.returncode == 0, back.stderr
        assert [tok.split(":")[1] for _pid, tok in ours_running(runs)] == ["0"] * len(ours_running(runs))
        assert cli("stop", str(path), runs=runs).returncode == 0
        assert ours_running(runs) == []
    finally:
        restarted.kill()
        restarted.wait(10)


#: A server that, once it has said it is ready, puts a folder where its log was: the next read of the log on the host
#: fails ("Is a directory") on a live connection. A fault at the host's file system, not in campaign.
LOG_UNREADABLE = (
    "import os, threading, time\n"
    "def swap():\n"
    "    log = os.readlink('/proc/self/fd/1')\n"
    "    while b'fired up and ready' not in open(log, 'rb').read():\n"
    "        time.sleep(0.01)\n"
    "    os.rename(log, log + '.moved')\n"
    "    os.mkdir(log)\n"
    "threading.Thread(target=swap, daemon=True).start()\n"
)


@pytest.mark.parametrize("kind", ["local", "ssh"])
def test_a_host_error_that_is_not_a_loss_releases_the_lock(tmp_path: Path, runs: Path, kind: str) -> None:
    """A host call that fails on a live host (the server's log cannot be read) mid-variant: exit 3 (box unproven),
    the run `aborted`, the lock released (the next `stop` is not refused), the server left running tracked in
    current.json (`status` names it), and that `stop` leaves nothing of ours running."""
    sshd: subprocess.Popen[bytes] | None = None
    host: dict[str, Any] | None = None
    if kind == "ssh":
        (tmp_path / "sshd").mkdir()
        server, sshd = start_test_sshd(tmp_path / "sshd")
        host = _host_of(server)
    try:
        path = experiment(
            tmp_path,
            f"unreadable-{kind}",
            [{"name": "unreadable", "env": behaviour(tmp_path, "unreadable", LOG_UNREADABLE)}],
            host=host,
        )
        res = cli("run", str(path), "--json", runs=runs)
        assert res.returncode == 3, res.stderr
        doc = json.loads(res.stdout)
        assert doc["kind"] == "BoxUnproven" and "cannot read" in doc["error"] and "server.log" in doc["error"]
        assert "unreadable" in doc["error"]  # the last server launched is named
        assert not lock_dir().exists()  # the host still answers: the run gave its lock back
        assert "lock this run left" not in doc["hint"] and "campaign restore" in doc["hint"]
        report = show(runs)
        assert report["status"] == "aborted"
        failed = report["attempts"][1]
        assert failed["variant"] == "unreadable" and failed["outcome"] == "interrupted"
        assert "cut short" in failed["note"] and "cannot read" in failed["note"]
        assert failed["timings"]["stop_s"] is not None and failed["timings"]["attempt_s"] is not None
        # What runs is what the record says runs: the variant, tracked, nothing else of ours.
        status = cli("status", str(path), "--json", runs=runs)
        assert status.returncode == 0, status.stderr
        running = json.loads(status.stdout)["running"]
        assert running["variant"] == "unreadable" and running["alive"]
        assert {tok.split(":")[1] for _pid, tok in ours_running(runs)} == {"1"}
        stop = cli("stop", str(path), runs=runs)
        assert stop.returncode == 0, stop.stderr
        assert ours_running(runs) == [] and not lock_dir().exists()
    finally:
        if sshd is not None:
            sshd.kill()
            sshd.wait(10)


def _host_of(server: SSHServer) -> dict[str, Any]:
    return server.host_config()


def _kill_sshd(sshd: subprocess.Popen[bytes]) -> None:
    """Kill the listener and every per-connection sshd under it, as a host that goes away would."""
    children = [int(s.parent.name) for s in Path("/proc").glob("[0-9]*/stat") if _ppid(s) == sshd.pid]
    sshd.kill()
    sshd.wait(10)
    for pid in children:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def _ppid(stat: Path) -> int:
    try:
        return int(stat.read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return -1


def _restart_sshd(server: SSHServer) -> subprocess.Popen[bytes]:
    """The same sshd (config, keys, port) started again."""
    proc = subprocess.Popen(
        ["/usr/sbin/sshd", "-D", "-e", "-f", str(server.root / "sshd_config"), "-E", str(server.log)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 20
    while not listening(server.port) and time.monotonic() < deadline:
        time.sleep(0.1)
    return proc


def test_a_child_that_leaves_the_group_is_stopped_too(tmp_path: Path, runs: Path) -> None:
    """A server whose child calls setsid (and ignores SIGTERM): the stop finds it by token, KILLs it, box clean."""
    escape = behaviour(
        tmp_path,
        "escape",
        "import os, signal, subprocess\n"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "p = subprocess.Popen(['sleep', '3599'], start_new_session=True, stdin=subprocess.DEVNULL,\n"
        "                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)\n"
        f"open({str(tmp_path / 'escapee.pid')!r}, 'a').write(f'{{p.pid}}\\n')\n",
    )
    path = experiment(tmp_path, "escape", [{"name": "escape", "env": escape}], at_end="stop")
    res = cli("run", str(path), "--json", runs=runs)
    assert res.returncode == 0, res.stderr
    escapees = [int(x) for x in (tmp_path / "escapee.pid").read_text().split()]
    assert escapees and not any(alive(p) for p in escapees)
    assert "no process of it left" in json.loads(res.stdout)["final"]["detail"]
    assert ours_running(runs) == []


def test_names_that_would_climb_out_are_refused(tmp_path: Path, runs: Path) -> None:
    """Experiment names and run ids name folders: separators and dots that climb are config errors."""
    path = experiment(tmp_path, "ok-name", [])
    text = path.read_text().replace("name: ok-name", "name: x/../../escape")
    bad = tmp_path / "bad.yaml"
    bad.write_text(text)
    res = cli("run", str(bad), "--dry-run", runs=runs)
    assert res.returncode == 2 and f"{bad}:1: name:" in res.stderr
    res = cli("run", str(path), "--set", "name=../up", "--dry-run", runs=runs)
    assert res.returncode == 2 and "name:" in res.stderr
    # A variant's name is a folder too (its attempt's, on the host and in the run).
    climber = experiment(tmp_path, "var-climb", [{"name": "../up", "knobs": {"max_batch": 4}}])
    line = climber.read_text().splitlines().index("- name: ../up") + 1
    res = cli("run", str(climber), "--dry-run", runs=runs)
    assert res.returncode == 2 and f"{climber}:{line}: variants.0.name:" in res.stderr, res.stderr
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "report.json").write_text("{}")
    for ref in ("../outside", "../../etc", "*"):
        res = cli("show", ref, runs=runs)
        assert res.returncode == 2 and "not a run id" in res.stderr, (ref, res.stderr)
    assert not runs.exists()


def test_any_value_in_a_knob(tmp_path: Path, runs: Path) -> None:
    """A matrix over model_path (a `/` in the value) runs: the variant's folder name is made safe, the value kept."""
    path = experiment(tmp_path, "paths", [], matrix={"axes": {"model_path": [str(WEIGHTS)]}}, at_end="stop")
    res = cli("run", str(path), "--json", runs=runs)
    assert res.returncode == 0, res.stderr
    variant = json.loads(res.stdout)["attempts"][1]
    assert variant["outcome"] == "passed" and variant["knobs"]["model_path"] == str(WEIGHTS)
    assert "/" not in variant["variant"] and variant["variant"].startswith("model_path=")


@pytest.mark.parametrize(
    ("text", "where", "what"),
    [
        ("timeouts: {ready_s: .inf}\n", ":3: timeouts.ready_s:", "finite"),
        ("baseline:\n  knobs: {device: cpu, port: 38101, port: 38102}\n", ":4: port:", "duplicate key"),
    ],
)
def test_config_values_that_would_hide_a_mistake(tmp_path: Path, text: str, where: str, what: str) -> None:
    """A non-finite timeout and a repeated YAML key are config errors with file, line and field."""
    path = tmp_path / "x.yaml"
    path.write_text("name: x\nrecipe: refserver\n" + text)
    res = cli("run", str(path), "--dry-run", runs=tmp_path / "runs")
    assert res.returncode == 2, res.stderr
    assert f"{path}{where}" in res.stderr and what in res.stderr and "Traceback" not in res.stderr


@pytest.mark.parametrize(
    ("text", "where", "what"),
    [
        ("- name: x\n- recipe: refserver\n", ":1:", "must be a mapping"),
        ("name: x\nrecipe: refserver\nbaseline: {knobs: {port: [1,\n", ":4:", "invalid YAML"),
        ("name: x\nrecipe: refserver\n\tbaseline: {}\n", ":3:", "invalid YAML"),
        ("name: x\nrecipe: refserver\nbaseline:\n  knobs:\n    port: 1\n   device: cpu\n", ":6:", "invalid YAML"),
        ("name: x\nrecipe: refserver\nbogus_field: 3\n", ":3: bogus_field:", "unknown field"),
        ("name: x\nrecipe: nosuch\n", ":2: recipe:", "unknown recipe"),
        ("name: x\nrecipe: refserver\nbaseline: {knobs: {port: notaport}}\n", ":3: baseline.knobs.port:", "1..65535"),
        ("name: x\nrecipe: refserver\ntimeouts: {ready_s: -5}\n", ":3: timeouts.ready_s:", "greater than 0"),
    ],
    ids=["a-list", "unclosed", "tab", "indent", "unknown-field", "unknown-recipe", "bad-port", "negative-timeout"],
)
def test_a_broken_config_is_one_error_naming_file_and_line(tmp_path: Path, text: str, where: str, what: str) -> None:
    """Config fuzz: whatever is wrong, one error line with file:line (and the field), exit 2, nothing launched."""
    path = tmp_path / "x.yaml"
    path.write_text(text)
    res = cli("run", str(path), runs=tmp_path / "runs")
    assert res.returncode == 2, res.stderr
    assert res.stderr.startswith(f"error: {path}{where}") and what in res.stderr, res.stderr
    assert res.stderr.count("error:") == 1 and "Traceback" not in res.stderr
    assert not (tmp_path / "runs").exists()


def test_values_too_long_to_launch_are_refused_before_the_box_is_touched(tmp_path: Path, runs: Path) -> None:
    """A knob, arg or env value over Linux's 128 KiB per-argument limit, or a variant name too long for a folder."""
    huge = "/w/" + "x" * 200_000
    cases = [
        ({"name": "v", "knobs": {"model_path": huge}}, "variants.0.knobs.model_path:"),
        ({"name": "v", "args": ["--model-path", huge]}, "v.args:"),
        ({"name": "v", "env": {"BIG": huge}}, "v.env.BIG:"),
    ]
    for variant, field in cases:
        path = experiment(tmp_path, "long", [variant])
        res = cli("run", str(path), runs=runs)
        assert res.returncode == 2, res.stderr
        assert f"{path}:" in res.stderr and field in res.stderr and "Argument list too long" in res.stderr
        assert huge not in res.stderr  # the value is named by its field, never printed back
    path = experiment(tmp_path, "long", [{"name": "v" * 121}])
    res = cli("run", str(path), runs=runs)
    assert res.returncode == 2 and "variants.0.name:" in res.stderr and "up to 120" in res.stderr, res.stderr
    assert not runs.exists() and not lock_dir().exists()


def test_a_missing_model_file_fails_the_variant_and_the_box_is_restored(tmp_path: Path, runs: Path) -> None:
    """The model file is not there: the variant dies at launch naming the path; the baseline is restored; exit 1."""
    missing = tmp_path / "gone" / "model.safetensors"
    path = experiment(tmp_path, "nomodel", [{"name": "nomodel", "knobs": {"model_path": str(missing)}}])
    res = cli("run", str(path), "--json", runs=runs)
    assert res.returncode == 1, res.stderr
    doc = json.loads(res.stdout)
    failed = doc["attempts"][1]
    assert failed["variant"] == "nomodel" and failed["outcome"] == "failed" and failed["failed_phase"] == "launch"
    log = runs / doc["run_id"] / "logs" / "01-nomodel.log"
    assert f"--model-path {missing}: no such file" in log.read_text()
    assert failed["diagnosis"]["kind"] == "model_load_error"
    assert any(f"--model-path {missing}: no such file" in e["text"] for e in failed["diagnosis"]["evidence"])
    assert doc["restore"]["outcome"] == "restored" and doc["final"]["healthy"]
    assert len({tok for _pid, tok in ours_running(runs)}) == 1 and not lock_dir().exists()


def test_a_server_that_exits_cleanly_in_smoke_is_not_a_numerics_bug(tmp_path: Path, runs: Path) -> None:
    """A server gone mid-smoke (exit 0) is diagnosed as a death, not as wrong output; the box is restored."""
    quits = behaviour(
        tmp_path,
        "quits",
        "import os, threading, time, urllib.request\n"
        "def watch():\n"
        "    while not os.path.exists(os.environ['QUIT_FILE']):\n"
        "        time.sleep(0.05)\n"
        "    os._exit(0)\n"
        "threading.Thread(target=watch, daemon=True).start()\n",
    )
    flag = tmp_path / "quit-now"
    path = experiment(
        tmp_path,
        "quits",
        [{"name": "quits", "env": {**quits, "QUIT_FILE": str(flag)}}],
        smoke={"questions": 60, "seed": 1, "burst": False},
    )
    run = Background(tmp_path, "run", str(path), "--json", runs=runs)
    try:
        run.wait_for("#1 ready in", timeout=240)
        flag.write_text("")
        rc, out, err = run.finish()
    finally:
        run.kill()
    assert rc == 1, err
    quit_attempt = json.loads(out)["attempts"][1]
    assert quit_attempt["failed_phase"] == "smoke"
    assert quit_attempt["diagnosis"]["kind"] != "wrong_output"
    assert json.loads(out)["restore"]["outcome"] == "restored"
