"""Long streams over an SSH forward, and a signal that arrives while the bench reads one.

The H200 run of 2026-12-03 (docs/results/2026-12-03-h200/longctx-01f4/, attempt 4) lost one of 32 streams
(``incomplete:connection_closed``) over an SSH host. The forward was not the cause: the first test carries 32 long
streams through it with none lost. The cause was the ``timeout`` around the campaign: its SIGTERM arrived while
the bench's event loop was inside one connection's read, where asyncio turns any ``BaseException`` but
``KeyboardInterrupt``/``SystemExit`` into a "Fatal read error" of that connection and carries on, so one stream
was cut and the run ignored the signal. The other tests put the signal (and a fleet's delivered interruption)
exactly there.
"""

from __future__ import annotations

import signal
import threading
import time
from asyncio import selector_events
from collections.abc import Callable, Iterator

import pytest

from campaign.bench import run_bench
from campaign.bench.testing import ScheduledServer
from campaign.hosts.ssh import SSHHost
from campaign.interruption import Interrupted, Interruption
from campaign.records import BenchEvent, BenchSettings

STREAMS = 32


@pytest.fixture(scope="module")
def fast_tokens() -> Iterator[ScheduledServer]:
    """Tokens every 2 ms: a 2,000-token stream lasts 4 s, and 32 of them send 64,000 events."""
    with ScheduledServer(ttft_ms=20, itl_ms=2) as srv:
        yield srv


def _port(server: ScheduledServer) -> int:
    return int(server.url.rsplit(":", 1)[1])


def _settings(tokens: int) -> BenchSettings:
    return BenchSettings(concurrency=[STREAMS], requests=STREAMS, warmup=0, output_len=tokens, max_tokens=tokens)


def test_32_long_streams_over_an_ssh_forward_all_complete(ssh_host: SSHHost, fast_tokens: ScheduledServer) -> None:
    result = run_bench(ssh_host.url(_port(fast_tokens)), _settings(2000))
    level = result.levels[0]
    assert level.errors == {}
    assert (level.successful, level.incomplete, level.failed) == (STREAMS, 0, 0)
    assert level.output_tokens == STREAMS * 2000


def _interrupt_mid_level(
    monkeypatch: pytest.MonkeyPatch, interrupt: Callable[[], None]
) -> Callable[[BenchEvent], None]:
    """Make ``interrupt`` run inside the event loop's socket read callback, 50 reads into the measured level.

    That is where a real signal landed on the H200 (``sock.recv`` under the loop's read callback); a signal's
    timing cannot be aimed there, so the seam is asyncio's own socket transport (the standard library's read
    callback, not our code), which runs the interruption exactly as the signal handler would. Returns the
    ``progress`` callback that arms it when the level's repeat begins.
    """
    armed = threading.Event()
    reads = 0
    original = selector_events._SelectorSocketTransport._read_ready

    def read_ready(self: selector_events._SelectorSocketTransport) -> None:
        nonlocal reads
        original(self)
        if armed.is_set():
            reads += 1
            if reads == 50:
                interrupt()

    monkeypatch.setattr(selector_events._SelectorSocketTransport, "_read_ready", read_ready)

    def progress(ev: BenchEvent) -> None:
        if ev.kind == "repeat":
            armed.set()

    return progress


def test_a_sigterm_while_a_stream_is_read_stops_the_bench(
    monkeypatch: pytest.MonkeyPatch, fast_tokens: ScheduledServer
) -> None:
    progress = _interrupt_mid_level(monkeypatch, lambda: signal.raise_signal(signal.SIGTERM))
    started = time.monotonic()
    with Interruption() as intr, pytest.raises(Interrupted) as caught:
        run_bench(fast_tokens.url, _settings(1000), progress=progress)
    assert caught.value.signum == signal.SIGTERM
    assert intr.count == 1
    # The first request takes 2 s and the level 2 s more: the bench stopped at the signal, not at the level's end.
    assert time.monotonic() - started < 3.9


def test_an_interruption_delivered_to_a_fleet_thread_while_a_stream_is_read_stops_the_bench(
    monkeypatch: pytest.MonkeyPatch, fast_tokens: ScheduledServer
) -> None:
    intr = Interruption()
    progress = _interrupt_mid_level(monkeypatch, lambda: intr.deliver(signal.SIGTERM))
    outcome: list[BaseException | str] = []

    def host_thread() -> None:  # as a fleet runs each host's campaign
        with intr:
            try:
                run_bench(fast_tokens.url, _settings(1000), progress=progress)
                outcome.append("returned")
            except BaseException as e:
                outcome.append(e)

    thread = threading.Thread(target=host_thread)
    thread.start()
    thread.join(timeout=20)
    assert len(outcome) == 1 and isinstance(outcome[0], Interrupted), outcome
    assert outcome[0].signum == signal.SIGTERM
