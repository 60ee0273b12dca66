"""The host's environment: the facts that make two runs comparable (OS, Python, GPU and driver, the recipe's probes).

A probe through the ``Host`` protocol, beside it: one shell line for the fixed facts, then each of the recipe's
``probes`` (a command template filled with the experiment's variables). A probe that fails or hangs costs the run
nothing but its figure.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence

from campaign.errors import CampaignError
from campaign.hosts.base import Host
from campaign.records import Environment
from campaign.version import commit, version

#: OS, Python and the first GPU with its driver, one per line ("-" and "none" when absent).
_FACTS = (
    "uname -srm; python3 -c 'import platform; print(platform.python_version())' 2>/dev/null || echo -; "
    "(command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi --query-gpu=name,driver_version "
    "--format=csv,noheader | head -1) || echo none"
)


def probe_environment(
    host: Host,
    *,
    recipe: str,
    probes: Mapping[str, Sequence[str]],
    values: Mapping[str, str],
    clock_offset_s: float = 0.0,
) -> Environment:
    """Host facts and the recipe's ``probes`` (templates filled from ``values``), with campaign's version and commit."""
    res = host.run(_FACTS, timeout=30)
    lines = [*res.stdout.strip().splitlines(), "", "", ""]
    gpu, _, driver = lines[2].partition(",")
    found: dict[str, str | None] = {}
    for name, template in probes.items():
        try:
            cmd = " ".join(shlex.quote(part.format(**values)) for part in template)
        except (KeyError, IndexError, ValueError):
            found[name] = None
            continue
        try:
            out = host.run(cmd + " 2>/dev/null", timeout=60)
        except CampaignError:
            found[name] = None
            continue
        tail = out.stdout.strip().splitlines()
        found[name] = tail[-1].strip() if out.ok and tail else None
    return Environment(
        host=host.name,
        os=lines[0],
        python=lines[1],
        gpu=gpu.strip() or "none",
        driver=driver.strip() or None,
        campaign_version=version(),
        campaign_commit=commit(),
        recipe=recipe,
        clock_offset_s=round(clock_offset_s, 4),
        **found,
    )
