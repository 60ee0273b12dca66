"""Shared test fixtures: each area's fixtures live in tests/fixtures/ and are registered here."""

pytest_plugins = ["tests.fixtures.sshd", "tests.fixtures.refserver"]
