"""Smoke: questions with known answers over the OpenAI-compatible API, at temperature 0, judged by their answer.

A server that starts but computes wrong (a broken kernel, a bad graph capture) shows up here. The questions are
"What is 17×23?" (391) plus seeded random a×b and a+b with a, b < 100. Each request carries an answer-format
instruction (a system message, or ``{instruction}`` in the completion prompt), room for a short chain of thought
(``max_tokens``, capped at half the context the server reports), ``chat_template_kwargs: {enable_thinking:
false}`` (dropped when the server refuses it) and asks for ``logprobs``. The reply's final answer is read by
``campaign.answer`` (after a think block; boxed, bold, ``= 391``, thousands separators); ``reasoning_content``
is kept beside the reply. A reply that hit max_tokens before giving the answer is "cut at max_tokens", not wrong.

The questions are asked one at a time, then again in concurrent bursts of 2, 4, 8, ... up to the variant's largest
batch, so batched decode and every captured CUDA-graph bucket up to it run. A server may serve a burst's requests one
after another (a CPU build, an interpreted kernel): a burst request's timeout is ``timeout_s`` plus its wait behind
the rest of its burst, at most (size - 1) x the slowest sequential reply, so a slow but right server passes and a
stuck one still fails. With the host's known-good smoke
outputs as reference (``campaign.golden``), the log-probabilities of the answer tokens must stay within a tolerance
of the known-good's; in golden mode (models whose arithmetic is not exact) the greedy tokens must agree with the
known-good's instead of the answers being exact.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import httpx

from campaign.answer import parse_answer
from campaign.config import SmokeConfig
from campaign.golden import Reference, comparable, logprob_closeness, token_agreement
from campaign.interruption import checkpoint, interruptible
from campaign.records import KnobValue, SmokeCheck, SmokeResult

Phase = Literal["sequential", "burst"]
#: The burst size when neither the config nor the variant's knobs say how large a batch it runs.
DEFAULT_BURST_MAX = 32
#: Knobs that bound the variant's decode batch (the smaller one set wins).
BATCH_KNOBS = ("cuda_graph_max_bs", "max_batch")


def questions(n: int, seed: int) -> list[tuple[str, int]]:
    """17×23 first, then ``n`` seeded questions alternating a×b and a+b (a, b < 100)."""
    rng = random.Random(seed)
    out = [("What is 17×23?", 391)]
    for i in range(n):
        a, b = rng.randrange(100), rng.randrange(100)
        out.append((f"What is {a}×{b}?", a * b) if i % 2 == 0 else (f"What is {a}+{b}?", a + b))
    return out


def burst_sizes(largest: int) -> list[int]:
    """2, 4, 8, ... below ``largest``, then ``largest`` (empty below 2): one burst per graph bucket."""
    sizes: list[int] = []
    size = 2
    while size < largest:
        sizes.append(size)
        size *= 2
    if largest >= 2:
        sizes.append(largest)
    return sizes


def burst_max(settings: SmokeConfig, knobs: Mapping[str, KnobValue]) -> int:
    """The largest burst: the config's, else the smaller of the variant's batch knobs, else ``DEFAULT_BURST_MAX``."""
    if settings.burst_max is not None:
        return settings.burst_max
    bounds = [int(v) for k in BATCH_KNOBS if isinstance(v := knobs.get(k), int | str) and str(v).isdigit()]
    return min(bounds) if bounds else DEFAULT_BURST_MAX


@dataclass
class _Session:
    """What the server accepted, learnt from the first refusal and kept for every later request."""

    settings: SmokeConfig
    model: str
    max_tokens: int
    send_template_kwargs: bool
    send_logprobs: bool = True
    notes: list[str] = field(default_factory=list)


async def served_model(client: httpx.AsyncClient) -> tuple[str | None, int | None]:
    """The first model id /v1/models lists and its ``max_model_len``, each None where the server does not say."""
    try:
        async with asyncio.timeout(client.timeout.read or 60.0):  # the whole reply, not each read (see _ask)
            r = await client.get("/v1/models")
        data = r.json().get("data") or []
        if r.status_code != 200 or not data:
            return None, None
        length = data[0].get("max_model_len")
        return str(data[0]["id"]), int(length) if isinstance(length, int) and length > 0 else None
    except (httpx.HTTPError, TimeoutError, ValueError, KeyError, IndexError, AttributeError, TypeError):
        return None, None


def _body(s: _Session, question: str) -> tuple[str, dict[str, Any]]:
    cfg = s.settings
    body: dict[str, Any] = {"model": s.model, "temperature": 0, "max_tokens": s.max_tokens, "stream": False}
    if cfg.api == "completions":
        body["prompt"] = cfg.completion_prompt.format(question=question, instruction=cfg.instruction)
        if s.send_logprobs:
            body["logprobs"] = cfg.top_logprobs
        return "/v1/completions", body
    messages = [{"role": "user", "content": question}]
    if cfg.instruction and cfg.instruction_in == "system":
        messages.insert(0, {"role": "system", "content": cfg.instruction})
    elif cfg.instruction:
        messages[0]["content"] = f"{question} {cfg.instruction}"
    body["messages"] = messages
    if s.send_logprobs:
        body["logprobs"] = True
        if cfg.top_logprobs:
            body["top_logprobs"] = cfg.top_logprobs
    if s.send_template_kwargs:
        body["chat_template_kwargs"] = {"enable_thinking": False}
    return "/v1/chat/completions", body


def _refused(s: _Session, status: int, text: str) -> bool:
    """After a 400 naming optional fields we sent, stop sending them and say so; False when it names none of them."""
    names_kwargs = status == 400 and s.send_template_kwargs and "chat_template_kwargs" in text
    names_logprobs = status == 400 and s.send_logprobs and "logprobs" in text
    if not (names_kwargs or names_logprobs):
        return False
    if names_kwargs:
        s.send_template_kwargs = False
        s.notes.append(f"the server refused chat_template_kwargs (HTTP 400: {text[:160]}); asked without it")
    if names_logprobs:
        s.send_logprobs = False
        s.notes.append(f"the server refused logprobs (HTTP 400: {text[:160]}); no log-probability check")
    return True


def _chat_logprobs(choice: Mapping[str, Any]) -> tuple[list[str], list[float], list[dict[str, float]]] | None:
    content = (choice.get("logprobs") or {}).get("content")
    if not content:
        return None
    tokens = [str(e["token"]) for e in content]
    lps = [float(e["logprob"]) for e in content]
    tops = [{str(t["token"]): float(t["logprob"]) for t in e.get("top_logprobs") or []} for e in content]
    return tokens, lps, tops


def _completion_logprobs(choice: Mapping[str, Any]) -> tuple[list[str], list[float], list[dict[str, float]]] | None:
    lp = choice.get("logprobs") or {}
    tokens, values = lp.get("tokens"), lp.get("token_logprobs")
    if not tokens or values is None or any(v is None for v in values):
        return None
    tops = [{str(k): float(v) for k, v in (t or {}).items()} for t in lp.get("top_logprobs") or [None] * len(tokens)]
    return [str(t) for t in tokens], [float(v) for v in values], tops


def judge(check: SmokeCheck, max_tokens: int) -> SmokeCheck:
    """Set ``got``, ``verdict`` and ``passed`` of a check that has its reply."""
    answer = parse_answer(check.reply or "")
    check.got = answer.value
    if answer.value is not None and answer.value == check.expected:
        check.verdict, check.passed = "right", True
    elif check.finish_reason == "length":
        check.verdict = "cut"
        where = " inside a think block" if answer.thinking or (check.reasoning and not check.reply) else ""
        check.error = f"cut at max_tokens ({max_tokens}){where} before an answer"
    elif answer.value is None:
        check.verdict = "no_answer"
    else:
        check.verdict = "wrong"
    return check


def burst_timeout(timeout_s: float, size: int, sequential: Sequence[SmokeCheck]) -> float:
    """A burst request's timeout: ``timeout_s`` plus a wait behind the other ``size - 1`` requests.

    Each of those is counted as slow as the slowest sequential reply: a server that does not batch serves them in turn.
    """
    slowest = max((c.latency_s or 0.0 for c in sequential), default=0.0)
    return timeout_s + max(size - 1, 0) * slowest


async def _ask(
    client: httpx.AsyncClient,
    s: _Session,
    question: str,
    expected: int,
    phase: Phase,
    batch: int,
    timeout_s: float | None = None,
) -> SmokeCheck:
    checkpoint()  # a signal ends the smoke here, not after the last question
    check = SmokeCheck(question=question, expected=expected, phase=phase, batch=batch)
    timeout = s.settings.timeout_s if timeout_s is None else timeout_s
    while True:
        path, body = _body(s, question)
        t0 = time.perf_counter()
        try:
            # httpx's timeout bounds each read, not the reply: one that trickles a byte at a time would never end.
            async with asyncio.timeout(timeout):
                r = await client.post(path, json=body, timeout=timeout)
        except (httpx.TimeoutException, TimeoutError) as e:
            where = f" (burst of {batch}: {s.settings.timeout_s:g} s and its wait behind the rest)" if batch > 1 else ""
            # Our whole-reply bound is named as httpx's per-read one: either way the reply never came in time.
            name = "ReadTimeout" if isinstance(e, TimeoutError) else type(e).__name__
            check.verdict, check.error = "error", f"{name}: no reply within {timeout:.1f} s{where}"
            return check
        except httpx.HTTPError as e:
            check.verdict, check.error = "error", f"{type(e).__name__}: {e}"
            return check
        check.latency_s = round(time.perf_counter() - t0, 4)
        if r.status_code == 200:
            break
        if not _refused(s, r.status_code, r.text):
            check.verdict, check.error = "error", f"HTTP {r.status_code}: {r.text[:200]}"
            return check
    try:
        choice = r.json()["choices"][0]
        if s.settings.api == "completions":
            reply, reasoning, lps = str(choice.get("text") or ""), None, _completion_logprobs(choice)
        else:
            message = choice["message"]
            reply = str(message.get("content") or "")
            reasoning = message.get("reasoning_content") or message.get("reasoning")
            lps = _chat_logprobs(choice)
        finish = choice.get("finish_reason")
    except (ValueError, KeyError, IndexError, TypeError, AttributeError) as e:
        check.verdict, check.error = "error", f"malformed reply: {e!r}"
        return check
    check.reply = reply
    check.reasoning = str(reasoning) if reasoning else None
    check.finish_reason = str(finish) if finish is not None else None
    if lps is not None:
        check.tokens, check.logprobs, check.top_logprobs = lps
    return judge(check, s.max_tokens)


async def _smoke(
    base_url: str, settings: SmokeConfig, largest: int, reference: Reference | None, model: str | None
) -> SmokeResult:
    limits = httpx.Limits(max_connections=max(largest, 1) + 2, max_keepalive_connections=max(largest, 1) + 2)
    async with httpx.AsyncClient(base_url=base_url, timeout=settings.timeout_s, limits=limits) as client:
        served, context = await served_model(client)
        max_tokens = settings.max_tokens
        notes: list[str] = []
        if context is not None and max_tokens > context // 2:
            max_tokens = max(1, context // 2)
            notes.append(f"max_tokens {settings.max_tokens} capped at {max_tokens}, half the served context {context}")
        session = _Session(settings, model or served or "default", max_tokens, settings.reasoning_off, notes=notes)
        asked = questions(settings.questions, settings.seed)
        checks = [await _ask(client, session, q, a, "sequential", 1) for q, a in asked]
        if settings.burst and any(c.verdict != "error" for c in checks):
            offset = 0
            sequential = list(checks)
            for size in burst_sizes(largest):
                picked = [asked[(offset + j) % len(asked)] for j in range(size)]
                offset += size
                timeout = burst_timeout(settings.timeout_s, size, sequential)
                checks += await asyncio.gather(
                    *(_ask(client, session, q, a, "burst", size, timeout) for q, a in picked)
                )
        elif settings.burst:
            notes.append("no burst: every sequential request failed")
    result = SmokeResult(
        checks=checks,
        mode=settings.mode,
        api=settings.api,
        model=session.model,
        reasoning_off=session.send_template_kwargs if settings.api == "chat" and settings.reasoning_off else None,
        notes=session.notes,
    )
    _compare(result, settings, reference)
    for check in result.checks:  # burst outputs were compared; only the sequential ones are kept as a reference
        if check.phase == "burst":
            check.tokens = check.logprobs = check.top_logprobs = None
    return result


def _compare(result: SmokeResult, settings: SmokeConfig, reference: Reference | None) -> None:
    if reference is None:
        result.notes.append("no known-good smoke outputs on this host yet: nothing to compare with")
        return
    reason = comparable(result, reference.smoke)
    if reason is not None:
        result.notes.append(f"not compared with {reference.label}: {reason}")
        return
    if settings.mode == "golden":
        result.agreement = token_agreement(result.checks, reference, min_agreement=settings.min_agreement)
        if result.agreement is None:
            result.notes.append(f"no reply pairs up with {reference.label}'s: no token agreement")
    if settings.logprob_tolerance is not None:
        result.logprobs = logprob_closeness(result.checks, reference, tolerance=settings.logprob_tolerance)
        if result.logprobs is None:
            result.notes.append(f"no log-probabilities to compare with {reference.label}'s")


def run_smoke(
    base_url: str,
    settings: SmokeConfig | None = None,
    *,
    largest_batch: int | None = None,
    reference: Reference | None = None,
    model: str | None = None,
) -> SmokeResult:
    """Ask every question alone, then in bursts up to ``largest_batch``; compare with ``reference`` when given.

    A transport error or a bad body is a failed check with its error, never an exception. A signal (``Interrupted``)
    cancels it, whatever it awaits, and is raised from here (``campaign.interruption.interruptible``).
    """
    settings = settings or SmokeConfig()
    largest = largest_batch if largest_batch is not None else (settings.burst_max or DEFAULT_BURST_MAX)
    return asyncio.run(interruptible(_smoke(base_url, settings, largest, reference, model)))
