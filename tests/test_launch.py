"""The launch script as /bin/sh runs it: values stay literal, except a leading ~/ which is the host's home."""

from __future__ import annotations

import subprocess
from pathlib import Path

from campaign.config import shell_line
from campaign.records import LaunchSpec
from campaign.server import ServerControl

PRINT = 'printf "%s\\n" "$PWD" "$1" "$2" "$3" "$V" "$W"'


def _spec(workdir: str, *args: str, **env: str) -> LaunchSpec:
    return LaunchSpec(
        recipe="t",
        command=["/bin/sh", "-c", PRINT, "sh", *args],
        env=env,
        workdir=workdir,
        port=1,
        ready_marker="x",
        health_path="/",
    )


def test_leading_tilde_is_the_hosts_home_and_nothing_else_expands(tmp_path: Path) -> None:
    home = tmp_path / "a home"  # a space: the expansion must stay one word
    (home / "work").mkdir(parents=True)
    spec = _spec("~/work", "~/x", "~other/y", "~/$(touch pwned)", V="~/env", W="a~/b")
    out = tmp_path / "out"
    out.mkdir()
    script = out / "launch.sh"
    script.write_text(ServerControl.launch_script(spec, str(out), "test"))
    res = subprocess.run(
        ["/bin/sh", str(script)], env={"HOME": str(home), "PATH": "/usr/bin:/bin"}, capture_output=True, text=True
    )
    assert res.returncode == 0, res.stderr
    assert res.stdout.splitlines() == [
        f"{home}/work",
        f"{home}/x",
        "~other/y",
        f"{home}/$(touch pwned)",
        f"{home}/env",
        "a~/b",
    ]
    assert not list(tmp_path.rglob("pwned"))
    # The dry-run line shows the same words.
    assert '"$HOME"/x' in shell_line(spec) and "'~other/y'" in shell_line(spec)
