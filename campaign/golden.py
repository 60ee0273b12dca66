"""The known-good's smoke outputs as the reference: greedy-token agreement and log-probability closeness.

A kernel can be wrong without changing an answer: the reference model's answers survive an attention output scaled
by 0.7, and a real model's arithmetic is not exact to begin with. So the greedy replies of an attempt are compared
with those the host's known-good gave to the same questions, as engines' own correctness tests compare runs:

- **agreement**: per reply, the tokens equal to the known-good's from the first one up to the first difference,
  over the longer reply's length (the shorter one's when either was cut at max_tokens); summed over replies. A
  reply that stops early, runs on, or turns to other words lowers it.
- **logprobs**: where the two replies still agree, the log-probability of each token and of every alternative both
  servers listed in their ``top_logprobs``; the value is the largest difference relative to the known-good's,
  ``|this - known| / max(1, |known|)`` (so nats near 0, a share of the value for unlikely alternatives, whose
  log-probabilities carry the most rounding). The alternatives carry the signal: a confident model keeps its
  chosen token near 0 whatever the kernel does (×0.7 moved the reference model's by 2e-4), while the runner-up's
  log-probability moves with any change in the logits (-11.9 to -22.3 under the same fault).

Burst replies (sent at batch > 1) are compared with the known-good's sequential reply to the same question, so a
kernel that is wrong only when batched shows up too.
"""

from __future__ import annotations

from dataclasses import dataclass

from campaign.records import SmokeCheck, SmokeComparison, SmokeResult


@dataclass(frozen=True)
class Reference:
    """The known-good attempt's smoke result, and how to name it in a report."""

    smoke: SmokeResult
    label: str


def comparable(current: SmokeResult, reference: SmokeResult) -> str | None:
    """Why the two results cannot be compared (another model or API), or None when they can."""
    if reference.api != current.api:
        return f"the known-good's smoke used the {reference.api} API, this one {current.api}"
    if reference.model and current.model and reference.model != current.model:
        return f"the known-good served model {reference.model!r}, this server {current.model!r}"
    return None


def _sequence(check: SmokeCheck, use_tokens: bool) -> list[str]:
    if use_tokens:
        return list(check.tokens or [])
    return list(check.reply or "")


def _reference_by_question(reference: SmokeResult) -> dict[str, SmokeCheck]:
    return {c.question: c for c in reference.checks if c.phase == "sequential" and c.reply is not None}


def _where(check: SmokeCheck) -> str:
    return f"{check.question!r}" + (f" (burst of {check.batch})" if check.phase == "burst" else "")


def _common_prefix(a: list[str], b: list[str]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def token_agreement(checks: list[SmokeCheck], reference: Reference, *, min_agreement: float) -> SmokeComparison | None:
    """Agreement of ``checks``' greedy replies with the reference's (see the module docstring); None if none pair up."""
    by_question = _reference_by_question(reference.smoke)
    matched = total = compared = 0
    worst: tuple[float, str] | None = None
    for check in checks:
        ref = by_question.get(check.question)
        if ref is None or check.reply is None:
            continue
        use_tokens = check.tokens is not None and ref.tokens is not None
        mine, theirs = _sequence(check, use_tokens), _sequence(ref, use_tokens)
        cut = "length" in (check.finish_reason, ref.finish_reason)
        denom = min(len(mine), len(theirs)) if cut else max(len(mine), len(theirs))
        if denom == 0:
            continue
        prefix = min(_common_prefix(mine, theirs), denom)
        matched, total, compared = matched + prefix, total + denom, compared + 1
        share = prefix / denom
        if prefix < denom and (worst is None or share < worst[0]):
            unit = "token" if use_tokens else "character"
            at = f"{unit} {prefix + 1}"
            known = repr(theirs[prefix]) if prefix < len(theirs) else "(end)"
            this = repr(mine[prefix]) if prefix < len(mine) else "(end)"
            worst = (share, f"{_where(check)} first differs at {at}: known-good {known}, this attempt {this}")
    if compared == 0:
        return None
    value = matched / total
    return SmokeComparison(
        name="agreement",
        value=round(value, 6),
        limit=min_agreement,
        passed=value >= min_agreement,
        compared=compared,
        reference=reference.label,
        detail=worst[1] if worst else "",
    )


def logprob_closeness(checks: list[SmokeCheck], reference: Reference, *, tolerance: float) -> SmokeComparison | None:
    """The largest log-probability difference where the replies agree (module docstring); None without logprobs."""
    by_question = _reference_by_question(reference.smoke)
    largest = 0.0
    compared = 0
    worst = ""
    for check in checks:
        ref = by_question.get(check.question)
        if ref is None or not check.tokens or not ref.tokens or check.logprobs is None or ref.logprobs is None:
            continue
        agree = _common_prefix(check.tokens, ref.tokens)
        agree = min(agree, len(check.logprobs), len(ref.logprobs))
        for i in range(agree):
            pairs = [(check.tokens[i], check.logprobs[i], ref.logprobs[i])]
            mine_top = (check.top_logprobs or [])[i] if i < len(check.top_logprobs or []) else {}
            ref_top = (ref.top_logprobs or [])[i] if i < len(ref.top_logprobs or []) else {}
            pairs += [(tok, mine_top[tok], ref_top[tok]) for tok in mine_top if tok in ref_top]
            for token, mine, theirs in pairs:
                compared += 1
                diff = abs(mine - theirs) / max(1.0, abs(theirs))
                if diff > largest:
                    largest = diff
                    role = "" if token == check.tokens[i] else f", alternative {token!r}"
                    worst = (
                        f"{_where(check)} token {i + 1} {check.tokens[i]!r}{role}: "
                        f"known-good {theirs:.4g}, this attempt {mine:.4g}"
                    )
    if compared == 0:
        return None
    return SmokeComparison(
        name="logprobs",
        value=round(largest, 6),
        limit=tolerance,
        passed=largest <= tolerance,
        compared=compared,
        reference=reference.label,
        detail=worst,
    )
