"""``campaign tune``: search an experiment's ``search:`` space through the real loop, then keep a proven winner.

A tune has a folder in the run store, ``runs/<tune-id>/``: ``tune.json`` (the ``TuneReport``, written after every
trial), ``optuna.journal`` (the ``bayes`` study, Optuna's JournalStorage file) and ``tune.png`` (the figure). The
trials are runs of their own in the same store. ``--resume`` reopens the newest unfinished tune of the experiment:
the finished trials stand (none is run again), the study is the same, the trial a signal cut short is tried again.

Signals: inside a trial the loop's own handling applies (the trial's server stopped, the known-good put back, the
run recorded ``interrupted``); between trials a signal ends the tune the same way. Either way ``tune.json`` says
``interrupted`` and the exit code is the shell's 128 + N.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable

from campaign.config import Loaded, duration_s
from campaign.errors import StoreError, UsageError
from campaign.hosts.base import Host
from campaign.interruption import Interrupted, Interruption
from campaign.pipeline import EventSink
from campaign.records.tune import TuneReport
from campaign.store import Store, now_iso
from campaign.tune.figure import draw
from campaign.tune.finale import finish
from campaign.tune.search import Progress, Search
from campaign.tune.space import SearchConfig, Space, load_search
from campaign.tune.strategies import make_strategy
from campaign.tune.trials import LoopTrials

TUNE_FILE = "tune.json"
JOURNAL_FILE = "optuna.journal"
FIGURE_FILE = "tune.png"


def parse_budget(text: str) -> tuple[int | None, float | None]:
    """``--budget``: a number of trials (``16``) or a wall time (``90s``, ``30m``, ``2h``)."""
    t = text.strip()
    if t.isdigit() and int(t) > 0:
        return int(t), None
    try:
        return None, duration_s(t)
    except ValueError:
        raise UsageError(f"--budget {text!r}: give trials (16) or a time (30m, 2h)") from None


def _save(store: Store, report: TuneReport) -> None:
    store.save_text(report.tune_id, TUNE_FILE, report.model_dump_json(indent=2))


def find_tune(store: Store, experiment: str, ref: str) -> TuneReport:
    """The tune ``ref`` names (``last``: the experiment's newest unfinished one)."""
    root = store.root
    folders = sorted((p for p in root.glob("*") if (p / TUNE_FILE).is_file()), reverse=True) if root.is_dir() else []
    for folder in folders:
        if ref != "last" and not folder.name.startswith(ref):
            continue
        try:
            report = TuneReport.model_validate(json.loads((folder / TUNE_FILE).read_text()))
        except (OSError, ValueError) as e:
            raise StoreError(f"{folder / TUNE_FILE} is unreadable: {e}") from e
        if report.experiment != experiment:
            continue
        if ref == "last" and report.status == "finished":
            continue
        return report
    raise UsageError(
        f"no unfinished tune of {experiment} to resume" if ref == "last" else f"no tune {ref!r} of {experiment}",
        hint="start one without --resume",
    )


def tune(
    loaded: Loaded,
    host: Host,
    store: Store,
    *,
    strategy: str = "tiered",
    budget: str | None = None,
    resume: str | None = None,
    on_event: EventSink | None = None,
    on_progress: Callable[[Progress], None] | None = None,
) -> TuneReport:
    """Run the tune; returns its report (also in ``runs/<tune-id>/tune.json``)."""
    search: SearchConfig = load_search(loaded)
    if budget is not None:
        trials, seconds = parse_budget(budget)
        search.budget.trials = trials if trials is not None else search.budget.trials
        search.budget.time = seconds if seconds is not None else search.budget.time
    exp = loaded.experiment
    space = Space(search, exp.baseline.knobs)
    if resume is not None:
        report = find_tune(store, exp.name, resume)
        if report.strategy != strategy:
            strategy = report.strategy
        report.trials = [t for t in report.trials if t.outcome != "interrupted"]
        report.status, report.stopped_because, report.ended_at = "running", None, None
        report.resumes += 1
    else:
        report = TuneReport(
            tune_id=store.new_run_id(exp.name).replace(f"-{exp.name}-", f"-{exp.name}-tune-", 1),
            experiment=exp.name,
            config_path=str(loaded.path),
            strategy=strategy,  # type: ignore[arg-type]
            objective=search.objective.label,
            higher_is_better=search.objective.higher_is_better,
            space_size=space.size(),
            started_at=now_iso(),
            baseline=space.baseline,
        )
    report.budget_trials, report.budget_s = search.budget.trials, search.budget.time
    folder = store.run_dir(report.tune_id)
    _save(store, report)
    limits = [x for x in (search.budget.time, exp.deadline) if x is not None]
    ends_at = time.monotonic() + min(limits) if limits else None
    evaluate = LoopTrials(loaded, host, store, search, space.baseline, on_event=on_event)

    def progress(p: Progress) -> None:
        _save(store, report)
        if on_progress is not None:
            on_progress(p)

    try:
        with Interruption():
            strat = make_strategy(
                strategy,
                journal=folder / JOURNAL_FILE,
                seed=search.seed,
                higher_is_better=search.objective.higher_is_better,
            )
            Search(search, space, strat, report, evaluate, ends_at=ends_at, on_progress=progress).run()
            if report.trials and report.trials[-1].outcome == "interrupted":
                report.status = "interrupted"
            else:
                report.final = finish(loaded, host, store, search, report, space.baseline, on_event)
                report.status = (
                    "interrupted"
                    if report.final.run_id
                    and not report.final.box_proven
                    and (report.final.detail.startswith("interrupted"))
                    else "finished"
                )
    except Interrupted as e:
        report.status = "interrupted"
        report.stopped_because = f"interrupted by {e.name} between trials"
    finally:
        report.ended_at = now_iso()
        if report.status == "running":
            report.status = "aborted"
        figure = draw(report, folder / FIGURE_FILE)
        report.plot_file = FIGURE_FILE if figure is not None else None
        _save(store, report)
    return report
