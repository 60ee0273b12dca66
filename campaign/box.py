"""The box: what campaign runs on a host, who holds its lock, and the commands that act on it outside a run.

``stop_box`` is `campaign stop` (under the host's lock: it never kills the server of a campaign that is running),
``box_status`` is `campaign status` (whose server runs, for which experiment; the lock's holder; any process
campaign started that no record tracks), ``doctor`` is `campaign doctor` (the store's index rebuilt from the run
folders). Each returns values; the CLI prints them. Each reconciles the runs that the lock shows dead.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Any

from campaign.config import Loaded
from campaign.hosts.base import Host
from campaign.lock import HostLock, describe_owner, host_state_dir
from campaign.processes import marked_anywhere
from campaign.readiness import health_status
from campaign.records import Healing, HostStatus, KnownGoodRef, LockHolder, ProcessRef, ServerState, StopReport
from campaign.server import ServerControl
from campaign.store import Store


@dataclass
class StopOutcome:
    """What `campaign stop` did."""

    host: str
    stop: StopReport
    reconciled: list[str] = field(default_factory=list)
    lock_taken_over: dict[str, Any] | None = None


def stop_box(loaded: Loaded, host: Host, store: Store, *, force: bool = False) -> StopOutcome:
    """Stop what campaign runs on the host and verify it is gone; refused (``LockHeld``) while a run holds the box."""
    exp = loaded.experiment
    control = ServerControl(host, exp.host.workdir, state_dir=exp.host.state_dir)
    lock = HostLock(host, None, exp.name, command="stop", state_dir=exp.host.state_dir or host_state_dir())
    lock.acquire(force=force)
    try:
        taken = {**lock.replaced, "how": lock.replaced_how} if lock.replaced is not None else None
        note = control.found_running()
        if taken is not None and taken.get("how") == "forced":
            note += f"; the lock of {describe_owner(taken)} was broken with --force"
        reconciled = store.reconcile(host.name, note)
        rep = control.stop(None, grace_s=exp.timeouts.stop_grace_s)
        if taken is not None:
            how = "broke with --force" if taken.get("how") == "forced" else "took over (its CLI was gone)"
            rep = rep.model_copy(update={"detail": f"{rep.detail}; {how} the lock of {describe_owner(taken)}"})
    finally:
        lock.release()
    return StopOutcome(host=host.name, stop=rep, reconciled=reconciled, lock_taken_over=taken)


def box_status(loaded: Loaded, host: Host, store: Store) -> HostStatus:
    """`campaign status`: what runs on the box (whose, healthy or not), the lock, the experiment's known-good."""
    exp = loaded.experiment
    control = ServerControl(host, exp.host.workdir, state_dir=exp.host.state_dir)
    cur = control.current()
    running = None
    health = None
    tracked: set[int] = set()
    if cur is not None:
        procs = control.tree(cur)
        tracked = {p.pid for p in procs}
        alive = bool(procs)
        health = health_status(host.url(cur.port), loaded.recipe.health_path) if alive else None
        running = ServerState(
            **asdict(cur),
            alive=alive,
            processes=len(procs),
            uptime_s=round(time.time() - cur.started_at, 1),
            other_experiment=bool(cur.experiment) and cur.experiment != exp.name,
        )
    untracked = [ProcessRef(pid=p.pid, command=p.command) for p in marked_anywhere(host) if p.pid not in tracked]
    owner = HostLock(host, None, exp.name, state_dir=exp.host.state_dir or host_state_dir()).owner()
    holder = None
    live_run = None
    if owner is not None:
        stale = HostLock._stale(owner)
        known = {k: owner.get(k) for k in LockHolder.model_fields if k not in {"stale", "text"}}
        holder = LockHolder.model_validate(
            {**{k: v for k, v in known.items() if v is not None}, "stale": stale, "text": describe_owner(owner)}
        )
        live_run = None if stale else owner.get("run_id")
    reconciled = store.reconcile(host.name, control.found_running(), keep=live_run)
    kg = store.known_good(host.name, exp.name)
    known_good = (
        KnownGoodRef(
            variant=kg.variant, spec_hash=kg.spec_hash, run_id=kg.run_id, attempt=kg.attempt, proven_at=kg.proven_at
        )
        if kg
        else None
    )
    return HostStatus(
        host=host.name,
        experiment=exp.name,
        running=running,
        health=health,
        lock=holder,
        untracked=untracked,
        reconciled=reconciled,
        known_good=known_good,
    )


def doctor(store: Store) -> Healing:
    """`campaign doctor`: rebuild the store's index from its run folders and prune rows without a folder."""
    return store.heal(rebuild=True)
