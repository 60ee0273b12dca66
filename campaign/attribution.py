"""Attribution: which knob values, alone or together, explain each kind of failure seen over a set of attempts.

Pure. The question an engineer asks after a variant fails is "which of my changes did it?". ``attribute`` answers it
from the attempts of a run (roles ``variant`` and ``isolation`` only; a restore says nothing about variants):

* For a failure kind K, the attempts that failed with K are the positives and the attempts that passed are the
  negatives. Attempts that failed with another kind are left out: they died of something else, so they neither show K
  nor rule it out.
* An explanation is a conjunction of knob assignments that every positive has and no negative has. The smallest such
  conjunctions are searched (one knob, then pairs, then triples).
* When no single conjunction fits (one kind, several causes: say an OOM from torch.compile's workspace and another
  from a starved memory fraction), the failures are covered greedily by the fewest conjunctions that each hold in no
  pass; the finding names them, with the attempts each covers, but stays ``not_enough_evidence``: a cover is a
  hypothesis, not a controlled comparison.
* It is ``explained`` when exactly one smallest conjunction exists and every other knob that varied in the run was seen
  with at least two values among the positives (so the failure is shown independent of it). Otherwise it is
  ``not_enough_evidence`` and ``settle_with`` lists the knob assignments whose runs would decide.

``plan_isolation`` is the experiment that makes this decidable: from a failed variant, toggle each knob that differs
from the baseline back to its baseline value, one at a time, skipping what was already run.
"""

from __future__ import annotations

import itertools
from collections.abc import Collection, Iterable, Mapping, Sequence

from campaign.records import Attempt, Finding, KnobValue, show_value

_ROLES = ("variant", "isolation")
#: Knobs that change where a server listens, not what it runs: never a cause, never worth an isolation run.
NUISANCE_KNOBS = frozenset({"port"})
_MAX_CONJUNCTION = 3


def _assignment(knobs: Mapping[str, KnobValue]) -> str:
    return " and ".join(f"{k}={show_value(v)}" for k, v in knobs.items())


def _values(values: Iterable[KnobValue]) -> list[KnobValue]:
    out: list[KnobValue] = []
    for v in values:
        if not any(v == seen and type(v) is type(seen) for seen in out):
            out.append(v)
    return out


def _canon(
    knobs: Mapping[str, KnobValue], baseline: Mapping[str, KnobValue], ignore: Collection[str]
) -> dict[str, KnobValue]:
    """An attempt's knobs as compared: the baseline fills what it does not set; ignored knobs and explicit ``None``
    for a knob the baseline leaves to the recipe (the same thing as not setting it) are dropped."""
    merged = {**baseline, **knobs}
    return {k: v for k, v in merged.items() if k not in ignore and not (v is None and k not in baseline)}


def _same(a: Mapping[str, KnobValue], b: Mapping[str, KnobValue]) -> bool:
    return a.keys() == b.keys() and all(a[k] == b[k] and type(a[k]) is type(b[k]) for k in a)


def plan_isolation(
    failed: Mapping[str, KnobValue],
    baseline: Mapping[str, KnobValue],
    tried: Sequence[Mapping[str, KnobValue]],
    *,
    ignore: Collection[str] = NUISANCE_KNOBS,
) -> list[dict[str, KnobValue]]:
    """The extra runs that localise a failure: ``failed`` with one differing knob set back to baseline, each untried.

    Knobs the failed variant sets but the baseline does not are dropped (the recipe's default is the baseline for
    them). ``tried`` holds the knob assignments already run; baseline values fill what each of them leaves out.
    """
    done = [_canon(t, baseline, ignore) for t in tried]
    start = {k: v for k, v in failed.items() if not (v is None and k not in baseline)}
    plan: list[dict[str, KnobValue]] = []
    for knob, value in start.items():
        if knob in ignore:
            continue
        if knob in baseline and baseline[knob] == value and type(baseline[knob]) is type(value):
            continue
        toggled = dict(start)
        if knob in baseline:
            toggled[knob] = baseline[knob]
        else:
            del toggled[knob]
        full = _canon(toggled, baseline, ignore)
        if any(_same(full, d) for d in done) or any(_same(full, _canon(p, baseline, ignore)) for p in plan):
            continue
        plan.append(toggled)
    return plan


def _satisfies(knobs: Mapping[str, KnobValue], conj: Mapping[str, KnobValue]) -> bool:
    # A knob an attempt does not set is unset (None): "unset" is a value like any other here.
    return all(knobs.get(k) == v and type(knobs.get(k)) is type(v) for k, v in conj.items())


def _explanations(
    positives: Sequence[Mapping[str, KnobValue]], negatives: Sequence[Mapping[str, KnobValue]], varying: Sequence[str]
) -> list[dict[str, KnobValue]]:
    """The smallest conjunctions of knob values shared by every positive and held by no negative."""
    first = positives[0]
    shared = [k for k in varying if all(_satisfies(p, {k: first.get(k)}) for p in positives)]
    for size in range(1, min(_MAX_CONJUNCTION, len(shared)) + 1):
        found = []
        for combo in itertools.combinations(shared, size):
            conj = {k: first.get(k) for k in combo}
            if not any(_satisfies(n, conj) for n in negatives):
                found.append(conj)
        if found:
            return found
    return []


def _cover(
    positives: Sequence[tuple[int, Mapping[str, KnobValue]]],
    negatives: Sequence[Mapping[str, KnobValue]],
    varying: Sequence[str],
) -> list[tuple[dict[str, KnobValue], list[int]]]:
    """The fewest smallest conjunctions, each held by no negative, that together cover every positive (or [])."""
    left = list(positives)
    causes: list[tuple[dict[str, KnobValue], list[int]]] = []
    while left and len(causes) < _MAX_CONJUNCTION:
        best: tuple[dict[str, KnobValue], list[int]] | None = None
        for size in range(1, _MAX_CONJUNCTION + 1):
            for _, knobs in left:
                for combo in itertools.combinations([k for k in varying if k in knobs], size):
                    conj = {k: knobs[k] for k in combo}
                    if any(_satisfies(n, conj) for n in negatives):
                        continue
                    covered = [i for i, kn in left if _satisfies(kn, conj)]
                    if best is None or len(covered) > len(best[1]):
                        best = (conj, covered)
            if best is not None:
                break  # the smallest size that covers anything
        if best is None:
            return []  # some failure looks exactly like a pass: flaky, not a knob
        causes.append(best)
        left = [(i, kn) for i, kn in left if i not in best[1]]
    return causes if not left else []


def _flip(value: KnobValue, seen: Sequence[KnobValue], baseline: KnobValue | None) -> KnobValue | None:
    """Another value for a knob: the baseline's when it differs, else the opposite boolean, else any other seen."""
    if baseline is not None and baseline != value:
        return baseline
    if isinstance(value, bool):
        return not value
    return next((s for s in seen if s != value), None)


def _settle_runs(
    reference: Mapping[str, KnobValue],
    knobs: Iterable[str],
    seen: Mapping[str, Sequence[KnobValue]],
    baseline: Mapping[str, KnobValue],
    tried: Sequence[Mapping[str, KnobValue]],
) -> list[dict[str, KnobValue]]:
    runs: list[dict[str, KnobValue]] = []
    for knob in knobs:
        value = reference.get(knob)
        if knob not in baseline and value is not None:
            run = {k: v for k, v in reference.items() if k != knob}  # back to the recipe's default
        else:
            other = _flip(value, seen.get(knob, []), baseline.get(knob))
            if other is None:
                continue
            run = {**reference, knob: other}
        if not any(_same(run, t) for t in tried) and not any(_same(run, r) for r in runs):
            runs.append(run)
    return runs


def _finding_for(
    kind: str,
    pos: list[tuple[int, dict[str, KnobValue]]],
    neg: list[tuple[int, dict[str, KnobValue]]],
    baseline: Mapping[str, KnobValue],
    tried: Sequence[dict[str, KnobValue]],
) -> Finding:
    everything = [k for _, k in pos + neg]
    names = list(dict.fromkeys(k for knobs in everything for k in knobs))
    seen = {k: _values(kn.get(k) for kn in everything) for k in names}
    positives = [k for _, k in pos]
    reference = positives[0]
    base = dict(baseline)
    # A knob matters to the question if it varied, or if the failures changed it from the baseline (never varied
    # yet, it is still a suspect).
    varying = [k for k in names if len(seen[k]) > 1 or any(p.get(k) != base.get(k) for p in positives)]
    negatives = [k for _, k in neg]
    failed_ix = [i for i, _ in pos]
    passed_ix = [i for i, _ in neg]

    if not negatives:
        candidates = [
            {k: reference.get(k)} for k in varying if all(_satisfies(p, {k: reference.get(k)}) for p in positives)
        ]
        settle = plan_isolation(reference, base, tried)
        return Finding(
            kind=kind,
            status="not_enough_evidence",
            candidates=candidates,
            statement=f"{kind}: every run with these knobs failed; no passing run to compare with"
            + (f" (run {len(settle)} isolation attempt(s) to localise it)" if settle else ""),
            evidence=failed_ix,
            failed=failed_ix,
            settle_with=settle,
        )

    explanations = _explanations(positives, negatives, varying)
    if not explanations:
        causes = _cover(pos, negatives, varying)
        if len(causes) > 1:
            parts = "; ".join(
                f"{_assignment(c)} (attempt{'s' if len(ix) > 1 else ''} {', '.join(map(str, ix))})" for c, ix in causes
            )
            return Finding(
                kind=kind,
                status="not_enough_evidence",
                candidates=[c for c, _ in causes],
                statement=f"{kind}: more than one cause fits, each seen in no passing run: {parts}",
                evidence=failed_ix + passed_ix,
                failed=failed_ix,
                passed=passed_ix,
                settle_with=[],
            )
        return Finding(
            kind=kind,
            status="not_enough_evidence",
            statement=(
                f"{kind}: no knob assignment separates the failures from the passes "
                "(a flaky failure, or more than one cause)"
            ),
            evidence=failed_ix + passed_ix,
            failed=failed_ix,
            passed=passed_ix,
            settle_with=[dict(reference)],
        )

    cause = explanations[0]
    pos_values = {k: _values(p.get(k) for p in positives) for k in varying}
    independent = {k: pos_values[k] for k in varying if k not in cause and len(pos_values[k]) > 1}
    # Still a suspect: a knob every failure changed from the baseline in the same way, never seen failing without.
    untested = [
        k
        for k in varying
        if k not in cause and k not in independent and any(p.get(k) != base.get(k) for p in positives)
    ]
    if len(explanations) == 1 and not untested:
        tail = "; independent of " + ", ".join(
            f"{k} (seen with {' and '.join(show_value(v) for v in vals)})" for k, vals in independent.items()
        )
        return Finding(
            kind=kind,
            status="explained",
            cause=cause,
            independent_of=independent,
            statement=f"{kind} iff {_assignment(cause)}" + (tail if independent else ""),
            evidence=failed_ix + passed_ix,
            failed=failed_ix,
            passed=passed_ix,
        )

    # Ambiguous: a knob shared by every failure but never varied among them could be part of the cause.
    open_knobs = list(dict.fromkeys([k for c in explanations for k in c] + untested))
    settle = _settle_runs(reference, open_knobs, seen, base, tried)
    options = " or ".join(_assignment(c) for c in explanations)
    unknown = f"; {' and '.join(untested)} never varied among the failures" if untested else ""
    return Finding(
        kind=kind,
        status="not_enough_evidence",
        cause={},
        candidates=explanations,
        independent_of=independent,
        statement=f"{kind}: not enough evidence: fits {options}{unknown}",
        evidence=failed_ix + passed_ix,
        failed=failed_ix,
        passed=passed_ix,
        settle_with=settle,
    )


def attribute(
    attempts: Sequence[Attempt],
    baseline: Mapping[str, KnobValue],
    *,
    ignore: Collection[str] = NUISANCE_KNOBS,
) -> list[Finding]:
    """One finding per failure kind seen among the variant and isolation attempts, in order of first failure.

    Knobs in ``ignore`` (by default ``port``) are left out of the analysis: they differ between attempts without
    changing what runs.
    """
    considered = [a for a in attempts if a.role in _ROLES and a.outcome in ("passed", "failed")]
    baseline = {k: v for k, v in baseline.items() if k not in ignore}
    tried = [_canon(a.knobs, baseline, ignore) for a in considered]
    passed = [(a.index, _canon(a.knobs, baseline, ignore)) for a in considered if a.outcome == "passed"]
    by_kind: dict[str, list[tuple[int, dict[str, KnobValue]]]] = {}
    for a in considered:
        if a.outcome == "failed":
            kind = a.diagnosis.kind if a.diagnosis is not None else "unknown"
            by_kind.setdefault(kind, []).append((a.index, _canon(a.knobs, baseline, ignore)))
    return [_finding_for(kind, pos, passed, baseline, tried) for kind, pos in by_kind.items()]
