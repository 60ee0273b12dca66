"""A generation request as the engine and the HTTP side share it, and the counters the engine keeps.

Both processes of the server use these: the engine process runs ``Request`` objects through its scheduler, and the
HTTP process keeps a mirror of each one that the tokens coming back from the engine fill in (``engine_process``).
Nothing here needs torch, so the HTTP process starts without it.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np


@dataclass(frozen=True)
class TokenLogprob:
    """The log-probability of one generated token under the distribution it was chosen from, and the top ones."""

    logprob: float
    top: list[tuple[int, float]]


#: Called with (token id or None, finish reason or None) by what delivers the tokens: the engine's scheduler, or in
#: the HTTP process the reader of the engine process's messages. A finish reason (or ``error``) ends the stream.
TokenSink = Callable[[int | None, str | None], None]


@dataclass
class Request:
    """One generation request and its state in the scheduler."""

    prompt: list[int]
    max_new_tokens: int
    temperature: float = 0.0
    ignore_eos: bool = False
    #: Log-probabilities to record per generated token: None for none, k for the chosen token and the top k.
    logprobs: int | None = None
    sink: TokenSink | None = None
    rid: int = field(default_factory=itertools.count().__next__)
    output: list[int] = field(default_factory=list)
    #: With ``logprobs`` set: per generated token, its log-probability and the top ``logprobs`` (id, logprob).
    token_logprobs: list[TokenLogprob] = field(default_factory=list)
    slots: np.ndarray | None = None
    #: The engine's: the decode table row the request holds while it runs, and its decode steps not handed out yet.
    row: int | None = None
    in_flight: int = 0
    finish_reason: str | None = None
    aborted: bool = False

    @property
    def length(self) -> int:
        """Tokens in the request so far: prompt plus generated."""
        return len(self.prompt) + len(self.output)


@dataclass
class Stats:
    """Counters the /metrics endpoint serves."""

    requests_finished: int = 0
    prompt_tokens: int = 0
    generation_tokens: int = 0
    running: int = 0
    queued: int = 0
    #: Decode steps, tokens they produced, and their wall time (host work included, as a client sees it).
    decode_steps: int = 0
    decode_tokens: int = 0
    decode_seconds: float = 0.0
    #: Of ``decode_seconds``, the time spent waiting for the device to finish a step (the rest is host work).
    decode_wait_seconds: float = 0.0
    #: Long-context models: indexer logits the decode steps' indexer form computed (all layers). The aware form
    #: scores each row's own length; the naive one every position up to the context length, for every row.
    index_logits: int = 0
