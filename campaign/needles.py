"""Needles: the literal strings a regular expression's every match must contain, and the index that finds them.

A log of hundreds of megabytes is mostly lines no rule cares about. Matching every rule's regular expression against
every line costs tens of microseconds a line; instead each regular expression is reduced to its *needles* (literal
strings, one of which every line it matches must contain), and a line is looked at closely only when its *key* (the
line lower-cased, every digit turned into ``0``) contains a needle. ``campaign.logscan`` runs the one pass that uses
them.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Sequence
from typing import Any

#: Digits become "0" and ASCII capitals lower case: the needle test is case-blind and ignores numbers.
_KEY_TABLE = str.maketrans({**{chr(c): chr(c + 32) for c in range(65, 91)}, **{str(d): "0" for d in range(1, 10)}})
KEY_BYTES = bytes(c + 32 if 65 <= c <= 90 else (48 if 49 <= c <= 57 else c) for c in range(256))
_MIN_NEEDLE = 3


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


def digit_sensitive(pattern: str) -> bool:
    """Whether two lines that differ only in their digits can differ in matching ``pattern`` (it names a digit)."""
    return bool(re.search(r"\d", re.sub(r"\{\d+(,\d*)?\}|\\\d", "", pattern)))
