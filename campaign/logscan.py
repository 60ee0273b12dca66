"""Log scanning: one streaming pass over a server log that keeps only the lines some diagnosis rule could be about.

A log of hundreds of megabytes is mostly lines no rule cares about (progress bars, served requests, batch stats): a
line is looked at closely only when its *key* contains a needle of some rule (``campaign.needles``). Keys repeat (a
batch-stats line differs from the next only in its numbers), so the needle test runs once per distinct key, and the
pass costs a dictionary lookup per line.

What comes out (``Scan``) is bounded whatever the size of the log: the first and last interesting lines, the first
line of each "once" category (readiness, SGLang shape), and the counts the verdict needs.
"""

from __future__ import annotations

import codecs
import re
from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from campaign.fingerprint import ANSI, strip_prefix
from campaign.needles import KEY_BYTES, NeedleIndex

_ANSI_BYTES = re.compile(ANSI.pattern.encode())
#: A multiprocess server's tag at the head of a line, in key form: vLLM's "(EngineCore_DP0 pid=230) ", Ray's
#: "(RayWorkerWrapper pid=77, ip=10.0.0.1) ".
_PROCESS_TAG = re.compile(rb"^\([\w.:-]+ pid=0+(?:, ip=[\d.:]+)?\) ", re.MULTILINE)


def _blank_tags(keyed: bytes) -> bytes:
    """``keyed`` with the process tags at its lines' heads turned into spaces.

    A server has a handful of processes: the tags are read from the block's first 64 KiB and each is replaced in one C
    pass rather than line by line. A tag first seen later in the block is left (it costs speed, never a verdict).
    """
    for tag in set(_PROCESS_TAG.findall(keyed, 0, 1 << 16)):
        blank = b" " * len(tag)
        keyed = keyed.replace(b"\n" + tag, b"\n" + blank)
        if keyed.startswith(tag):
            keyed = blank + keyed[len(tag) :]
    return keyed


_BLOCK = 1 << 20
#: A line longer than this keeps its head and tail only (a progress bar redrawn with "\r" for an hour is one line).
MAX_LINE = 8000
HEAD_LINES = 20000
TAIL_LINES = 5000
_CACHE_LIMIT = 50_000
_SERVING_TAIL = 16
_FRAME = re.compile(r'^\s*File "[^"]+", line \d+')
_LEVEL = re.compile(r"(?:^|[\s\]|(])\[?(DEBUG|INFO|WARNING|WARN|ERROR|CRITICAL|FATAL)\]?(?=[\s:|\]]|$)")
_LEVEL_KV = re.compile(r"\blevel=(\w+)")
_LEVEL_GLOG = re.compile(r"(?:^|\]:?)\[([WIEF]) |(?:^|\]:?)([WIEF])\d{4} ")
_QUIET_LEVELS = {"DEBUG", "INFO", "WARNING", "WARN", "W", "I"}
#: Bytes that never occur in a text log (NUL and the C0 controls other than tab, newline, CR, ESC, BS, FF).
_BINARY_BYTES = bytes(b for b in range(32) if b not in (8, 9, 10, 12, 13, 27))


@dataclass(frozen=True)
class Line:
    """One kept log line: its 1-based number, the text (colour codes removed), the message with prefixes peeled."""

    number: int
    text: str
    message: str
    quiet: bool
    #: The last traceback frame line printed shortly above this one, if any.
    frame: Line | None = None


def level_is_quiet(message: str) -> bool:
    """True when the line's logging level is below ERROR.

    A harness that re-logs the server's output nests levels ("- INFO - ERROR 08-13 ... engine.py:400] CUDA error"):
    the line is quiet only when every level word in its head is.
    """
    head = message[:100]
    levels = [next(g for g in m.groups() if g) for rx in (_LEVEL, _LEVEL_KV, _LEVEL_GLOG) for m in rx.finditer(head)]
    return bool(levels) and all(level.upper() in _QUIET_LEVELS for level in levels)


def make_line(number: int, raw: str, frame: Line | None = None) -> Line:
    """A ``Line`` from a raw log line (long lines cut to head and tail)."""
    if len(raw) > MAX_LINE:
        raw = raw[: MAX_LINE // 2] + raw[-MAX_LINE // 2 :]
    text = ANSI.sub("", raw).rstrip("\r")
    return Line(number, text, strip_prefix(text), level_is_quiet(text), frame)


@dataclass
class Categories:
    """The category bits of a scan: which lines are kept, which are only looked for once, which are tracked."""

    keep: int
    ready: int
    ready_alt: int
    shape: int
    frame: int
    ready_rx: tuple[re.Pattern[str], ...]
    ready_alt_rx: tuple[re.Pattern[str], ...]
    shape_rx: tuple[re.Pattern[str], ...]
    index: NeedleIndex
    #: Each kept pattern has a bit of its own (``keep`` is their union): bit -> the pattern, to confirm a needle hit.
    keep_rx: dict[int, re.Pattern[str]] = field(default_factory=dict)
    #: The bits of kept patterns whose verdict can differ between lines of one key (they name digits).
    digit_sensitive: int = 0


@dataclass
class Scan:
    """What one pass over a log keeps: bounded, whatever the log's size."""

    lines: list[Line] = field(default_factory=list)
    #: Interesting lines after the first ``HEAD_LINES`` that were not kept (the last ``TAIL_LINES`` are).
    dropped: int = 0
    total_lines: int = 0
    #: Whether any line holds more than white space.
    has_text: bool = False
    ready: Line | None = None
    ready_alt: Line | None = None
    shaped: bool = False
    #: The last lines that looked like serving (ready markers after the first), for "it kept serving after that".
    serving: list[Line] = field(default_factory=list)
    chars: int = 0
    replaced: int = 0
    binary_bytes: int = 0
    bytes_read: int = 0
    encoding: str = "utf-8"


class Scanner:
    """Feed a log in blocks that end at line boundaries (``feed``), then ``finish`` for the ``Scan``."""

    def __init__(self, cats: Categories) -> None:
        self.cats = cats
        self.scan = Scan()
        self._cache: dict[bytes, int] = {}
        self._kept: dict[bytes, bool] = {}
        self._ready_needles: list[bytes] | None = None
        self._head: list[Line] = []
        self._tail: deque[tuple[int, str, Line | None]] = deque(maxlen=TAIL_LINES)
        self._serving: deque[tuple[int, str]] = deque(maxlen=_SERVING_TAIL)
        self._frame: tuple[int, str] | None = None
        self._active = cats.keep | cats.ready | cats.ready_alt | cats.shape | cats.frame
        self._line = 0

    def _frame_line(self, number: int) -> Line | None:
        if self._frame is None or number - self._frame[0] > 30:
            return None
        n, raw = self._frame
        made = make_line(n, raw)
        return made if _FRAME.match(made.message) else None

    def feed(self, data: bytes) -> None:
        """Scan ``data`` (UTF-8): whole lines (a last line without a newline is taken as whole).

        The anchor regex runs over the whole block in key form; Python looks only at lines where it hits.
        """
        if not data:
            return
        if b"\x1b" in data or b"^[" in data:
            data = _ANSI_BYTES.sub(b"", data)
        keyed = data.translate(KEY_BYTES)
        if b" pid=" in keyed:
            # A process tag on every line ("(EngineCore_DP0 pid=230) ") is the same on the millionth line as on the
            # first: blanked in the key (same length, so offsets hold), it cannot make every line a needle hit.
            keyed = _blank_tags(keyed)
        cache, index = self._cache, self.cats.index
        base = self._line
        active = self._active
        rx = index.regex(active | self.cats.frame)
        counted_pos, counted = 0, 0
        m = rx.search(keyed)
        while m is not None:
            p = m.start()
            start = keyed.rfind(b"\n", 0, p) + 1
            end = keyed.find(b"\n", p)
            if end < 0:
                end = len(keyed)
            counted += keyed.count(b"\n", counted_pos, start)
            counted_pos = start
            line_key = keyed[start:end]
            mask = cache.get(line_key)
            if mask is None:
                if len(cache) >= _CACHE_LIMIT:
                    cache.clear()
                mask = cache[line_key] = index.mask(line_key)
            if mask & (active | self.cats.frame):
                self._hit(base + counted + 1, data[start:end].decode("utf-8", "replace"), mask, line_key)
                if self._active != active:
                    active = self._active
                    rx = index.regex(active | self.cats.frame)
            m = rx.search(keyed, end + 1)
        if self.scan.ready is not None:
            self._last_serving(data, keyed, base)
        lines = keyed.count(b"\n") + (0 if keyed.endswith(b"\n") else 1)
        self._line = base + lines
        self.scan.total_lines = self._line
        if not self.scan.has_text:
            self.scan.has_text = not data.isspace()

    def _last_serving(self, data: bytes, keyed: bytes, base: int) -> None:
        """The last line of the block that looks like serving (ready markers are no longer searched line by line)."""
        if self._ready_needles is None:
            self._ready_needles = self.cats.index.needles_of(self.cats.ready)
        at = max((keyed.rfind(n) for n in self._ready_needles), default=-1)
        if at < 0:
            return
        start = keyed.rfind(b"\n", 0, at) + 1
        end = keyed.find(b"\n", at)
        end = len(keyed) if end < 0 else end
        self._serving.append((base + keyed.count(b"\n", 0, start) + 1, data[start:end].decode("utf-8", "replace")))

    def _confirmed(self, line_key: bytes, raw: str, bits: int) -> bool:
        """Whether one of the kept patterns whose needles hit really matches the line (cached per key when safe)."""
        cached = self._kept.get(line_key)
        if cached is not None:
            return cached
        made = make_line(0, raw)
        found = False
        rest = bits
        while rest:
            low = rest & -rest
            rx = self.cats.keep_rx.get(low)
            if rx is None or rx.search(made.message) or rx.search(made.text):
                found = True
                break
            rest ^= low
        if not bits & self.cats.digit_sensitive:
            if len(self._kept) >= _CACHE_LIMIT:
                self._kept.clear()
            self._kept[line_key] = found
        return found

    def _hit(self, number: int, raw: str, mask: int, line_key: bytes = b"") -> None:
        cats, scan = self.cats, self.scan
        if mask & cats.frame:
            self._frame = (number, raw)
        if mask & cats.shape and not scan.shaped:
            made = make_line(number, raw)
            if any(p.search(made.message) or p.search(made.text) for p in cats.shape_rx):
                scan.shaped = True
                self._active &= ~cats.shape
        if mask & cats.ready and scan.ready is None:
            made = make_line(number, raw)
            # The whole line too: a table row ("| model | 1 | READY |") loses its cells to prefix peeling.
            if any(p.search(made.message) or p.search(made.text) for p in cats.ready_rx):
                scan.ready = made
                self._active &= ~cats.ready
        if mask & cats.ready_alt and scan.ready_alt is None:
            made = make_line(number, raw)
            if any(p.search(made.message) or p.search(made.text) for p in cats.ready_alt_rx):
                scan.ready_alt = made
                self._active &= ~cats.ready_alt
        if mask & cats.keep and self._confirmed(line_key, raw, mask & cats.keep):
            if len(self._head) < HEAD_LINES:
                self._head.append(make_line(number, raw, self._frame_line(number)))
            else:
                if len(self._tail) == self._tail.maxlen:
                    scan.dropped += 1
                self._tail.append((number, raw, self._frame_line(number)))

    def finish(self) -> Scan:
        """The scan: kept lines in log order."""
        scan = self.scan
        scan.lines = self._head + [make_line(n, raw, frame) for n, raw, frame in self._tail]
        scan.serving = [make_line(n, raw) for n, raw in self._serving]
        return scan


def blocks_of(text: str, size: int = _BLOCK) -> Iterator[bytes]:
    """``text`` as UTF-8, in blocks of about ``size`` characters that end at a newline."""
    pos = 0
    while pos < len(text):
        end = text.find("\n", pos + size)
        end = len(text) if end < 0 else end + 1
        yield text[pos:end].encode("utf-8", "replace")
        pos = end


def _is_utf16(head: bytes) -> str | None:
    """The UTF-16 codec of a log that starts with a UTF-16 byte-order mark and has NULs where ASCII would be."""
    if head[:2] in (codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE) and head[2:200].count(0) >= len(head[2:200]) // 4:
        return "utf-16"
    return None


def read_blocks(path: Path, scan: Scan, size: int = _BLOCK) -> Iterable[bytes]:
    """The file at ``path`` as UTF-8 bytes, block by block at line boundaries; what its head says goes into ``scan``.

    Whether the log is text is judged on its first block (binary bytes, undecodable characters); UTF-16 with a
    byte-order mark is re-encoded. The rest is passed through as bytes: only the lines that hit are decoded.
    """
    with Path(path).open("rb") as f:
        head = f.read(size)
        utf16 = _is_utf16(head)
        decoder = codecs.getincrementaldecoder(utf16)(errors="replace") if utf16 else None
        if utf16:
            scan.encoding = utf16
        text = head.decode("utf-8", "replace") if decoder is None else decoder.decode(head)
        scan.chars, scan.replaced = len(text), text.count("\ufffd")
        scan.bytes_read = len(head)
        scan.binary_bytes = 0 if utf16 else binary_count(head)
        carry = b""
        data = head
        while data:
            if decoder is not None:
                data = decoder.decode(data).encode("utf-8")
            block = carry + data
            cut = block.rfind(b"\n") + 1
            if cut:
                yield block[:cut]
                carry = block[cut:]
            else:
                carry = block
            if len(carry) > 4 * MAX_LINE:
                # A line with no end in sight: what matters is its head and its latest tail.
                carry = carry[: MAX_LINE // 2] + carry[-MAX_LINE // 2 :]
            data = f.read(size)
        if decoder is not None:
            carry += decoder.decode(b"", final=True).encode("utf-8")
        if carry:
            yield carry


def binary_count(data: bytes) -> int:
    """How many bytes of ``data`` never occur in a text log."""
    # One C pass: translate deletes those bytes, and the length difference counts them.
    return len(data) - len(data.translate(None, _BINARY_BYTES))
