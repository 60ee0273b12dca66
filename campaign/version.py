"""campaign's version: the release in this file, and the git commit the code was loaded from when there is one.

``BASE`` is the one place the release is written (pyproject.toml reads it). Run from a git checkout, the version is
``BASE+gCOMMIT`` (``.dirty`` added when tracked files differ from the commit), so two builds of campaign are told
apart in every report (``Environment.campaign_version`` and ``campaign_commit``); installed without git (a wheel, a
tarball) it is ``BASE`` and the commit is None. git is asked once per process, only when a caller wants the answer.
"""

from __future__ import annotations

import functools
import subprocess
from pathlib import Path

BASE = "0.1.0"

#: The checkout the package was loaded from (a worktree's ``.git`` is a file, a clone's a folder).
_ROOT = Path(__file__).resolve().parent.parent


def _git(*args: str) -> str | None:
    """One git command's output in the checkout, or None when git is missing, fails or takes too long."""
    try:
        res = subprocess.run(["git", "-C", str(_ROOT), *args], capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return res.stdout.strip() if res.returncode == 0 else None


@functools.cache
def commit() -> str | None:
    """The full hash of the commit the code was loaded from, ``-dirty`` appended when tracked files were changed
    since; None outside a git checkout (an installed wheel)."""
    if not (_ROOT / ".git").exists():
        return None
    head = _git("rev-parse", "HEAD")
    if head is None:
        return None
    changed = _git("status", "--porcelain", "--untracked-files=no")
    return head + ("-dirty" if changed else "")


@functools.cache
def version() -> str:
    """``BASE`` with the commit as a local version label (``0.1.0+g3c57ba1d2f28``), or ``BASE`` without git."""
    found = commit()
    if found is None:
        return BASE
    head, _, dirty = found.partition("-")
    return f"{BASE}+g{head[:12]}" + (".dirty" if dirty else "")
