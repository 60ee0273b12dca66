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


#: Test modules that drive a real server (the reference server, `transformers serve`), a real sshd or a real Slurm
#: through processes: the integration tier, which `make test` runs and `make check` leaves out.
INTEGRATION_MODULES = {
    "test_attribution_loop",
    "test_bench_refserver",
    "test_bench_sla",
    "test_bounds",
    "test_compare_aa",
    "test_effective",
    "test_faults",
    "test_fleet",
    "test_hosts",
    "test_install",
    "test_kernels_bench",
    "test_kernels_sass",
    "test_longrun",
    "test_parking",
    "test_loop",
    "test_profile",
    "test_refserver",
    "test_refserver_accuracy",
    "test_refserver_gpu",
    "test_refserver_longctx",
    "test_refserver_sleep",
    "test_shared_box",
    "test_slurm",
    "test_smoke",
    "test_ssh_forward_streams",
    "test_ssh_reach",
    "test_transformers_serve",
    "test_vllm_cpu",
}


#: Test modules that run in-process but take minutes on two CPU cores: the kernels in Triton's interpreter.
SLOW_MODULES = {
    "test_kernels",
    "test_kernels_fp8",
    "test_kernels_indexer",
    "test_kernels_mmasync",
    "test_kernels_warpgroup",
}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark the tests of those modules ``integration`` or ``slow``: ``make check`` leaves both out."""
    for item in items:
        name = item.module.__name__.rpartition(".")[2] if item.module is not None else ""
        if name in INTEGRATION_MODULES:
            item.add_marker(pytest.mark.integration)
        if name in SLOW_MODULES:
            item.add_marker(pytest.mark.slow)
