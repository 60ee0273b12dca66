"""Server-sent events of a streamed chat completion, parsed into what one request did.

Pure: bytes in, a ``RequestRecord`` out; no I/O and no clock of its own (the caller passes the time each piece of
the body arrived). The parser runs once per received piece, in the bench's hot loop, so it works on bytes and
keeps its state in a few slots.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any


@dataclass
class RequestRecord:
    """What one request did, with times in seconds from its send."""

    ok: bool = False
    error: str | None = None
    message: str = ""
    ttft: float | None = None
    itls: list[float] = field(default_factory=list)
    e2e: float | None = None
    output_tokens: int = 0
    prompt_tokens: int = 0
    #: When it was sent (``time.perf_counter()``), for a per-request export.
    start: float = 0.0

    @property
    def failed(self) -> bool:
        """Unsuccessful and not merely incomplete (the stream never began, or it carried an error)."""
        return not self.ok and not (self.error or "").startswith("incomplete:")


class ChatStream:
    """The SSE body of one ``/v1/chat/completions`` (or ``/v1/completions``) stream, fed into ``record``.

    Lines end with ``\\n`` (optionally ``\\r\\n``); an event ends at a blank line; only ``data:`` fields matter. A
    content delta is a token (the first one dates TTFT, later ones the ITL gaps); ``usage`` overrides the token
    counts; ``[DONE]`` dates the end; an ``error`` event or a non-JSON event ends the stream as failed.

    Tokens that arrive together (one piece of the body: a server behind its engine writes what it has queued at
    once) share the gap since the previous arrival evenly, as SGLang's bench_serving counts a chunk of several
    tokens, instead of one real gap and zeros; those that arrive with the first token date no gap at all. An event
    is one token unless the server sends usage in every chunk (``continuous_usage_stats``, which the bench asks
    for): then it is as many as ``completion_tokens`` grew, so tokens that make no text (eos under ``ignore_eos``,
    which servers do not stream) and chunks of several tokens (a stream interval) still get their share of the
    time. Without it such tokens count in TPOT (from the final usage) but not in ITL, whose gaps then look longer.
    """

    __slots__ = ("_buf", "_data", "_last", "_made", "_new", "finish", "record", "sent")

    def __init__(self, record: RequestRecord, sent: float) -> None:
        self.record = record
        self.sent = sent
        #: The ``finish_reason`` seen, if any: a stream without one is incomplete.
        self.finish: str | None = None
        self._buf = b""
        self._data: list[bytes] = []
        self._last = sent
        #: Tokens of the piece being read that follow an earlier arrival (their gaps are set when it is read).
        self._new = 0
        #: Completion tokens the server has counted so far, when it sends usage in every chunk.
        self._made = 0

    def feed(self, chunk: bytes, now: float) -> bool:
        """Take one piece of the body, received at ``now``; True when the stream is over (``[DONE]`` or an error).

        After True, ``record.error`` is set when the stream failed, and ``record.e2e`` when it ended with
        ``[DONE]``.
        """
        rec = self.record
        buf = self._buf + chunk if self._buf else chunk
        data = self._data
        start = 0
        while (nl := buf.find(b"\n", start)) >= 0:
            line = buf[start:nl]
            start = nl + 1
            if line.endswith(b"\r"):
                line = line[:-1]
            if line.startswith(b"data:"):
                data.append(line[5:].lstrip())
                continue
            if line or not data:
                continue  # a comment (`: ping`), an unused field, or a blank line between events
            event = data[0] if len(data) == 1 else b"\n".join(data)
            data.clear()
            if event == b"[DONE]":
                self._spread(now)
                rec.e2e = now - self.sent
                return True
            try:
                obj = json.loads(event)
            except ValueError:
                rec.error, rec.message = "invalid_json", event[:200].decode("utf-8", "replace")
                return True
            if not isinstance(obj, dict):
                continue
            err = obj.get("error")
            if err is not None:
                rec.error = f"stream_error:{error_type(err)}"
                rec.message = error_message(err) or "error event in the stream"
                return True
            choices = obj.get("choices")
            usage = obj.get("usage")
            if choices:
                ch = choices[0]
                delta = ch.get("delta") or {}
                # A chat chunk carries delta.content; a /v1/completions chunk carries text.
                text = delta.get("content") or ch.get("text")
                if usage and "completion_tokens" in usage:
                    # Usage in every chunk (continuous_usage_stats): the event stands for every token made since
                    # the last one, those that make no text (eos under ignore_eos) or share a chunk included.
                    made = int(usage["completion_tokens"])
                    tokens, self._made = made - self._made, made
                else:
                    tokens = 1 if text else 0
                if rec.ttft is None:
                    if text:
                        rec.ttft = now - self.sent
                        self._last = now
                elif tokens > 0 and self._last != now:
                    self._new += tokens
                rec.output_tokens += tokens
                if ch.get("finish_reason"):
                    self.finish = ch["finish_reason"]
            if usage:
                rec.output_tokens = int(usage.get("completion_tokens") or rec.output_tokens)
                rec.prompt_tokens = int(usage.get("prompt_tokens") or 0)
        self._buf = buf[start:]
        self._spread(now)
        return False

    def _spread(self, now: float) -> None:
        """Give this piece's tokens their share of the gap since the previous arrival."""
        if self._new:
            gap = (now - self._last) / self._new
            self.record.itls.extend([gap] * self._new)
            self._new = 0
            self._last = now


def error_type(err: Any) -> str:
    """The ``type`` (or ``code``) of an OpenAI-style error object, or ``error``."""
    if isinstance(err, dict):
        for key in ("type", "code"):
            if err.get(key) not in (None, ""):
                return str(err[key])
    return "error"


def error_message(err: Any) -> str:
    """The message of an error body or event (JSON text or an object), at most 300 characters."""
    if isinstance(err, str):
        text = err
        try:
            err = json.loads(text)
        except ValueError:
            return text.strip()[:300]
    if isinstance(err, dict):
        inner = err.get("error", err)
        if isinstance(inner, dict):
            return str(inner.get("message") or inner.get("detail") or "")[:300]
        return str(inner)[:300]
    return str(err)[:300]
