"""The run's plan: every variant rendered once, in the spellings of the server the host runs, after the flag check.

``Plan.checked`` is where a run renders its variants: it reads the server's ``--help`` on the host (cached per
version), renders the plan in that version's spellings and checks every flag (``flags.checked_plan``). The run
makes it once, after taking the lock, and hands it to every step below; nothing else on the way renders the plan
again (``config.load`` only checks that each variant renders, to name a bad knob's line before anything is touched).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from campaign.config import Loaded, PlannedVariant
from campaign.flags import checked_plan
from campaign.hosts.base import Host


@dataclass(frozen=True)
class Plan:
    """The variants a run runs, in order, as the server on its host spells them."""

    planned: list[PlannedVariant]
    #: The server's version its ``--help`` was read for (None when the recipe declares no help, or it was unread).
    server_version: str | None = None
    #: Lines for a person about the check (deprecated flags, ``flags not checked: ...``).
    notes: list[str] = field(default_factory=list)

    @classmethod
    def checked(cls, loaded: Loaded, host: Host, runs: Path, only: Sequence[str] = ()) -> Plan:
        """The plan rendered for the server on ``host`` and checked against its help (``ConfigError`` when not)."""
        check = checked_plan(loaded, host, runs, only)
        return cls(check.planned, check.help.version if check.help is not None else None, check.notes)
