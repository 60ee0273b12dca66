"""The prompts of a bench: fixed-seed, so two runs of one bench send the same requests in the same order.

Random prompts are ``input_len`` words; ``fit_prompts`` makes them token-exact with a counter (the server's
/tokenize), adding or dropping words from the same seeded sequence until the count is ``input_len``.

Long-context prompts are an arithmetic question after filler words (the reference server's long-context model is
trained to ignore them: ``campaign.refserver.questions``), ``input_len`` tokens in all: the context length. Their
answer is known (``Prompt.answer``). Without a counter the filler is sized for a character-level tokenizer (the
reference server's: one token a character, plus two); with one, the filler grows or shrinks a character at a time
until the count is exact.
"""

from __future__ import annotations

import json
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from campaign.records import BenchSettings
from campaign.refserver.questions import FILLER_JOIN, filler_text, long_context_text

#: Words used to build random prompts: short, common English words that nearly every tokenizer encodes as one
#: token each, so ``input_len`` words come close to ``input_len`` prompt tokens without needing a tokenizer here.
_PROMPT_TEXT = (
    "the of and to in is it you that he was for on are as with his they at be this have from or one had by "
    "word but not what all were we when your can said there use an each which she do how their if will up "
    "other about out many then them these so some her would make like him into time has look two more write "
    "go see number no way could people my than first water been call who oil its now find long down day did "
    "get come made may part"
)
PROMPT_WORDS = tuple(_PROMPT_TEXT.split())


@dataclass(frozen=True)
class Prompt:
    """One request's message, how many prompt tokens it is meant to have (0 when unknown), and the exact answer
    of an arithmetic question (None for random words)."""

    text: str
    input_len: int = 0
    answer: int | None = None


#: Tokens a character-level tokenizer adds around a prompt's characters (the reference server's bos and sep).
_CHAR_TOKENIZER_EXTRA = 2


def _question(settings: BenchSettings, index: int) -> tuple[str, int]:
    """The seeded arithmetic question of prompt ``index`` and its answer."""
    rng = random.Random(f"{settings.seed}/{index}")
    a, b = rng.randint(0, 99), rng.randint(0, 99)
    op = rng.choice("×+-")
    answer = a * b if op == "×" else a + b if op == "+" else a - b
    return f"What is {a}{op}{b}?", answer


def _long_context(settings: BenchSettings, index: int, filler_chars: int) -> Prompt:
    """Prompt ``index`` as a long-context question after ``filler_chars`` characters of seeded filler."""
    question, answer = _question(settings, index)
    # Its own generator: n characters of filler are a prefix of n + 1 (what fitting to a token count relies on).
    filler = filler_text(random.Random(f"{settings.seed}/{index}/filler"), max(0, filler_chars))
    text = long_context_text(question, filler)
    return Prompt(text, len(text) + _CHAR_TOKENIZER_EXTRA, answer)


def _filler_chars(settings: BenchSettings, index: int) -> int:
    """Filler characters that make prompt ``index`` ``input_len`` tokens for a character-level tokenizer."""
    question, _ = _question(settings, index)
    return settings.input_len - _CHAR_TOKENIZER_EXTRA - len(question) - FILLER_JOIN


def _words(settings: BenchSettings, index: int, count: int) -> str:
    # One generator per prompt index: any slice of the sequence costs only its own length, and ``count`` words are
    # a prefix of ``count + 1`` (what fitting a prompt to a token count relies on).
    rng = random.Random(f"{settings.seed}/{index}")
    return " ".join(rng.choice(PROMPT_WORDS) for _ in range(count))


def make_prompts(settings: BenchSettings, count: int, *, offset: int = 0) -> list[Prompt]:
    """The fixed-seed prompts of a bench: ``count`` of them starting at ``offset`` in the seeded sequence."""
    out: list[Prompt] = []
    for i in range(offset, offset + count):
        if settings.prompts == "arithmetic":
            text, answer = _question(settings, i)
            out.append(Prompt(text, len(text), answer))
        elif settings.prompts == "long-context":
            out.append(_long_context(settings, i, _filler_chars(settings, i)))
        else:
            out.append(Prompt(_words(settings, i, settings.input_len), settings.input_len))
    return out


#: Rounds of add-or-drop words, then of steps by one word, before a prompt keeps the count it reached.
_FIT_ROUNDS = 6


async def _fit_one(settings: BenchSettings, index: int, tokens: Callable[[str], Awaitable[int]]) -> Prompt:
    target = settings.input_len
    counts: dict[int, int] = {}

    async def at(words: int) -> int:
        if words not in counts:
            counts[words] = await tokens(_words(settings, index, words))
        return counts[words]

    words = target
    for _ in range(_FIT_ROUNDS):
        n = await at(words)
        if n == target:
            return Prompt(_words(settings, index, words), n)
        step = max(1, round(abs(target - n) * words / max(n, 1))) if n else words
        words = max(1, words + (step if n < target else -step))
    # Step by single words to the pair that brackets the target, then cut characters inside the longer one: a
    # tokenizer that spends several tokens on a word (or one per character) still gets an exact count.
    for _ in range(4 * _FIT_ROUNDS):
        if await at(words) > target and words > 1:
            words -= 1
        elif await at(words + 1) <= target:
            words += 1
        else:
            break
    text, n = _words(settings, index, words), await at(words)
    longer = _words(settings, index, words + 1)
    lo, hi = len(text), len(longer)
    while n != target and hi - lo > 1:
        mid = (lo + hi) // 2
        m = await tokens(longer[:mid])
        if m <= target:
            lo, text, n = mid, longer[:mid], m
        else:
            hi = mid
    return Prompt(text, n)


async def _fit_long(settings: BenchSettings, index: int, tokens: Callable[[str], Awaitable[int]]) -> Prompt:
    """Long-context prompt ``index`` with its filler sized so the prompt is ``input_len`` tokens (or the nearest
    below it): a secant step from the character-level guess, then bisection once the target is bracketed."""
    target = settings.input_len
    below: tuple[int, int] | None = None  # (filler chars, tokens) of the longest prompt found at or under target
    above: int | None = None  # fewest filler chars found over target
    chars = max(0, _filler_chars(settings, index))
    for _ in range(8 * _FIT_ROUNDS):
        n = await tokens(_long_context(settings, index, chars).text)
        if n == target:
            break
        if n < target:
            below = (chars, n) if below is None or chars > below[0] else below
        else:
            above = chars if above is None else min(above, chars)
        if below is not None and above is not None:
            if above - below[0] <= 1:
                chars, n = below
                break
            chars = (below[0] + above) // 2
        else:
            per_token = max(1.0, chars / max(n, 1))
            chars = max(0, chars + round((target - n) * per_token))
            if above is None and below is not None and chars <= below[0]:
                chars = below[0] + 1
            if chars == 0 and n > target:
                break  # even no filler is too long: the question alone is the prompt
    prompt = _long_context(settings, index, chars)
    return Prompt(prompt.text, n, prompt.answer)


async def fit_prompts(
    settings: BenchSettings, count: int, offset: int, tokens: Callable[[str], Awaitable[int]]
) -> list[Prompt]:
    """Random or long-context prompts whose token count (as ``tokens`` counts them) is ``input_len`` (or the
    nearest below it)."""
    fit = _fit_long if settings.prompts == "long-context" else _fit_one
    return [await fit(settings, i, tokens) for i in range(offset, offset + count)]


def chat_payload(settings: BenchSettings, model: str, prompt: Prompt) -> bytes:
    """The JSON body of one streaming chat request for ``prompt``, as ``settings`` asks."""
    body: dict[str, Any] = {
        "model": model,
        "messages": [{"role": "user", "content": prompt.text}],
        "max_tokens": settings.effective_max_tokens(),
        "temperature": settings.temperature,
        "stream": True,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
    }
    if settings.effective_ignore_eos():
        body["ignore_eos"] = True
    return json.dumps(body, separators=(",", ":")).encode()


def completion_payload(settings: BenchSettings, model: str, prompt: Prompt) -> bytes:
    """The JSON body of one streaming ``/v1/completions`` request: the prompt as it is, no chat template."""
    body: dict[str, Any] = {
        "model": model,
        "prompt": prompt.text,
        "max_tokens": settings.effective_max_tokens(),
        "temperature": settings.temperature,
        "stream": True,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
    }
    if settings.effective_ignore_eos():
        body["ignore_eos"] = True
    return json.dumps(body, separators=(",", ":")).encode()


def payload(settings: BenchSettings, model: str, prompt: Prompt) -> bytes:
    """The request body for ``settings.endpoint``."""
    if settings.endpoint == "completions":
        return completion_payload(settings, model, prompt)
    return chat_payload(settings, model, prompt)
