"""One attempt: stop → port → launch → ready → verify → smoke → bench → log → diagnose, each stage named and timed.

``run_attempt`` is the whole of it. Each stage is a method of ``AttemptRun``; ``stage`` times the ones the report
keeps a duration for (``Timings.stop_s``, ``smoke_s``, ``bench_s``) and ``attempt_s`` covers the whole. The
attempt's record is in the report from its start and filled in as each stage ends: one cut short (a signal, an
error) keeps what was measured, and ``interrupted.close_in_flight`` dates its end.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Literal

from campaign.bench import run_bench
from campaign.config import PlannedVariant
from campaign.diagnose import diagnose
from campaign.diagnosis.signatures import signatures
from campaign.effective import verify
from campaign.errors import BenchError
from campaign.fingerprint import fingerprint
from campaign.gates import check_gates
from campaign.interruption import checkpoint
from campaign.pipeline.events import Event
from campaign.pipeline.state import RunState
from campaign.profile import ProfileTarget, profile_level
from campaign.readiness import Readiness, log_copy, wait_ready
from campaign.records import (
    Attempt,
    BenchEvent,
    BenchSettings,
    Diagnosis,
    ProfileResult,
    ProfileSettings,
    Role,
    StopReport,
)
from campaign.redaction import mask_spec
from campaign.server import Running
from campaign.smoke import burst_max, run_smoke
from campaign.store import now_iso

#: The stages whose duration the report keeps (``Timings.<name>_s``).
Timed = Literal["stop", "smoke", "bench"]


def run_attempt(
    state: RunState,
    pv: PlannedVariant,
    role: Role,
    *,
    ready_deadline: float | None = None,
    bench: bool = True,
    launch: int = 0,
) -> Attempt:
    """Stop what runs, launch ``pv``, wait for readiness, smoke, bench; diagnose a failure; store the attempt."""
    return AttemptRun(state, pv, role, launch=launch).run(ready_deadline=ready_deadline, bench=bench)


class AttemptRun:
    """The stages of one attempt over the run's state; ``att`` is its record, in the report from the start."""

    def __init__(self, state: RunState, pv: PlannedVariant, role: Role, *, launch: int = 0) -> None:
        self.state = state
        self.pv = pv
        self.att = Attempt(
            index=state.next_index(),
            variant=pv.name,
            role=role,
            host=state.host.name,
            launch=launch,
            knobs=dict(pv.knobs),
            spec=mask_spec(pv.spec),
            spec_hash=pv.spec.spec_hash(),
            started_at=now_iso(),
        )
        #: The log lines readiness saw (what ``verify`` reads the knobs in force from).
        self.seen: list[tuple[int, str]] = []

    def emit(self, kind: Literal["stopped", "launched", "line", "phase", "ready", "smoke", "note"], text: str) -> None:
        """An event of this attempt."""
        att = self.att
        self.state.emit(Event(kind, att.index, att.variant, att.role, text=text))

    @contextmanager
    def stage(self, name: Timed) -> Iterator[None]:
        """Time the stage ``name`` into the attempt's ``Timings`` when it ends (a stage cut short keeps none)."""
        t = time.monotonic()
        yield
        setattr(self.att.timings, f"{name}_s", round(time.monotonic() - t, 3))

    def run(self, *, ready_deadline: float | None, bench: bool) -> Attempt:
        """The stages in order; returns the attempt, stored, its outcome set."""
        state, att = self.state, self.att
        state.report.attempts.append(att)
        state.emit(Event("attempt_start", att.index, att.variant, att.role, text=att.role))
        t0 = state.attempt_t0[att.index] = time.monotonic()
        stop = self.stop()
        checkpoint()
        if stop.stopped:
            self.emit("stopped", stop.detail)
        holders = state.control.port_holders(self.pv.spec.port)
        if holders.listening:
            att.timings.attempt_s = round(time.monotonic() - t0, 3)
            return self.port_taken(holders.describe())
        running = self.launch()
        ready = self.ready(running, ready_deadline)
        checkpoint()
        failed_phase: str | None = None
        if not ready.ready:
            failed_phase = ready.phase
            att.note = ready.detail
        else:
            self.emit("ready", f"ready in {ready.launch_to_ready_s:.2f} s")
            failed_phase = self.verify() or self.check(running, bench and att.role != "restore")
        att.failed_phase = failed_phase
        att.outcome = "failed" if failed_phase else "passed"
        log = self.keep_log(running)
        if failed_phase:
            self.diagnose(running, ready, log, failed_phase)
        att.ended_at = now_iso()
        att.timings.attempt_s = round(time.monotonic() - t0, 3)
        state.save()
        state.emit(Event("attempt_end", att.index, att.variant, att.role, text=att.outcome, record=att))
        return att

    def stop(self) -> StopReport:
        """Whatever runs is stopped (and the box checked clean) before the launch."""
        state = self.state
        with self.stage("stop"):
            return state.control.stop(None, grace_s=state.exp.timeouts.stop_grace_s)

    def port_taken(self, holders: str) -> Attempt:
        """The variant's port is held by a process campaign did not start: fail it without touching that process."""
        state, att, pv = self.state, self.att, self.pv
        summary = f"{holders}, a process campaign did not start; it was left alone and {pv.name} was not launched"
        diagnosis = Diagnosis(
            kind="port_in_use",
            confidence=1.0,
            hint=f"stop that process yourself, or give {pv.name} another port (knobs: port)",
            summary=summary,
            fingerprint=fingerprint("port_in_use", [f"port {pv.spec.port} held by another process"]),
        )
        att.outcome = "failed"
        att.failed_phase = "launch"
        att.note = diagnosis.summary
        att.diagnosis = diagnosis
        att.ended_at = now_iso()
        state.save()
        state.emit(Event("attempt_end", att.index, pv.name, att.role, text=att.outcome, record=att))
        return att

    def launch(self) -> Running:
        """The variant launched detached, and recorded at once (a CLI that dies now leaves its attempt known)."""
        state, att, pv = self.state, self.att, self.pv
        run_id, exp = state.report.run_id, state.exp
        att.remote_dir = remote_dir = state.control.prepare(run_id, att.index, pv.name)
        header = f"campaign: {exp.name} run {run_id} attempt {att.index} ({pv.name}), spec {att.spec_hash}"
        # Launched and recorded in current.json, or neither: no checkpoint between here and the record.
        state.touched = True
        running = state.control.launch(
            pv.spec,
            remote_dir,
            run_id=run_id,
            attempt=att.index,
            variant=pv.name,
            header=header,
            experiment=exp.name,
        )
        att.pid, att.pgid = running.pid, running.pgid
        state.save()
        self.emit("launched", f"pid {running.pid}, pgid {running.pgid}")
        return running

    def ready(self, running: Running, deadline: float | None) -> Readiness:
        """Readiness: the ready marker, the health endpoint and a live group agree (or the wait ends, saying why)."""
        state, att = self.state, self.att
        timeouts = state.exp.timeouts

        def on_line(n: int, text: str) -> None:
            self.seen.append((n, text))
            self.emit("line", state.redact(text))

        ready = wait_ready(
            state.control,
            running,
            self.pv.spec,
            deadline_s=deadline or timeouts.ready_s,
            poll_s=timeouts.poll_s,
            offset_s=state.offset,
            on_line=on_line,
            on_phase=lambda name: state.emit(Event("phase", att.index, att.variant, att.role, text=name, phase=name)),
        )
        att.phases = ready.phases
        att.exit_code = ready.exit_code
        att.timings.launch_to_ready_s = ready.launch_to_ready_s
        att.timings.ready_detect_lag_s = ready.ready_detect_lag_s
        att.timings.death_detect_lag_s = ready.death_detect_lag_s
        return ready

    def verify(self) -> str | None:
        """The knobs the log states checked against the asked ones; ``config`` (the failed phase) when one is not."""
        state, att, pv = self.state, self.att, self.pv
        found = verify(state.loaded.recipe, pv.knobs, self.seen).diagnosis(pv.spec.recipe)
        if found is None:
            return None
        for e in found.evidence:
            e.text = state.redact(e.text)
        found.summary = state.redact(found.summary)
        att.diagnosis, att.note = found, found.summary
        self.emit("note", f"config not applied: {found.summary}")
        return "config"

    def check(self, running: Running, bench: bool) -> str | None:
        """Smoke, then bench and gates; returns the failed phase or None."""
        exp = self.state.exp
        if exp.smoke.enabled and not self.smoke(running):
            return "smoke"
        settings = self.state.bench_settings
        checkpoint()
        if bench and settings is not None:
            return self.bench(running, settings)
        return None

    def smoke(self, running: Running) -> bool:
        """Questions with known answers; whether they were answered right."""
        state, att = self.state, self.att
        smoke_config = state.exp.smoke
        with self.stage("smoke"):
            smoke = run_smoke(
                state.host.url(running.port),
                smoke_config,
                largest_batch=burst_max(smoke_config, self.pv.knobs),
                reference=state.smoke_reference(),
            )
        att.smoke = smoke
        self.emit("smoke", f"smoke: {smoke.summary()}")
        if not smoke.ok:
            att.note = f"smoke: {smoke.summary()}"
        return smoke.ok

    def bench(self, running: Running, settings: BenchSettings) -> str | None:
        """The bench, then the profile and the gates against the baseline's; returns the failed phase or None."""
        state, att, pv = self.state, self.att, self.pv
        exp = state.exp

        def progress(ev: BenchEvent) -> None:
            state.emit(Event("bench_progress", att.index, pv.name, att.role, progress=ev))

        error: BenchError | None = None
        with self.stage("bench"):
            try:
                result = run_bench(state.host.url(running.port), settings, progress=progress)
            except BenchError as e:
                error = e
        if error is not None:
            att.note = f"bench could not run: {error}"
            return "bench"
        att.bench = result
        state.emit(Event("bench", att.index, pv.name, att.role, bench=result))
        if not result.passed:
            att.note = (
                f"bench: SLA search: no load met {settings.sla.describe()}"
                if settings.sla is not None
                else "bench: a level's error rate passed max_error_rate"
            )
            return "bench"
        if exp.profile is not None and att.role == "variant" and att.launch == 0:
            att.profile = self.profile(running, settings, exp.profile)
        if settings.gates and att.role == "variant" and pv.name != exp.baseline.name:
            att.gates = check_gates(result, state.baseline_bench, settings.gates)
            failed = [g for g in att.gates if not g.passed]
            if failed:
                att.note = "gate failed: " + "; ".join(g.detail for g in failed)
                return "gates"
        return None

    def profile(self, running: Running, bench: BenchSettings, settings: ProfileSettings) -> ProfileResult:
        """One bench level again under the server's profiler; its traces copied into the run folder."""
        state, att = self.state, self.att
        rel = f"profiles/{att.index:02d}-{self.pv.name}"
        target = ProfileTarget(
            state.host,
            state.host.url(running.port),
            running.remote_dir,
            state.exp.name,
            state.store.run_dir(state.report.run_id) / rel,
            rel,
        )
        recipe = state.loaded.recipe
        found = profile_level(target, recipe.profile, recipe.name, settings, bench)
        self.emit("note", f"profile: {found.summary()}")
        return found

    def keep_log(self, running: Running) -> bytes:
        """The server's log, secrets masked, copied into the run folder; returns the copy."""
        state, att = self.state, self.att
        log = state.redact.bytes(log_copy(state.host, running.log_path))
        att.log_file = state.store.save_log(state.report.run_id, att.index, att.variant, log)
        return log

    def diagnose(self, running: Running, ready: Readiness, log: bytes, failed_phase: str) -> None:
        """Name the failure's cause from the log, then stop the failed server at once, whatever comes next."""
        state, att = self.state, self.att
        exit_code = ready.exit_code
        if exit_code is None and not state.control.alive(running):
            # Gone after it was ready (in smoke or bench): its exit status says it died, not that it miscomputed.
            exit_code = state.control.exit_code(running.remote_dir)
            att.exit_code = exit_code
        # A config_not_applied diagnosis is already made, from the line that states the value in force.
        att.diagnosis = att.diagnosis or diagnose(
            log.decode(errors="replace"),
            exit_code=exit_code,
            phase=failed_phase,
            timings=att.timings,
            server=self.pv.spec.recipe,
            smoke=att.smoke,
            timed_out=ready.timed_out,
            knobs=att.knobs,
            bench=att.bench,
        )
        checks = att.smoke.checks if att.smoke is not None else []
        if (
            att.diagnosis.kind == "wrong_output"
            and checks
            and all(c.verdict == "error" and "Timeout" in (c.error or "") for c in checks)
            and state.control.alive(running)
        ):
            # Alive and silent: not a numerics bug (nothing was computed). Its process state says how (stopped or not).
            how = state.control.process_state(running)
            kind = signatures().kinds["unresponsive"]
            att.diagnosis = Diagnosis(
                kind="unresponsive",
                hint=kind.hint(self.pv.spec.recipe),
                confidence=0.9,
                summary=f"{kind.title}: every smoke question timed out; process state: {how}",
            )
            att.note = att.diagnosis.summary
        if att.note is None:
            att.note = att.diagnosis.summary
        state.control.stop(running, grace_s=state.exp.timeouts.stop_grace_s)
