"""Fingerprints: a short hash of a failure's evidence that is the same every time the same failure happens.

Two runs of one failure differ in everything incidental: timestamps, PIDs, TP ranks, memory sizes, ports, pointer
values, temporary directories, the venv a package lives in. ``normalise`` removes those from one log line;
``fingerprint`` hashes the failure kind with the normalised evidence lines, so ``campaign runs --failures`` can group
attempts that failed the same way, and two different causes never share a hash.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable

#: Colour escapes, both as raw bytes and as the caret notation some log viewers paste (``^[[0;36m``).
ANSI = re.compile(r"(?:\x1b|\^\[)\[[0-9;?]*[A-Za-z]")

# Prefixes that logging frameworks put before the message. They carry only time, process and rank.
_PREFIX_PATTERNS = [
    r"\s*\|\s+",  # docker compose "  | "
    r"[\w.-]+\s+\|\s",  # "ollama  | "
    r"\s*\([^()]{0,80}\bpid=\d+[^()]{0,80}\)\s*",  # vLLM "(VllmWorker rank=1 pid=115) "
    r"\s*\[rank\d+\]:\s*",  # torch "[rank0]:"
    r"\s*\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d[.,\d]*Z?\s*",  # ISO timestamps
    r"\s*\[(?!Errno)[^\[\]]{0,80}\d[^\[\]]{0,80}\]\s+",  # "[2025-10-06 20:05:22 DP0 TP0] ", "[gpu_id=0] "
    # vLLM "ERROR 05-08 19:06:38 [multiproc_executor.py:962] "
    r"\s*(?:DEBUG|INFO|WARNING|WARN|ERROR|CRITICAL)\s+\d\d-\d\d [\d:.]+\s+\[?[\w.]+:\d+\]\s*",
]
# One anchored alternation: a log has millions of lines, and most have one prefix or none.
_PREFIX = re.compile("^(?:" + "|".join(f"(?:{p})" for p in _PREFIX_PATTERNS) + ")")

_SUBSTITUTIONS = [
    (re.compile(r"0x[0-9a-fA-F]+"), "<addr>"),  # pointers and addresses
    (re.compile(r"\b[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}\b"), "<uuid>"),
    (re.compile(r"\b(?=[0-9a-f]*\d)(?=[0-9a-f]*[a-f])[0-9a-f]{10,}\b"), "<hash>"),  # content hashes
    # A path keeps only its last component: the same file lives under different venvs, tmp dirs and homes.
    (re.compile(r"(?:[A-Za-z]:)?(?:[\w.@+~-]*/)+([\w.@+-]+)"), r"\1"),
    (re.compile(r"\d+(?:[.,]\d+)*"), "N"),  # sizes, ports, pids, ranks, line numbers, times
    (re.compile(r"\s+"), " "),
]


def strip_prefix(line: str) -> str:
    """The message part of one log line: colour codes and logging prefixes (time, pid, rank, level) removed."""
    text = ANSI.sub("", line).rstrip("\r\n")
    # Prefixes nest ("(Worker pid=1) ERROR 05-08 19:06:38 [x.py:9] [rank0]: ..."): peel until nothing changes.
    for _ in range(8):
        m = _PREFIX.match(text)
        if m is None or m.end() == 0:
            break
        text = text[m.end() :]
    return text.strip()


def normalise(line: str) -> str:
    """One log line with everything that varies between runs of the same failure replaced by placeholders."""
    text = strip_prefix(line)
    for pattern, replacement in _SUBSTITUTIONS:
        text = pattern.sub(replacement, text)
    return text.strip().lower()


def fingerprint(kind: str, lines: Iterable[str]) -> str:
    """A 16-hex-digit hash of ``kind`` and the normalised ``lines`` (repeats, e.g. one per TP rank, count once)."""
    seen: list[str] = []
    for line in lines:
        norm = normalise(line)
        if norm and norm not in seen:
            seen.append(norm)
    blob = "\n".join([kind, *seen])
    return hashlib.sha256(blob.encode()).hexdigest()[:16]
