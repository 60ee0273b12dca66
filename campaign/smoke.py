"""Smoke: questions with known answers over the OpenAI-compatible chat API, at temperature 0.

A server that starts but computes wrong (a broken kernel, a bad graph capture) shows up here as a wrong number.
The set is "What is 17×23?" (391) plus seeded random a×b and a+b with a, b < 100; the first integer in the reply
must equal the answer.
"""

from __future__ import annotations

import random
import re
import time

import httpx

from campaign.records import SmokeCheck, SmokeResult

_INT = re.compile(r"-?\d+")


def questions(n: int, seed: int) -> list[tuple[str, int]]:
    """17×23 first, then ``n`` seeded questions alternating a×b and a+b (a, b < 100)."""
    rng = random.Random(seed)
    out = [("What is 17×23?", 391)]
    for i in range(n):
        a, b = rng.randrange(100), rng.randrange(100)
        out.append((f"What is {a}×{b}?", a * b) if i % 2 == 0 else (f"What is {a}+{b}?", a + b))
    return out


def first_integer(text: str) -> int | None:
    """The first integer in ``text`` (a leading minus sign included), or None."""
    m = _INT.search(text)
    return int(m.group()) if m else None


def served_model(client: httpx.Client) -> str | None:
    """The first model id /v1/models lists, or None where the endpoint is missing."""
    try:
        r = client.get("/v1/models")
        data = r.json().get("data") or []
        return str(data[0]["id"]) if r.status_code == 200 and data else None
    except (httpx.HTTPError, ValueError, KeyError, IndexError, AttributeError):
        return None


def run_smoke(
    base_url: str, *, n: int = 4, seed: int = 0, max_tokens: int = 8, timeout_s: float = 30.0, model: str | None = None
) -> SmokeResult:
    """Ask every question once; a transport error or a bad body is a failed check with its error, not an exception."""
    checks: list[SmokeCheck] = []
    with httpx.Client(base_url=base_url, timeout=timeout_s) as client:
        model = model or served_model(client) or "default"
        for question, expected in questions(n, seed):
            body = {
                "model": model,
                "messages": [{"role": "user", "content": question}],
                "temperature": 0,
                "max_tokens": max_tokens,
                "stream": False,
            }
            t0 = time.perf_counter()
            try:
                r = client.post("/v1/chat/completions", json=body)
                latency = time.perf_counter() - t0
                if r.status_code != 200:
                    checks.append(
                        SmokeCheck(
                            question=question,
                            expected=expected,
                            error=f"HTTP {r.status_code}: {r.text[:200]}",
                            latency_s=latency,
                        )
                    )
                    continue
                reply = str(r.json()["choices"][0]["message"]["content"] or "")
            except httpx.HTTPError as e:
                checks.append(SmokeCheck(question=question, expected=expected, error=f"{type(e).__name__}: {e}"))
                continue
            except (ValueError, KeyError, IndexError, TypeError) as e:
                checks.append(SmokeCheck(question=question, expected=expected, error=f"malformed reply: {e!r}"))
                continue
            got = first_integer(reply)
            checks.append(
                SmokeCheck(
                    question=question,
                    expected=expected,
                    reply=reply,
                    got=got,
                    passed=got == expected,
                    latency_s=round(latency, 4),
                )
            )
    return SmokeResult(checks=checks)
