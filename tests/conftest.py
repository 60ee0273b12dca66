"""Shared test fixtures: each area's fixtures live in tests/fixtures/ and are registered here."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest_plugins = ["tests.fixtures.sshd", "tests.fixtures.refserver", "tests.fixtures.slurm"]


@pytest.fixture(autouse=True)
def _host_state(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Each test gets its own host state folder (lock, current.json), so tests and the developer's runs never meet.

    The CLIs a test starts inherit it through the environment (``CAMPAIGN_HOST_STATE``, campaign.lock).
    """
    path = tmp_path_factory.mktemp("hoststate")
    monkeypatch.setenv("CAMPAIGN_HOST_STATE", str(path))
    return path
