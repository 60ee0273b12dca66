"""Reconnecting: a lost SSH connection opened again, with backoff, for a bounded time.

A dropped connection (sshd restarted, a network blip, the box rebooted) is re-established by the next call that
finds it down: the same target, keys and host-key check. A changed host key on reconnect is refused like any other,
at once: it is an answer, not a blip.

The budget is a hard deadline, counted from the moment the call found the connection down: attempts go on until
it, and each attempt is given at most the time left (a host that drops packets would otherwise hold the last
attempt for a whole connect timeout past the deadline). So ``HostLost`` is raised ``within_s`` after the loss was
found, not earlier (a blip that ends inside the budget is still caught) and not later.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from campaign.errors import HostError, HostKeyError, HostLost
from campaign.hosts.ssh.connect import Link

#: First wait between attempts, doubled after each failure up to ``MAX_DELAY_S``.
FIRST_DELAY_S = 0.25
MAX_DELAY_S = 5.0


def reopen(open_link: Callable[[float], Link], within_s: float, name: str, attempt_s: float) -> Link:
    """``open_link(timeout)`` until it succeeds, for ``within_s``; then the last failure, as a ``HostLost``.

    Each attempt gets ``attempt_s`` (the connect timeout), or the time left before the deadline when that is less.
    """
    started = time.monotonic()
    deadline = started + within_s
    delay = FIRST_DELAY_S
    attempts = 0
    while True:
        attempts += 1
        try:
            return open_link(max(min(attempt_s, deadline - time.monotonic()), 0.01))
        except HostKeyError:
            raise
        except HostError as exc:
            left = deadline - time.monotonic()
            if left <= 0:
                raise HostLost(
                    f"{name}: the SSH connection was lost and could not be re-established within {within_s:g} s "
                    f"({attempts} attempts over {time.monotonic() - started:.1f} s): {exc}",
                    hint="check that the host is up and sshd answers; `campaign restore` puts the known-good back",
                ) from exc
        time.sleep(min(delay, left))
        delay = min(delay * 2, MAX_DELAY_S)
