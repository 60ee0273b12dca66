"""The root-cause rules applied to a case (first match wins), and the ``Diagnosis`` built from a verdict."""

from __future__ import annotations

from collections.abc import Sequence

from campaign.diagnosis.case import CODE_LINE, FRAME_LOOKBACK, MAX_EVIDENCE, Case, distinct, matches, rule_lines
from campaign.diagnosis.hints import hint_for
from campaign.diagnosis.signatures import KindInfo
from campaign.fingerprint import fingerprint
from campaign.logscan import Line
from campaign.records import Diagnosis, Evidence


def verdict(
    ctx: Case,
    kind: str,
    confidence: float,
    evidence: Sequence[Line],
    summary: str,
    *,
    after_ready: bool = False,
) -> Diagnosis:
    info = ctx.sigs.kinds.get(kind) or KindInfo(title=kind, hints={})
    # Kept in the order given: the cause first, then the context (frame, wrapper) that places it.
    ordered = list({ln.number: ln for ln in evidence}.values())[:MAX_EVIDENCE]
    items = [Evidence(line=ln.number, text=ln.text.strip()[:400]) for ln in ordered]
    hint, cause = hint_for(ctx, kind, ordered, after_ready)
    title = f"{info.title} ({cause})" if cause else info.title
    return Diagnosis(
        kind=kind,
        evidence=items,
        hint=hint,
        confidence=round(confidence, 2),
        fingerprint=fingerprint(kind, [e.text for e in items]),
        summary=f"{title}: {summary}" if summary else title,
    )


def first_cause(
    ctx: Case, lines: Sequence[Line], *, include_weak: bool, skip: frozenset[str] = frozenset()
) -> Diagnosis | None:
    for rule in ctx.sigs.rules:
        if (rule.weak and not include_weak) or rule.kind in skip:
            continue
        hits = rule_lines(rule, lines, ctx.lines)
        if not hits:
            continue
        # The exception line says it better than the source line echoed above it ("raise RuntimeError(...)").
        primary = distinct(sorted(hits, key=lambda ln: (CODE_LINE.match(ln.message) is not None, ln.number)), 3)
        context = []
        frame = primary[0].frame
        if frame is not None and primary[0].number - frame.number <= FRAME_LOOKBACK:
            context.append(frame)
        wrapper = next((ln for ln in lines if matches(ctx.sigs.capture_wrappers + ctx.sigs.engine_wrappers, ln)), None)
        if wrapper is not None:
            context.append(wrapper)
        evidence = primary + sorted(context, key=lambda ln: ln.number)
        ctx.trace.append((rule, primary[0]))
        confidence = rule.confidence * (0.8 if len(hits) == 1 and rule.weak else 1.0)
        after_ready = bool(lines) and lines is not ctx.lines
        return verdict(
            ctx,
            rule.kind,
            confidence,
            evidence,
            f"line {primary[0].number}: {primary[0].message[:200]}",
            after_ready=after_ready,
        )
    return None


def crash_lines(ctx: Case, lines: Sequence[Line] | None = None) -> list[Line]:
    return [ln for ln in (ctx.lines if lines is None else lines) if not ln.quiet and matches(ctx.sigs.crash, ln)]
