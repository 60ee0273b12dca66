"""The fast tier's scripted host and server: the real pipeline, in this process, against servers that start in
milliseconds and fail exactly as their script says.

``ScriptedHost`` implements the Host protocol (campaign/hosts/base.py) over this machine's shell, so the lock, the
launch script, process groups, ports and logs are all real; what it adds is a script of host faults (a command that
matches a rule raises ``HostError`` or returns a chosen ``Result``) and the list of every command run. The server is
``tests/scripted/server.py`` under the recipe ``tests/scripted/recipe.yaml``: each launch plays the next step of its
``script`` knob (``ok``: serve the scheduled endpoint of campaign/bench/testing.py; ``die:LOG``: replay a real failure
log and exit 1; ``hang``: never become ready), so readiness, diagnosis, the bench and the restore run for real.

``experiment`` writes an experiment file for it; ``run`` drives ``Campaign.run`` in-process, the way
``Operations.run`` does, and returns the report.
"""

from __future__ import annotations

import contextlib
import re
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from campaign import config as cfg
from campaign.errors import HostError
from campaign.hosts.base import Result
from campaign.hosts.local import LocalHost
from campaign.records import RunReport
from campaign.store import Store

HERE = Path(__file__).resolve().parent
RECIPE = HERE / "recipe.yaml"
SERVER = HERE / "server.py"


@dataclass
class Fault:
    """A host fault: after ``skip`` commands matching ``pattern`` ran, the next ``times`` raise ``error`` (a
    ``HostError``: the host could not run it) or return ``result`` instead of running."""

    pattern: str
    error: str | None = None
    result: Result | None = None
    times: int = 1
    skip: int = 0


@dataclass
class ScriptedHost:
    """The Host protocol over this machine's shell, with scripted faults and a log of every command."""

    name: str = "local"
    #: Servers run as process groups (no batch scheduler), as on LocalHost.
    scheduler: None = None
    faults: list[Fault] = field(default_factory=list)
    calls: list[str] = field(default_factory=list)
    on_call: Callable[[str], None] | None = None

    def __post_init__(self) -> None:
        self._local = LocalHost()

    def run(self, command: str, *, timeout: float = 30.0) -> Result:
        self.calls.append(command)
        if self.on_call is not None:
            self.on_call(command)
        for fault in self.faults:
            if fault.times > 0 and re.search(fault.pattern, command):
                if fault.skip > 0:
                    fault.skip -= 1
                    continue
                fault.times -= 1
                if fault.error is not None:
                    raise HostError(fault.error)
                if fault.result is not None:
                    return fault.result
        return self._local.run(command, timeout=timeout)

    def write_file(self, path: str, data: bytes, *, mode: int = 0o600) -> None:
        self._local.write_file(path, data, mode=mode)

    def read_file(self, path: str, *, offset: int = 0, limit: int | None = None) -> bytes:
        return self._local.read_file(path, offset=offset, limit=limit)

    def url(self, port: int) -> str:
        return self._local.url(port)

    def close(self) -> None:
        self._local.close()


def fleet_hosts(tmp: Path, ports: Sequence[int]) -> list[dict[str, Any]]:
    """``hosts:`` entries for a fleet on this machine: a box each (its own workdir, state folder and port)."""
    return [
        {"kind": "local", "workdir": str(tmp / f"box{i}"), "state_dir": str(tmp / f"state{i}"), "knobs": {"port": p}}
        for i, p in enumerate(ports)
    ]


def experiment(
    tmp: Path,
    port: int,
    variants: Sequence[dict[str, Any]] = (),
    *,
    baseline: str = "ok",
    name: str = "scripted",
    **extra: Any,
) -> Path:
    """An experiment file for the scripted server: a baseline playing ``baseline``, then ``variants`` (each a dict
    with ``name`` and ``script``, and any other knobs), a short smoke and a small bench.
    """
    doc: dict[str, Any] = {
        "name": name,
        "host": {"kind": "local", "workdir": str(tmp / "box"), "state_dir": str(tmp / "hoststate")},
        "recipe": str(RECIPE),
        "vars": {"python": sys.executable, "server": str(SERVER), "state": str(tmp / "scripts")},
        "baseline": {"knobs": {"port": port, "script": baseline}},
        "variants": [{"name": v["name"], "knobs": {k: x for k, x in v.items() if k != "name"}} for v in variants],
        # Two questions, no burst, no log-probabilities: the scheduled endpoint answers arithmetic, and only that.
        "smoke": {"questions": 2, "burst": False, "logprob_tolerance": None, "top_logprobs": 0},
        "bench": {"concurrency": [1], "requests": 3, "warmup": 0},
        "timeouts": {"ready_s": 20, "stop_grace_s": 2, "poll_s": 0.05},
        "retry": {"budget": 1, "backoff_s": 0},
        **extra,
    }
    if "hosts" in extra:
        del doc["host"]  # a fleet names every host under `hosts`
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def run_fleet(path: Path, runs: Path, hosts: Sequence[ScriptedHost], **options: Any) -> RunReport:
    """Run the experiment at ``path`` (which names a fleet) over ``hosts`` in this process, as ``campaign run``."""
    from campaign.fleet import Fleet

    loaded = cfg.load(str(path))
    try:
        return Fleet(loaded, list(hosts), Store(runs), **options).run()
    finally:
        for host in hosts:
            host.close()
        STARTED.append((path, runs))


def run(path: Path, runs: Path, host: ScriptedHost | None = None, **options: Any) -> RunReport:
    """Run the experiment at ``path`` in this process, as ``campaign run`` does on one host; the report."""
    from campaign.pipeline import Campaign

    loaded = cfg.load(str(path))
    with_host = host or ScriptedHost()
    try:
        return Campaign(loaded, with_host, Store(runs), **options).run()
    finally:
        with_host.close()
        STARTED.append((path, runs))


#: (experiment, run store) of every run since the last ``stop_what_runs``.
STARTED: list[tuple[Path, Path]] = []


def stop_what_runs() -> None:
    """Stop what the runs left serving (their known-good), as `campaign stop` would: a test's servers end with it."""
    from campaign.errors import CampaignError
    from campaign.operations import Operations

    while STARTED:
        path, runs = STARTED.pop()
        with contextlib.suppress(CampaignError):
            Operations(runs=runs).stop(str(path), [], force=True)
