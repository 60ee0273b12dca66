"""Installs where users are: the orchestrator alone, and the `server` extra resolved for the platforms users have.

These tests use the package index, as a user's `pip install` does (the machines that run them reach PyPI).
- The orchestrator installs into a fresh venv without any extra and runs without torch.
- The `server` extra's requirements, read from pyproject.toml with their markers evaluated for each target, resolve
  in pip's dry run against the public registry alone (no local wheels, no local pip configuration) for CUDA Linux
  x86_64 and aarch64 and macOS arm64, on Python 3.12; triton comes with it on Linux and not on macOS.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest
from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.version import Version

REPO = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())

pytestmark = pytest.mark.slow
PY312 = {"python_version": "3.12", "python_full_version": "3.12.3", "implementation_name": "cpython"}


def _manylinux(arch: str, newest: int = 28) -> list[str]:
    """The platform tags a glibc-2.28 Linux accepts, newest first (pip's --platform matches each tag exactly)."""
    tags = [f"manylinux_2_{n}_{arch}" for n in range(newest, 16, -1)]
    return [*tags, f"manylinux2014_{arch}"]


# (name, pip --platform tags, marker environment of such a machine)
TARGETS: list[tuple[str, list[str], dict[str, str]]] = [
    (
        "linux-x86_64",
        _manylinux("x86_64"),
        {"sys_platform": "linux", "platform_system": "Linux", "platform_machine": "x86_64"},
    ),
    (
        "linux-aarch64",
        _manylinux("aarch64"),
        {"sys_platform": "linux", "platform_system": "Linux", "platform_machine": "aarch64"},
    ),
    (
        "macos-arm64",
        ["macosx_14_0_arm64"],
        {"sys_platform": "darwin", "platform_system": "Darwin", "platform_machine": "arm64"},
    ),
]


def requirements_for(extra: str, env: dict[str, str]) -> list[Requirement]:
    """The base dependencies plus ``extra``'s, with markers evaluated for ``env`` (markers then dropped)."""
    marker_env = {**default_environment(), **PY312, **env}
    out = []
    for spec in [*PYPROJECT["project"]["dependencies"], *PYPROJECT["project"]["optional-dependencies"][extra]]:
        req = Requirement(spec)
        if req.marker is None or req.marker.evaluate(marker_env):
            req.marker = None
            out.append(req)
    return out


# pip evaluates environment markers (torch's `platform_system == "Linux"` CUDA packages, say) against the machine it
# runs on even with --platform, so a macOS resolution from Linux would ask for CUDA wheels. This runs pip with the
# target machine's marker environment instead; nothing else about pip changes.
PIP_AS = """
import json, sys
from pip._vendor.packaging import markers
target = {**markers.default_environment(), **json.loads(sys.argv[1])}
markers.default_environment = lambda: dict(target)
from pip._internal.cli.main import main
sys.exit(main(sys.argv[2:]))
"""


def public_pip_env() -> dict[str, str]:
    """This environment without any pip configuration: no local wheel folder, no constraints file, no other index."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    env["PIP_CONFIG_FILE"] = os.devnull
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    return env


@pytest.mark.timeout(900)
@pytest.mark.parametrize(("name", "platforms", "env"), TARGETS, ids=[t[0] for t in TARGETS])
def test_server_extra_resolves_from_the_public_registry(
    tmp_path: Path, name: str, platforms: list[str], env: dict[str, str]
) -> None:
    """pip resolves the reference server's dependencies for this platform from PyPI alone, with binary wheels only."""
    reqs = requirements_for("server", env)
    cmd = [sys.executable, "-c", PIP_AS, json.dumps({**PY312, **env}), "install", "--isolated", "--dry-run"]
    cmd += ["--ignore-installed", "--quiet"]
    cmd += ["--report", str(tmp_path / "report.json"), "--only-binary=:all:", "--python-version", "3.12"]
    cmd += [a for p in platforms for a in ("--platform", p)]
    cmd += ["--target", str(tmp_path / "target"), *map(str, reqs)]
    res = subprocess.run(cmd, capture_output=True, text=True, env=public_pip_env(), timeout=840)
    assert res.returncode == 0, f"{name}: the server extra does not resolve:\n{res.stderr[-3000:]}"
    report: dict[str, Any] = json.loads((tmp_path / "report.json").read_text())
    got = {
        Requirement(i["metadata"]["name"]).name.lower(): Version(i["metadata"]["version"]) for i in report["install"]
    }
    wheels = {i["metadata"]["name"].lower(): i["download_info"]["url"].rsplit("/", 1)[-1] for i in report["install"]}
    # torch's own wheel for that machine (not a pure-Python or other-platform file)
    assert platforms[0].split("_", 1)[0] in wheels["torch"] and env["platform_machine"] in wheels["torch"], wheels[
        "torch"
    ]
    for req in reqs:
        assert req.name.lower() in got, f"{name}: {req.name} is not in the resolution"
        assert req.specifier.contains(got[req.name.lower()], prereleases=True), (req, got[req.name.lower()])
    assert ("triton" in got) == (env["platform_system"] == "Linux"), (
        f"{name}: triton {'missing' if 'triton' not in got else 'present'}"
    )


@pytest.mark.timeout(600)
def test_orchestrator_alone_installs_without_torch_and_runs(tmp_path: Path) -> None:
    """`pip install .` with no extra into a fresh venv: no torch, and `campaign --help` and `campaign diagnose` work."""
    src = tmp_path / "src"
    src.mkdir()
    # A copy of what the package is built from, so the build leaves nothing in the checkout.
    for item in ("pyproject.toml", "README.md", "campaign", "mla_kernels"):
        if (REPO / item).is_dir():
            shutil.copytree(REPO / item, src / item, ignore=shutil.ignore_patterns("__pycache__", "*.safetensors"))
        elif (REPO / item).exists():
            shutil.copy2(REPO / item, src / item)
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    pip = subprocess.run(
        [str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", str(src)],
        capture_output=True,
        text=True,
        timeout=540,
    )
    assert pip.returncode == 0, pip.stderr[-3000:]

    probe = subprocess.run(
        [str(venv / "bin" / "python"), "-c", "import importlib.util as u; print(u.find_spec('torch') is None)"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert probe.stdout.strip() == "True", "torch came with the orchestrator alone"

    cli = venv / "bin" / "campaign"
    helped = subprocess.run([str(cli), "--help"], capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert helped.returncode == 0, helped.stderr
    assert "diagnose" in helped.stdout

    log = tmp_path / "server.log"
    log.write_text(
        "Usage: transformers serve [OPTIONS] [FORCE_MODEL]\n"
        "Try 'transformers serve --help' for help.\n\n"
        "Error: No such option '--cb-use-cuda-graphs'.\n"
    )
    diag = subprocess.run(
        [str(cli), "diagnose", str(log), "--exit-code", "2", "--json"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert diag.returncode in (0, 1), diag.stderr
    doc = json.loads(diag.stdout)
    assert doc["kind"] == "bad_args", doc
    assert "--cb-use-cuda-graphs" in json.dumps(doc["evidence"])
