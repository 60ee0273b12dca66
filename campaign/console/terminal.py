"""A clean terminal: text from outside (server logs, model replies, lock records another user wrote) shows, never acts.

A terminal acts on control characters: ``ESC [ 2 J`` clears the screen, ``ESC ] 0 ;`` sets the window title,
``ESC ] 52 ;`` writes the clipboard, ``ESC ] 8 ;`` makes a link; a bidirectional override reorders what follows. Every
C0 control but tab and newline, DEL, every C1 control and the bidirectional controls are replaced with a visible
escape (``\\x1b``, ``\\u202e``) before they reach the terminal. ``SafeConsole`` does this for every string rich
renders (our own markup holds no control characters, so only text from outside changes); ``neutralise`` is the rule
for the streams written around rich (a log shown with ``campaign logs``).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

from rich.console import Console
from rich.segment import Segment
from rich.text import Text

_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")
#: C0 and DEL, and C1 as UTF-8 encodes it (a terminal in UTF-8 mode acts on U+009B as on ESC [).
_CONTROL_BYTES = re.compile(b"[\x00-\x08\x0b-\x1f\x7f]|\xc2[\x80-\x9f]")


def _visible(m: re.Match[str]) -> str:
    c = ord(m.group())
    return f"\\x{c:02x}" if c < 0x100 else f"\\u{c:04x}"


def neutralise(text: str) -> str:
    """``text`` with every control character (but tab and newline) replaced by a visible escape."""
    return _CONTROL.sub(_visible, text)


def json_safe(text: str) -> str:
    """A JSON document with the control characters json.dumps leaves raw written as ``\\uXXXX`` escapes instead."""
    return _CONTROL.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


def neutralise_bytes(data: bytes) -> bytes:
    """``data`` (a log, any encoding) with C0, DEL and UTF-8 C1 controls (but tab and newline) made visible."""
    return _CONTROL_BYTES.sub(lambda m: "".join(f"\\x{b:02x}" for b in m.group()[-1:]).encode(), data)


class SafeConsole(Console):
    """A rich console that never writes a control character it did not make itself (its own styles and cursor moves
    are control segments; every text segment is neutralised)."""

    def render_str(self, text: str, *args: Any, **kwargs: Any) -> Text:
        """Render ``text`` (markup and all) after its control characters are made visible (before layout, so widths
        are measured on what shows)."""
        return super().render_str(neutralise(text), *args, **kwargs)

    def _render_buffer(self, buffer: Iterable[Segment]) -> str:
        # The last step before the terminal: also catches Text objects built from outside text (evidence, replies).
        clean = (seg if seg.control else Segment(neutralise(seg.text), seg.style, seg.control) for seg in buffer)
        return super()._render_buffer(clean)
