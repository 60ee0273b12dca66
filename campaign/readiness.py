"""Readiness: follow the log from a byte offset, probe health, watch the group; name the phase a start stalled in.

Ready means three signals at once: the process group is alive, the recipe's ready marker appeared in the log, and
the health endpoint answers 200 (``/v1/models`` is not used: it answers before warm-up). The loop polls every
``poll_s`` (0.1 s by default): it reads only the bytes appended since the last poll, so a long log is never
re-read, and it checks liveness every poll, so a death is noticed well within a second. A poll reads at most
``POLL_BYTES`` and keeps at most ``MAX_LINE`` of a line (``LogFollower``): a server that floods its log, or writes a
gigabyte with no newline, still has its death and the deadline checked every poll, in bounded memory. A ready marker
without its newline counts once it is read.

``ready_detect_lag_s`` is measured, not assumed: when the marker first shows up, the log file's mtime on the host
(corrected by the host's clock offset) dates the ready line; the lag is the time from then to the moment the
three signals held. Lines appended after the marker in the same poll can only make the figure smaller by the
time between them, which the poll interval bounds. ``death_detect_lag_s`` is measured the same way from the
mtime of the ``exit_code`` file the launch script writes when the server exits.

A poll whose host call fails (a dropped SSH connection; ``SSHHost`` re-establishes it at the next call) is repeated
at the next poll: every check here only reads, so repeating one is safe. ``HOST_RETRIES`` failed polls in a row, or
a host-key error, end the wait with the ``HostError``.
"""

from __future__ import annotations

import re
import shlex
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import httpx

from campaign.errors import HostError, HostKeyError, HostLost
from campaign.hosts.base import Host
from campaign.interruption import checkpoint
from campaign.records import LaunchSpec, PhaseMark
from campaign.server import Running, ServerControl

q = shlex.quote
LineCallback = Callable[[int, str], None]
PhaseCallback = Callable[[str], None]
READ_CHUNK = 1 << 20
#: What one poll reads at most, what a final flush reads at most, and the longest line kept whole (LogFollower).
POLL_BYTES = 8 << 20
FLUSH_BYTES = 16 << 20
MAX_LINE = 64 << 10
#: The most of a server's log a run keeps (its head and tail past this): a 1 GiB log is not copied, nor held, whole.
LOG_COPY_BYTES = 32 << 20
#: Failed polls in a row that end a wait (a reconnect happens inside one poll, so a blip costs one or two).
HOST_RETRIES = 3


class LogFollower:
    """Reads a file on a host incrementally from a byte offset and yields complete lines with their numbers.

    Bounded whatever the log holds: one poll reads at most ``POLL_BYTES`` (the caller checks the server's life and
    its deadline between polls, so a flood never hides a death), a line longer than ``MAX_LINE`` keeps its head and
    tail around a note of what was cut (a 1 GiB line with no newline costs ``MAX_LINE``, not 1 GiB, and is never
    rescanned), and ``flush`` reads at most ``FLUSH_BYTES`` before it skips to the file's last ``READ_CHUNK``.
    """

    def __init__(self, host: Host, path: str, offset: int = 0) -> None:
        self.host = host
        self.path = path
        self.offset = offset
        self.lines_seen = 0
        self._head = b""  # the first MAX_LINE / 2 bytes of an over-long unterminated line
        self._partial = b""  # the unterminated line (its tail, once it is over-long)
        self._cut = 0  # bytes dropped between the two
        self._inode: int | None = None  # the file's inode when ``reopened`` last looked

    def _append(self, data: bytes) -> None:
        self._partial += data
        if len(self._head) + len(self._partial) <= MAX_LINE:
            return
        half = MAX_LINE // 2
        if not self._head:
            self._head, self._partial = self._partial[:half], self._partial[half:]
        excess = len(self._partial) - half
        if excess > 0:
            self._cut += excess
            self._partial = self._partial[excess:]

    def _line(self) -> str:
        """The unterminated line so far, as text (its cut middle noted)."""
        cut = f" [... {self._cut} bytes cut ...] ".encode() if self._cut else b""
        return (self._head + cut + self._partial).decode(errors="replace").rstrip("\r")

    def _take(self, out: list[tuple[int, str]]) -> None:
        self.lines_seen += 1
        out.append((self.lines_seen, self._line()))
        self._head, self._partial, self._cut = b"", b"", 0

    def reopened(self) -> str | None:
        """A note when the file was replaced (rotated) or cut shorter than what was read; following then restarts
        at its start. One host call: for ``campaign logs --follow``, not for every readiness poll."""
        out = self.host.run(f"stat -c '%i %s' {q(self.path)} 2>/dev/null", timeout=10).stdout.split()
        if len(out) != 2 or not all(x.isdigit() for x in out):
            return None
        inode, size = int(out[0]), int(out[1])
        note = None
        if self._inode is not None and inode != self._inode:
            note = f"[campaign: {self.path} was replaced (rotated?); following the new file from its start]"
        elif size < self.offset:
            note = f"[campaign: {self.path} was cut to {size} bytes; following it from its start]"
        self._inode = inode
        if note is not None:
            self.offset, self._head, self._partial, self._cut = 0, b"", b"", 0
        return note

    def pending(self) -> str:
        """The unterminated last line read so far ("" when the log ends with a newline)."""
        return self._line() if self._partial or self._head else ""

    def _feed(self, data: bytes, out: list[tuple[int, str]]) -> None:
        first, nl, rest = data.partition(b"\n")
        self._append(first)
        if nl:
            self._take(out)
            *complete, last = rest.split(b"\n")
            for raw in complete:
                self.lines_seen += 1
                out.append((self.lines_seen, raw[:MAX_LINE].decode(errors="replace").rstrip("\r")))
            self._append(last)

    def poll(self, budget: int | None = None) -> list[tuple[int, str]]:
        """New complete lines (1-based number, text) since the last poll, reading at most ``budget`` bytes."""
        out: list[tuple[int, str]] = []
        left = POLL_BYTES if budget is None else budget
        while left > 0:
            want = min(READ_CHUNK, left)
            data = self.host.read_file(self.path, offset=self.offset, limit=want)
            if not data:
                break
            self.offset += len(data)
            left -= len(data)
            self._feed(data, out)
            if len(data) < want:
                break
        return out

    def flush(self) -> list[tuple[int, str]]:
        """Everything left, the unterminated last line included (for a server that died mid-line); past
        ``FLUSH_BYTES`` the middle is skipped to the file's last ``READ_CHUNK``, which is where a death is told."""
        out = self.poll(FLUSH_BYTES)
        size = _size(self.host, self.path)
        if size is not None and size - self.offset > READ_CHUNK:
            self._append(f" [... {size - READ_CHUNK - self.offset} bytes of the log skipped ...] ".encode())
            self.offset = size - READ_CHUNK
            data = self.host.read_file(self.path, offset=self.offset, limit=READ_CHUNK)
            self.offset += len(data)
            self._feed(data, out)
        if self._partial or self._head:
            self._take(out)
        return out


@dataclass
class Readiness:
    """The outcome of waiting for a server to become ready."""

    ready: bool
    phase: str
    phases: list[PhaseMark] = field(default_factory=list)
    died: bool = False
    timed_out: bool = False
    exit_code: int | None = None
    launch_to_ready_s: float | None = None
    ready_detect_lag_s: float | None = None
    death_detect_lag_s: float | None = None
    detail: str = ""
    last_line: str = ""


def clock_offset(host: Host) -> float:
    """The host's clock minus ours, in seconds (midpoint of one round trip; 0 where the host has no %N)."""
    t0 = time.time()
    res = host.run("date +%s.%N", timeout=10)
    t1 = time.time()
    try:
        return float(res.stdout.strip()) - (t0 + t1) / 2
    except ValueError:
        return 0.0


def health_status(base_url: str, path: str, timeout: float = 2.0) -> int | None:
    """HTTP status of the health endpoint, or None when nothing answers (refused, reset, timed out)."""
    try:
        return httpx.get(base_url + path, timeout=timeout).status_code
    except httpx.HTTPError:
        return None


def wait_ready(
    control: ServerControl,
    running: Running,
    spec: LaunchSpec,
    *,
    deadline_s: float,
    poll_s: float = 0.1,
    offset_s: float = 0.0,
    on_line: LineCallback | None = None,
    on_phase: PhaseCallback | None = None,
) -> Readiness:
    """Poll until the three readiness signals hold, the group dies, or ``deadline_s`` passes."""
    host = control.host
    follower = LogFollower(host, running.log_path)
    marker = re.compile(spec.ready_marker)
    # Case-insensitive: builds differ in case alone ("Capture cuda graph begin", "Capture target decode CUDA graph").
    phase_rx = {name: re.compile(rx, re.IGNORECASE) for name, rx in spec.phases.items()}
    base_url = host.url(spec.port)
    # Durations run on the monotonic clock, from the launch (dated on the wall clock, a moment ago): a wall-clock
    # step during the wait (NTP) moves neither the deadline nor a recorded duration (it gave "ready in -7191 s").
    t_start = time.monotonic() - max(0.0, time.time() - running.started_at)
    deadline = time.monotonic() + deadline_s
    phase = "launch"
    phases: list[PhaseMark] = []
    marker_line_at: float | None = None
    last_line = ""

    marker_seen = False

    def take(lines: list[tuple[int, str]]) -> None:
        nonlocal phase, marker_seen, last_line
        for number, text in lines:
            if text.strip():
                last_line = text
            if on_line is not None:
                on_line(number, text)
            for name, rx in phase_rx.items():
                if rx.search(text) and not any(p.name == name for p in phases):
                    phases.append(PhaseMark(name=name, at_s=round(time.monotonic() - t_start, 3), line=number))
                    phase = name
                    if on_phase is not None:
                        on_phase(name)
            if not marker_seen and marker.search(text):
                marker_seen = True
                if not any(p.name == "ready" for p in phases):
                    phases.append(PhaseMark(name="ready", at_s=round(time.monotonic() - t_start, 3), line=number))
                phase = "ready"

    def step() -> Readiness | None:
        """One poll: the outcome when the wait is over, else None."""
        nonlocal marker_line_at, marker_seen, phase
        take(follower.poll())
        if not marker_seen and marker.search(follower.pending()):
            # A marker printed without its newline (the server then waits, serving): seen all the same.
            marker_seen, phase = True, "ready"
            if not any(p.name == "ready" for p in phases):
                at = round(time.monotonic() - t_start, 3)
                phases.append(PhaseMark(name="ready", at_s=at, line=follower.lines_seen + 1))
        if marker_seen and marker_line_at is None:
            # Dated after take(): lines already taken are not read again if this call fails and the poll repeats.
            marker_line_at = _mtime(host, running.log_path) - offset_s
        if marker_line_at is not None:
            status = health_status(base_url, spec.health_path)
            if status == 200 and control.alive(running):
                now = time.time()
                since_launch = time.monotonic() - t_start
                return Readiness(
                    ready=True,
                    phase="ready",
                    phases=phases,
                    launch_to_ready_s=round(since_launch, 3),
                    ready_detect_lag_s=round(max(0.0, now - marker_line_at), 4),
                    detail=f"ready: marker seen and {spec.health_path} answered 200",
                    last_line=last_line,
                )
        if not control.alive(running):
            noticed = time.time()
            take(follower.flush())
            code = control.exit_code(running.remote_dir)
            lag = None
            if code is not None:
                lag = round(max(0.0, noticed - (_mtime(host, running.remote_dir + "/exit_code") - offset_s)), 4)
            how = f"exit status {code}" if code is not None else "no exit status recorded"
            return Readiness(
                ready=False,
                phase=phase,
                phases=phases,
                died=True,
                exit_code=code,
                death_detect_lag_s=lag,
                detail=f"the server died during {phase} ({how})",
                last_line=last_line,
            )
        if time.monotonic() >= deadline:
            take(follower.flush())
            waiting = "the health endpoint" if marker_line_at is not None else "the ready marker"
            return Readiness(
                ready=False,
                phase=phase,
                phases=phases,
                timed_out=True,
                detail=f"not ready after {deadline_s:g} s: stalled in {phase}, waiting for {waiting}",
                last_line=last_line,
            )
        return None

    failures = 0
    while True:
        checkpoint()  # a signal (campaign.interruption) ends the wait at the next poll
        try:
            outcome = step()
        except (HostKeyError, HostLost):
            raise  # a changed key, or a host that stayed away for a whole reconnect budget: no poll will fix it
        except HostError:
            failures += 1
            if failures >= HOST_RETRIES or time.monotonic() >= deadline:
                raise
        else:
            failures = 0
            if outcome is not None:
                return outcome
        time.sleep(poll_s)


def log_copy(host: Host, path: str, limit: int = LOG_COPY_BYTES) -> bytes:
    """The log at ``path`` as the run keeps it: whole up to ``limit`` bytes, else its first and last ``limit / 2``
    around a line saying how much was left out (a server that wrote a gigabyte is not copied, nor held, whole)."""
    size = _size(host, path)
    if size is None or size <= limit:
        return host.read_file(path, limit=limit)
    half = limit // 2
    head = host.read_file(path, limit=half)
    tail = host.read_file(path, offset=size - half, limit=half)
    note = f"\n[... campaign kept the first and last {half >> 20} MiB; {size - 2 * half} bytes left out ...]\n"
    return head + note.encode() + tail


def _size(host: Host, path: str) -> int | None:
    """The file's size on the host, or None when it cannot be read."""
    out = host.run(f"stat -c %s {q(path)} 2>/dev/null", timeout=10).stdout.strip()
    return int(out) if out.isdigit() else None


def _mtime(host: Host, path: str) -> float:
    """The file's modification time on the host, in the host's clock (seconds with a fraction)."""
    res = host.run(f"stat -c %.9Y {q(path)} 2>/dev/null || stat -c %Y {q(path)}", timeout=10)
    try:
        return float(res.stdout.strip().splitlines()[0])
    except (ValueError, IndexError):
        return time.time()
