# Over 500 lines: the needles taken from each rule's regex and the one pass that uses them are one mechanism.
"""Log scanning: one streaming pass over a server log that keeps only the lines some diagnosis rule could be about.

A log of hundreds of megabytes is mostly lines no rule cares about (progress bars, served requests, batch stats).
Matching every rule's regular expression against every line costs tens of microseconds a line; instead each regular
expression is reduced to its *needles* (literal strings, one of which every line it matches must contain), and a line
is looked at closely only when its *key* (the line lower-cased, every digit turned into ``0``) contains a needle.
Keys repeat (a batch-stats line differs from the next only in its numbers), so the needle test runs once per distinct
key, and the pass costs a dictionary lookup per line.

What comes out (``Scan``) is bounded whatever the size of the log: the first and last interesting lines, the first
line of each "once" category (readiness, SGLang shape), and the counts the verdict needs.
"""

from __future__ import annotations

import codecs
import importlib
import re
from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from campaign.fingerprint import ANSI, strip_prefix

#: Digits become "0" and ASCII capitals lower case: the needle test is case-blind and ignores numbers.
_KEY_TABLE = str.maketrans({**{chr(c): chr(c + 32) for c in range(65, 91)}, **{str(d): "0" for d in range(1, 10)}})
_KEY_BYTES = bytes(c + 32 if 65 <= c <= 90 else (48 if 49 <= c <= 57 else c) for c in range(256))
_ANSI_BYTES = re.compile(ANSI.pattern.encode())
_MIN_NEEDLE = 3
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


def key(text: str) -> str:
    """The needle-test form of a line or block: ASCII lower-cased, every digit ``0``."""
    return text.translate(_KEY_TABLE)


def _parser() -> Any:
    # The stdlib's own regex parser; private, so reached by name (typed Any) and only to read literals out of a
    # pattern. A pattern it cannot reduce simply has no needle and counts as "always interesting".
    return importlib.import_module("re._parser")


def needles(pattern: str) -> frozenset[str] | None:
    """Literal strings (in key form) one of which every line ``pattern`` matches contains; None if there are none.

    Conservative: the set returned is implied by the pattern under case-insensitive matching, so a line without any
    of them cannot match. Literals shorter than three characters are not selective enough and do not count.
    """
    found = requirements(pattern)
    return _best(found) if found else None


def requirements(pattern: str) -> list[frozenset[str]]:
    """Every literal requirement of ``pattern``: each set holds strings one of which a matching line contains."""
    try:
        parsed = _parser().parse(pattern, re.IGNORECASE)
    except re.error:
        return []
    return _candidates(list(parsed))


#: Lines a server prints by the million while it serves (batch stats, access logs, throughput): a needle found in
#: them would make every such line a hit, so a pattern's other requirements are preferred as its needle.
_ROUTINE = key(
    "[2026-12-01 10:00:00 TP0] Decode batch. #running-req: 1, #token: 1, token usage: 0.01, cuda graph: True, "
    "gen throughput (token/s): 1.0, #queue-req: 0\n"
    "[2026-12-01 10:00:00 TP0] Prefill batch. #new-seq: 1, #new-token: 1, #cached-token: 0, token usage: 0.00\n"
    'INFO:     127.0.0.1:1 - "POST /v1/chat/completions HTTP/1.1" 200 OK\n'
    "INFO 12-01 10:00:00 [loggers.py:1] Engine 000: Avg prompt throughput: 1.0 tokens/s, Avg generation "
    "throughput: 1.0 tokens/s, Running: 1 reqs, Waiting: 0 reqs, GPU KV cache usage: 0.1%, "
    "Prefix cache hit rate: 0.0%\n"
    "INFO 12-01 10:00:00 [logger.py:1] Received request chatcmpl-0: prompt: 'x', params: SamplingParams(n=1), "
    "prompt_token_ids: None, lora_request: None.\n"
    "SamplingParams(n=1, presence_penalty=0.0, frequency_penalty=0.0, repetition_penalty=1.0, temperature=0.7, "
    "top_p=1.0, top_k=0, min_p=0.0, seed=None, stop=[], max_tokens=16, skip_special_tokens=True)\n"
)
_ROUTINE_BYTES = _ROUTINE.encode()


def _best(candidates: Sequence[frozenset[str]]) -> frozenset[str]:
    # The most selective requirement: one not found in routine serving lines, then the one whose least selective
    # needle is rarest (long, with rare characters).
    return max(
        candidates,
        key=lambda s: (not any(n in _ROUTINE for n in s), min(_rarity(n) for n in s), -len(s)),
    )


def _rarity(needle: str) -> int:
    rank = len(_COMMON)
    return sum(_RANK.get(ord(c), rank) if ord(c) < 128 else rank for c in needle)


def _seq(items: Sequence[Any]) -> frozenset[str] | None:
    found = _candidates(items)
    return _best(found) if found else None


def _candidates(items: Sequence[Any]) -> list[frozenset[str]]:
    consts = importlib.import_module("re._constants")
    candidates: list[frozenset[str]] = []
    run: list[str] = []

    def close() -> None:
        if len(run) >= _MIN_NEEDLE:
            candidates.append(frozenset({key("".join(run))}))
        run.clear()

    for op, av in items:
        if op is consts.LITERAL:
            run.append(chr(av))
        elif op is consts.AT:
            continue  # anchors and \b consume nothing: the literals either side are still adjacent
        elif _is_digit(consts, op, av):
            run.append("0")  # one digit: "0" in a key, whatever it was
        elif op in (consts.MAX_REPEAT, consts.MIN_REPEAT) and av[0] >= 1 and _is_digit(consts, *av[2][0]):
            # A run of digits is "0", then some more zeros: the literal before it ends with one "0", the literal
            # after it starts with one.
            run.append("0")
            close()
            run.append("0")
        else:
            close()
            sub: frozenset[str] | None = None
            if op is consts.SUBPATTERN:
                sub = _seq(list(av[-1]))
            elif op is consts.BRANCH:
                alts = [_seq(list(alt)) for alt in av[1]]
                if all(a is not None for a in alts):
                    sub = frozenset().union(*(a for a in alts if a is not None))
            elif op in (consts.MAX_REPEAT, consts.MIN_REPEAT, consts.POSSESSIVE_REPEAT) and av[0] >= 1:
                sub = _seq(list(av[2]))
            elif op is consts.ATOMIC_GROUP:
                sub = _seq(list(av))
            if sub is not None:
                candidates.append(sub)
    close()
    return candidates


def _is_digit(consts: Any, op: Any, av: Any) -> bool:
    """Whether one regex item matches exactly one digit (``\\d``, ``[0-9]``, a digit literal)."""
    if op is consts.LITERAL:
        return bool(48 <= av <= 57)
    if op is not consts.IN or len(av) != 1:
        return False
    kind, arg = av[0]
    return bool(
        (kind is consts.CATEGORY and arg is consts.CATEGORY_DIGIT) or (kind is consts.RANGE and tuple(arg) == (48, 57))
    )


#: Characters of log text, most common first (in key form). A needle is searched for from its rarest character,
#: so the regex engine's first-character scan skips most positions of a line.
_COMMON = b" 0eraoitnslcpdumg:/_.h-f,ybk^v=][()w\"x'qz{}`|*#<$\\+;j>!%@?~&"
_RANK = {c: i for i, c in enumerate(_COMMON)}


class NeedleIndex:
    """Needles of many patterns, each tagged with category bits; ``mask(key)`` says which categories a key may hit.

    Each needle is searched for from its rarest character on (its *anchor*, the rest of the needle from there), so
    the regex engine's first-character scan skips most positions; a hit is confirmed with the needle's head and the
    pattern's other literal requirements (all must be present).
    """

    def __init__(self) -> None:
        #: needle -> [(bit, the pattern's other requirements)]
        self._needles: dict[bytes, list[tuple[int, tuple[tuple[bytes, ...], ...]]]] = {}
        #: Categories with a pattern that has no needle: every line may hit them.
        self.always = 0
        self._regexes: dict[int, re.Pattern[bytes]] = {}
        self._anchors: dict[bytes, list[tuple[bytes, int, int, tuple[tuple[bytes, ...], ...]]]] = {}
        self._all_suffixes: dict[bytes, list[tuple[bytes, int, int, tuple[tuple[bytes, ...], ...]]]] = {}

    def add(self, pattern: str, bit: int) -> None:
        """Register ``pattern`` under category ``bit``."""
        found = requirements(pattern)
        if not found:
            self.always |= bit
            return
        best = _best(found)
        others = tuple(tuple(n.encode("utf-8") for n in sorted(group)) for group in found if group is not best)
        for n in best:
            self._needles.setdefault(n.encode("utf-8"), []).append((bit, others))
        self._regexes.clear()
        self._anchors.clear()

    def regex(self, active: int = -1) -> re.Pattern[bytes]:
        """The anchor regex for the needles of the categories in ``active`` (compiled once per mask)."""
        if active in self._regexes:
            return self._regexes[active]
        needles = {n: uses for n, uses in self._needles.items() if any(bit & active for bit, _ in uses)}
        starts = _anchor_chars(list(needles))
        suffixes: dict[bytes, list[tuple[bytes, int, int, tuple[tuple[bytes, ...], ...]]]] = {}
        for needle, uses in needles.items():
            off = next(i for i in _offsets(needle) if needle[i] in starts)
            for bit, others in uses:
                suffixes.setdefault(needle[off:], []).append((needle, off, bit, others))
        # The regex reports the shortest suffix that matches at a position; longer ones that start with it are
        # checked with it.
        for suffix in suffixes:
            self._anchors.setdefault(suffix, [])
        self._all_suffixes.update(suffixes)
        rx = re.compile(_trie(sorted(suffixes)).encode("latin-1") if suffixes else rb"(?!x)x", re.DOTALL)
        self._regexes[active] = rx
        return rx

    def _entries(self, suffix: bytes) -> list[tuple[bytes, int, int, tuple[tuple[bytes, ...], ...]]]:
        found = self._anchors.get(suffix)
        if not found:
            found = [e for other, es in self._all_suffixes.items() if other.startswith(suffix) for e in es]
            self._anchors[suffix] = found
        return found

    def mask(self, text_key: bytes) -> int:
        """The categories whose needles occur in ``text_key`` (a line in key form, as bytes)."""
        mask = self.always
        if not self._needles:
            return mask
        rx = self.regex()
        # Whether a pattern's other requirements occur does not depend on where its needle hit: judged once per key
        # (a megabyte progress-bar line hits one needle ten thousand times).
        present: dict[tuple[tuple[bytes, ...], ...], bool] = {}
        # Anchors may overlap: after a hit, search again from the next position.
        m = rx.search(text_key)
        while m is not None:
            p = m.start()
            for needle, off, bit, others in self._entries(m.group()):
                if mask & bit or p < off or not text_key.startswith(needle, p - off):
                    continue
                if others not in present:
                    present[others] = all(any(o in text_key for o in group) for group in others)
                if present[others]:
                    mask |= bit
            m = rx.search(text_key, p + 1)
        return mask

    def needles_of(self, bit: int) -> list[bytes]:
        """The needles registered under ``bit``."""
        return [n for n, uses in self._needles.items() if any(b & bit for b, _ in uses)]


def _offsets(word: bytes) -> list[int]:
    """Where an anchor for ``word`` may start: three or more characters from its end, and not at a tail that routine
    serving lines contain ("ure" of "capture" is in every "temperature="), unless no other start is left."""
    starts = list(range(max(0, len(word) - _MIN_NEEDLE) + 1))
    quiet = [i for i in starts if word[i:] not in _ROUTINE_BYTES]
    return quiet or starts


def _anchor_chars(words: Sequence[bytes]) -> set[int]:
    """A small set of rare characters such that every word has one at a position three or more from its end.

    Greedy: the words with the fewest choices first, each adding its rarest character when none it has is chosen;
    then the characters that turned out not to be needed are dropped again, the most common first.
    """
    rank = len(_COMMON)

    def rarity(c: int) -> tuple[int, int]:
        return (_RANK.get(c, rank), c)

    choices = {w: {w[i] for i in _offsets(w)} for w in words}
    chosen: set[int] = set()
    for w in sorted(words, key=lambda w: (len(choices[w]), w)):
        if not choices[w] & chosen:
            chosen.add(max(choices[w], key=rarity))
    for c in sorted(chosen, key=rarity):
        if all(choices[w] & (chosen - {c}) for w in words):
            chosen.discard(c)
    return chosen


def _trie(words: Sequence[bytes]) -> str:
    """One regex matching any of ``words``, factored by common prefixes (it reports the shortest word that matches).

    The stdlib engine tries each branch's first character, and skips positions whose character starts none.
    """
    root: dict[int, Any] = {}
    for w in words:
        node = root
        for ch in w:
            node = node.setdefault(ch, {})
        node[-1] = {}

    def emit(node: dict[int, Any]) -> str:
        if -1 in node:
            return ""
        alts = [re.escape(chr(ch)) + emit(sub) for ch, sub in sorted(node.items())]
        return alts[0] if len(alts) == 1 else "(?:" + "|".join(alts) + ")"

    return emit(root)


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


def digit_sensitive(pattern: str) -> bool:
    """Whether two lines that differ only in their digits can differ in matching ``pattern`` (it names a digit)."""
    return bool(re.search(r"\d", re.sub(r"\{\d+(,\d*)?\}|\\\d", "", pattern)))


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
        keyed = data.translate(_KEY_BYTES)
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
