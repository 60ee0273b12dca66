"""Helpers shared by several test modules (import them; never copy them into a test file)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


@contextmanager
def triton_interpreter(needed: bool) -> Iterator[None]:
    """``TRITON_INTERPRET=1`` inside the block when ``needed`` (no GPU), the environment as it was after it.

    Triton decides interpreted or compiled when a kernel is defined and mla_kernels reads the variable at import, so
    a kernel test module imports mla_kernels inside this block and runs its tests inside it (``interpreted``); the
    tests and CLI subprocesses of other modules never inherit it.
    """
    before = os.environ.get("TRITON_INTERPRET")
    if needed and before is None:
        os.environ["TRITON_INTERPRET"] = "1"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("TRITON_INTERPRET", None)
        else:
            os.environ["TRITON_INTERPRET"] = before


def interpreted(needed: bool) -> Iterator[None]:
    """A module fixture's body: the module's tests run under ``triton_interpreter(needed)``."""
    with triton_interpreter(needed):
        yield


def run_cli(*args: str, runs: Path, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    """Run the CLI to the end as a user would (``python -m campaign.cli --runs-dir RUNS ARGS``); text streams."""
    return subprocess.run(
        [sys.executable, "-m", "campaign.cli", "--runs-dir", str(runs), *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
