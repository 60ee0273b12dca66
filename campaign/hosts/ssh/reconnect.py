"""Reconnecting: a lost SSH connection opened again, with backoff, for a bounded time.

A dropped connection (sshd restarted, a network blip, the box rebooted) is re-established by the next call that
finds it down: the same target, keys and host-key check. A changed host key on reconnect is refused like any other,
at once: it is an answer, not a blip.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from campaign.errors import HostError, HostKeyError, HostLost
from campaign.hosts.ssh.connect import Link

#: First wait between attempts, doubled after each failure up to ``MAX_DELAY_S``.
FIRST_DELAY_S = 0.25
MAX_DELAY_S = 5.0


def reopen(open_link: Callable[[], Link], within_s: float, name: str) -> Link:
    """``open_link()`` until it succeeds, for up to ``within_s``; then the last failure, as a ``HostLost``."""
    deadline = time.monotonic() + within_s
    delay = FIRST_DELAY_S
    while True:
        try:
            return open_link()
        except HostKeyError:
            raise
        except HostError as exc:
            if time.monotonic() + delay > deadline:
                raise HostLost(
                    f"{name}: the SSH connection was lost and could not be re-established within {within_s:g} s: {exc}",
                    hint="check that the host is up and sshd answers; `campaign restore` puts the known-good back",
                ) from exc
        time.sleep(delay)
        delay = min(delay * 2, MAX_DELAY_S)
