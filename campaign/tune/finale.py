"""The end of a tune: the best candidates and the baseline relaunched interleaved, tested, and one of them kept.

The best ``final.candidates`` passed configurations (by objective, the baseline left out) and the baseline run as
one run with ``final.launches`` launches each, in rounds (baseline, a, b, baseline, a, b, ...: the loop's
``bench.launches``), so the box's drift falls on every side alike. Each candidate's per-launch objective is tested
against the baseline's as ``compare`` tests a cell (``campaign.statistics``: Welch's t-test, the p-values of the
candidates adjusted together by Holm, the ratio's 95 % interval, a minimum effect). A candidate is kept only when it
is significantly better, beyond the minimum effect, and every smoke of its launches was exact; the best such
candidate becomes the experiment's known-good. Otherwise the baseline does, and the verdict says why. Either way
the kept configuration is relaunched and proven (``campaign restore``'s run), so the tune ends on a proven box.
"""

from __future__ import annotations

from campaign.config import Loaded, VariantConfig
from campaign.hosts.base import Host
from campaign.pipeline import Campaign, EventSink, restore_now
from campaign.records import Attempt, RunReport
from campaign.records.tune import FinalVerdict, TrialRecord, TuneReport
from campaign.statistics import adjust, ratio_interval, welch
from campaign.store import Store
from campaign.tune.space import Config, SearchConfig, describe, key
from campaign.tune.trials import objective_of, trial_loaded, trial_name, variant_knobs


def candidates(report: TuneReport, baseline: Config, n: int) -> list[TrialRecord]:
    """The ``n`` best passed configurations other than the baseline, each once."""
    sign = 1.0 if report.higher_is_better else -1.0
    ok = sorted(
        (
            t
            for t in report.trials
            if t.outcome == "passed" and t.objective is not None and key(t.config) != key(baseline)
        ),
        key=lambda t: -sign * (t.objective or 0.0),
    )
    out: list[TrialRecord] = []
    for t in ok:
        if all(key(t.config) != key(o.config) for o in out):
            out.append(t)
    return out[:n]


def _launches(run: RunReport, name: str) -> list[Attempt]:
    return [a for a in run.attempts if a.variant == name and a.role in ("variant", "relaunch")]


def decide(
    run: RunReport, search: SearchConfig, names: list[str], baseline_name: str
) -> tuple[str | None, dict[str, str], str]:
    """The candidate to keep (None: the baseline), each candidate's cell text, and why."""
    obj = search.objective
    sign = 1.0 if obj.higher_is_better else -1.0
    base = [
        v for a in _launches(run, baseline_name) if a.outcome == "passed" and (v := objective_of(a, obj)[0]) is not None
    ]
    tests: list[tuple[str, float, float, float | None, float | None, bool]] = []
    cells: dict[str, str] = {}
    for name in names:
        atts = _launches(run, name)
        vals = [v for a in atts if a.outcome == "passed" and (v := objective_of(a, obj)[0]) is not None]
        exact = bool(atts) and all(a.outcome == "passed" and a.smoke is not None and a.smoke.ok for a in atts)
        if len(vals) < 2 or len(base) < 2:
            cells[name] = f"untested: {len(vals)} launch(es) against the baseline's {len(base)} passed"
            continue
        w = welch(vals, base)
        ci = ratio_interval(vals, base)
        ratio = (sum(vals) / len(vals)) / (sum(base) / len(base)) if sum(base) else float("nan")
        tests.append((name, ratio, w.p, ci.low if ci else None, ci.high if ci else None, exact))
    adjusted = adjust([t[2] for t in tests], "holm") if tests else []
    winners: list[tuple[float, str]] = []
    for (name, ratio, _p, lo, hi, exact), p_adj in zip(tests, adjusted, strict=True):
        better = sign * (ratio - 1) > 0
        significant = p_adj < search.final.alpha
        big = abs(ratio - 1) >= search.final.min_effect
        interval = f", 95% CI {lo:.3f}-{hi:.3f}" if lo is not None and hi is not None else ""
        if significant and big:
            verdict = "better" if better else "worse"
        elif significant:
            verdict = "negligible (under the minimum effect)"
        else:
            verdict = "not significant"
        cells[name] = f"{verdict}: {ratio:.3f}x the baseline (Holm p={p_adj:.3g}{interval})" + (
            "" if exact else "; smoke not exact on every launch"
        )
        if significant and big and better and exact:
            winners.append((sign * ratio, name))
    if winners:
        best = max(winners)[1]
        return best, cells, f"{best} is significantly better than the baseline and its smoke was exact on every launch"
    why = "; ".join(f"{n}: {c}" for n, c in cells.items()) or "no candidate to test"
    return None, cells, f"no significant gain: {why}"


def finish(
    loaded: Loaded,
    host: Host,
    store: Store,
    search: SearchConfig,
    report: TuneReport,
    baseline: Config,
    on_event: EventSink | None = None,
) -> FinalVerdict:
    """Relaunch the candidates and the baseline interleaved, keep the one the test allows, prove the box."""
    exp = loaded.experiment
    best = candidates(report, baseline, search.final.candidates)
    verdict = FinalVerdict(launches=search.final.launches)
    if best:
        variants = [
            VariantConfig(
                name=trial_name(t.number, t.config, baseline).replace(f"t{t.number:02d}-", f"final{i + 1}-", 1),
                knobs=variant_knobs(exp.baseline.knobs, t.config),
            )
            for i, t in enumerate(best)
        ]
        verdict.candidates = [v.name for v in variants]
        final = trial_loaded(loaded, variants, with_baseline=True, launches=search.final.launches)
        run = Campaign(final, host, store, on_event=on_event).run()
        verdict.run_id = run.run_id
        if run.status == "interrupted":
            verdict.detail = "interrupted during the final relaunches"
            return verdict
        winner, verdict.cells, verdict.detail = decide(run, search, verdict.candidates, exp.baseline.name)
        keep = winner or exp.baseline.name
        first = next((a for a in _launches(run, keep) if a.outcome == "passed"), None)
        if first is not None:
            store.set_known_good(host.name, exp.name, keep, first.spec, run.run_id, first.index)
        if winner is not None:
            verdict.promoted = winner
            verdict.promoted_config = best[verdict.candidates.index(winner)].config
            verdict.detail += f" ({describe(verdict.promoted_config)}); it is the known-good now"
        else:
            verdict.detail += "; the baseline stays the known-good"
    else:
        verdict.detail = "no configuration other than the baseline passed: the baseline stays the known-good"
    restore = restore_now(loaded, host, store, on_event=on_event)
    verdict.restore_run_id = restore.run_id
    verdict.box_proven = restore.status == "passed" and restore.final.healthy is True
    return verdict
