"""The pipeline: for each variant stop → launch → ready → smoke → bench → record; on failure diagnose → restore.

``Campaign.run()`` holds the host's lock for the whole run and returns the ``RunReport``; it never prints. Progress
goes out as ``Event`` values to the callback the CLI gives (the console draws them). Every attempt is written to the
store when it ends, so a crash of the CLI loses at most the attempt in flight.

Policies, in order of importance:
- A variant that passes readiness + smoke (+ bench gates) becomes the host's known-good; isolation attempts never
  do (they are experiments about a failure, not candidates).
- After any failed attempt the box goes back to the known-good, which is proven again (readiness + smoke); a
  restore that fails ends the run (exit 3): continuing on a box in an unknown state would measure nothing.
- With ``isolate``, a failed variant triggers the extra attempts ``attribution.plan_isolation`` asks for before
  the restore, and ``attribution.attribute`` explains the failures over all attempts at the end.
"""

from __future__ import annotations

import shlex
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from campaign.attribution import attribute, plan_isolation
from campaign.config import Loaded, PlannedVariant, VariantConfig, is_secret, masked_spec, plan, render
from campaign.diagnose import diagnose
from campaign.errors import BenchError, CampaignError, DirtyHost, RestoreFailed
from campaign.hosts.base import Host
from campaign.lock import HostLock
from campaign.readiness import clock_offset, health_status, wait_ready
from campaign.records import Attempt, Final, LaunchSpec, Restore, Role, RunReport, Timings
from campaign.server import Running, ServerControl
from campaign.smoke import run_smoke
from campaign.store import KnownGood, Store, now_iso

EventKind = Literal[
    "run_start",
    "attempt_start",
    "stopped",
    "launched",
    "phase",
    "line",
    "ready",
    "smoke",
    "bench",
    "bench_progress",
    "attempt_end",
    "restore_start",
    "restore_end",
    "isolation",
    "note",
    "run_end",
]


@dataclass(frozen=True)
class Event:
    """One thing that happened during a run, for the live display. ``text`` is already free of secrets."""

    kind: EventKind
    attempt: int | None = None
    variant: str | None = None
    role: Role | None = None
    text: str = ""
    record: Attempt | None = None
    payload: Any = None


EventSink = Callable[[Event], None]


class Redactor:
    """Replaces secret env values (names matching TOKEN, KEY, SECRET, PASSWORD) with ``***`` in text we keep or show."""

    def __init__(self, specs: list[LaunchSpec]) -> None:
        values = {v for s in specs for k, v in s.env.items() if is_secret(k) and len(v) >= 4}
        self._values = sorted(values, key=len, reverse=True)

    def __call__(self, text: str) -> str:
        """``text`` with every secret value masked."""
        for v in self._values:
            text = text.replace(v, "***")
        return text

    def bytes(self, data: bytes) -> bytes:
        """``data`` with every secret value masked."""
        for v in self._values:
            data = data.replace(v.encode(), b"***")
        return data


class Campaign:
    """One run of an experiment on a host."""

    def __init__(
        self,
        loaded: Loaded,
        host: Host,
        store: Store,
        *,
        only: tuple[str, ...] = (),
        isolate: bool | None = None,
        on_event: EventSink | None = None,
    ) -> None:
        self.loaded = loaded
        self.exp = loaded.experiment
        self.host = host
        self.store = store
        self.planned = plan(self.exp, loaded.recipe, only)
        self.isolate = self.exp.isolate if isolate is None else isolate
        self.emit: EventSink = on_event or (lambda _e: None)
        self.control = ServerControl(host, self.exp.host.workdir)
        known = store.known_good(host.name)
        self.redact = Redactor([p.spec for p in self.planned] + ([known.spec] if known else []))
        self.bench_settings = self.exp.bench_settings()
        self.baseline_bench: dict[str, Any] | None = None
        self._offset = 0.0
        # The baseline's knobs as rendered (recipe defaults such as the port filled in), whether or not it runs.
        self.baseline_knobs = render(loaded.recipe, self.exp.baseline, self.exp.baseline, self._vars()).knobs
        self.report = RunReport(
            run_id=store.new_run_id(self.exp.name),
            experiment=self.exp.name,
            config_path=str(loaded.path),
            host=host.name,
            recipe=loaded.recipe.name,
            started_at=now_iso(),
        )

    # -- the run ------------------------------------------------------------------------------------

    def run(self, *, restore_only: bool = False) -> RunReport:
        """Run every planned variant (or, with ``restore_only``, only prove the known-good); returns the report."""
        import yaml

        if restore_only and self.store.known_good(self.host.name) is None:
            # Nothing to restore: say so before taking the lock or recording a run.
            raise RestoreFailed(
                f"no known-good configuration is recorded for {self.host.name}",
                hint="run an experiment whose baseline passes first; it becomes the known-good",
            )
        report = self.report
        self.store.save_text(report.run_id, "experiment.yaml", yaml.safe_dump(self._masked_resolved(), sort_keys=False))
        lock = HostLock(self.host, self.control.workdir, report.run_id, self.exp.name)
        lock.acquire()
        try:
            self._offset = clock_offset(self.host)
            report.environment = self._environment()
            self.store.save_report(report)
            self.emit(Event("run_start", text=f"run {report.run_id} on {self.host.name}"))
            if restore_only:
                self._restore_only()
            else:
                self._run_variants()
                if report.status == "running":
                    self._leave()
        except DirtyHost as e:
            report.status = "restore_failed"
            report.final = Final(healthy=False, detail=str(e))
            raise
        except CampaignError as e:
            report.status = "aborted"
            report.final = Final(healthy=False, detail=str(e))
            raise
        except KeyboardInterrupt:
            report.status = "aborted"
            report.final = Final(healthy=False, detail="interrupted")
            raise
        finally:
            report.ended_at = now_iso()
            if report.status == "running":
                failed = any(a.outcome == "failed" for a in report.attempts if a.role != "restore")
                report.status = "failed" if failed else "passed"
            self._attribute()
            for finding in report.attribution:
                self.emit(Event("note", text=f"attribution: {finding.get('statement', finding)}"))
            self.store.save_report(report)
            lock.release()
            self.emit(Event("run_end", text=report.status))
        return report

    def _run_variants(self) -> None:
        tried: list[dict[str, Any]] = []
        for pv in self.planned:
            att = self._attempt(pv, "variant")
            tried.append(dict(pv.knobs))
            if att.outcome == "passed":
                self._prove(pv, att)
                continue
            if self.isolate:
                self._isolate(pv, tried)
            restore = self._restore(att)
            if restore.outcome == "failed":
                self.report.status = "restore_failed"
                self.report.final = Final(healthy=False, detail=restore.detail)
                return

    def _prove(self, pv: PlannedVariant, att: Attempt) -> None:
        """A passing variant becomes the known-good (and the baseline's bench the reference of gates)."""
        self.store.set_known_good(self.host.name, pv.name, pv.spec, self.report.run_id, att.index)
        if pv.name == self.exp.baseline.name and att.bench is not None:
            self.baseline_bench = att.bench

    def _isolate(self, pv: PlannedVariant, tried: list[dict[str, Any]]) -> None:
        """Run the one-knob-back-to-baseline attempts that localise the failure of ``pv``."""
        baseline = self.baseline_knobs
        extra = plan_isolation(pv.knobs, baseline, tried)
        if not extra:
            return
        self.emit(Event("isolation", variant=pv.name, text=f"{len(extra)} isolation attempt(s) for {pv.name}"))
        for knobs in extra:
            changed = [f"{k}={_show(v)}" for k, v in knobs.items() if pv.knobs.get(k) != v]
            name = f"{pv.name}~{'~'.join(changed) or 'same'}"
            # Raw args and env of the failed variant stay: only the knob under test moves.
            raw = pv.config
            variant = VariantConfig(
                name=_safe_name(name),
                knobs=knobs,
                args=raw.args if raw is not None else [],
                env=raw.env if raw is not None else {},
            )
            ipv = render(self.loaded.recipe, variant, self.exp.baseline, self._vars())
            tried.append(dict(knobs))
            self._attempt(ipv, "isolation")

    def _restore(self, failed: Attempt) -> Restore:
        """Relaunch the host's known-good and prove it; record the outcome on ``failed`` and in the report."""
        known = self.store.known_good(self.host.name)
        if known is None:
            try:
                self.control.stop(None, grace_s=self.exp.timeouts.stop_grace_s)
            except DirtyHost as e:
                detail = str(e)
            else:
                detail = "no known-good configuration exists for this host yet; the failed server was stopped"
            restore = Restore(outcome="failed", detail=detail)
        else:
            self.emit(Event("restore_start", variant=known.variant, text=f"restoring {known.variant}"))
            restore = self._relaunch(known)
        failed.restore = restore
        self.report.restores.append(restore.model_copy(update={"attempt": failed.index}))
        self.store.save_report(self.report)
        self.emit(Event("restore_end", variant=restore.variant, text=f"restore {restore.outcome}: {restore.detail}"))
        return restore

    def _leave(self) -> None:
        """Apply ``at_end``: keep the known-good running (default), stop everything, or leave the last server."""
        policy = self.exp.at_end
        known = self.store.known_good(self.host.name)
        current = self.control.current()
        if policy == "stop":
            self.control.stop(None, grace_s=self.exp.timeouts.stop_grace_s)
            self.report.final = Final(detail="stopped (at_end: stop)", healthy=True)
            return
        if policy == "known_good" and known is not None:
            alive = current is not None and self.control.alive(current.pgid)
            if current is None or current.spec_hash != known.spec_hash or not alive:
                self.emit(Event("note", text=f"at_end: bringing back the known-good {known.variant}"))
                self._relaunch(known)
        current = self.control.current()
        if current is None:
            self.report.final = Final(healthy=False, detail="nothing is running")
            return
        healthy = self.control.alive(current.pgid) and (
            health_status(self.host.url(current.port), self.loaded.recipe.health_path) == 200
        )
        self.report.final = Final(variant=current.variant, spec_hash=current.spec_hash, healthy=healthy)

    def _relaunch(self, known: KnownGood) -> Restore:
        """Launch the known-good's exact spec and prove it (readiness + smoke, no bench)."""
        pv = PlannedVariant(name=known.variant, knobs={}, spec=known.spec)
        deadline = self.exp.timeouts.restore_ready_s or self.exp.timeouts.ready_s
        att = self._attempt(pv, "restore", ready_deadline=deadline, bench=False)
        ok = att.outcome == "passed"
        return Restore(
            outcome="restored" if ok else "failed",
            variant=known.variant,
            spec_hash=known.spec_hash,
            attempt=att.index,
            detail=(
                f"{known.variant} relaunched and proven (ready, smoke {att.smoke.passed if att.smoke else 0} right)"
                if ok
                else f"the known-good {known.variant} did not come back: {att.note or att.failed_phase}"
            ),
        )

    def _restore_only(self) -> None:
        """`campaign restore`: the known-good relaunched and proven is the whole run."""
        known = self.store.known_good(self.host.name)
        if known is None:
            raise RestoreFailed(f"the known-good record of {self.host.name} disappeared during the run")
        restore = self._relaunch(known)
        self.report.restores.append(restore)
        ok = restore.outcome == "restored"
        self.report.status = "passed" if ok else "restore_failed"
        self.report.final = Final(
            variant=known.variant, spec_hash=known.spec_hash, healthy=ok, detail=None if ok else restore.detail
        )

    # -- one attempt ------------------------------------------------------------------------------------

    def _attempt(
        self, pv: PlannedVariant, role: Role, *, ready_deadline: float | None = None, bench: bool = True
    ) -> Attempt:
        """Stop what runs, launch ``pv``, wait for readiness, smoke, bench; diagnose a failure; store the attempt."""
        exp = self.exp
        index = len(self.report.attempts)
        att = Attempt(
            index=index,
            variant=pv.name,
            role=role,
            knobs=dict(pv.knobs),
            spec=masked_spec(pv.spec),
            spec_hash=pv.spec.spec_hash(),
            started_at=now_iso(),
        )
        self.report.attempts.append(att)
        self.emit(Event("attempt_start", index, pv.name, role, text=role))
        timings = Timings()
        t0 = time.monotonic()
        stop = self.control.stop(None, grace_s=exp.timeouts.stop_grace_s)
        timings.stop_s = round(time.monotonic() - t0, 3)
        if stop.stopped:
            self.emit(Event("stopped", index, pv.name, role, text=stop.detail))
        remote_dir = self.control.prepare(self.report.run_id, index, pv.name)
        att.remote_dir = remote_dir
        header = f"campaign: {exp.name} run {self.report.run_id} attempt {index} ({pv.name}), spec {att.spec_hash}"
        running = self.control.launch(
            pv.spec, remote_dir, run_id=self.report.run_id, attempt=index, variant=pv.name, header=header
        )
        att.pid, att.pgid = running.pid, running.pgid
        self.emit(Event("launched", index, pv.name, role, text=f"pid {running.pid}, pgid {running.pgid}"))

        def on_line(_n: int, text: str) -> None:
            self.emit(Event("line", index, pv.name, role, text=self.redact(text)))

        def on_phase(name: str) -> None:
            self.emit(Event("phase", index, pv.name, role, text=name))

        ready = wait_ready(
            self.control,
            running,
            pv.spec,
            deadline_s=ready_deadline or exp.timeouts.ready_s,
            poll_s=exp.timeouts.poll_s,
            offset_s=self._offset,
            on_line=on_line,
            on_phase=on_phase,
        )
        att.phases = ready.phases
        att.exit_code = ready.exit_code
        timings.launch_to_ready_s = ready.launch_to_ready_s
        timings.ready_detect_lag_s = ready.ready_detect_lag_s
        timings.death_detect_lag_s = ready.death_detect_lag_s
        failed_phase: str | None = None
        if not ready.ready:
            failed_phase = ready.phase
            att.note = ready.detail
        else:
            self.emit(Event("ready", index, pv.name, role, text=f"ready in {ready.launch_to_ready_s:.2f} s"))
            failed_phase = self._check(pv, att, timings, running, bench and role != "restore")
        att.timings = timings
        att.failed_phase = failed_phase
        att.outcome = "failed" if failed_phase else "passed"
        log = self.redact.bytes(self.host.read_file(running.log_path))
        att.log_file = self.store.save_log(self.report.run_id, index, pv.name, log)
        if failed_phase:
            att.diagnosis = diagnose(
                log.decode(errors="replace"),
                exit_code=ready.exit_code,
                phase=failed_phase,
                timings=timings,
                server=pv.spec.recipe,
                smoke=att.smoke,
                timed_out=ready.timed_out,
            )
            if att.note is None:
                att.note = att.diagnosis.summary
            # A failed server is stopped at once, whatever comes next: the box is never left on it.
            self.control.stop(running, grace_s=exp.timeouts.stop_grace_s)
        att.ended_at = now_iso()
        self.store.save_report(self.report)
        self.emit(Event("attempt_end", index, pv.name, role, text=att.outcome, record=att))
        return att

    def _check(self, pv: PlannedVariant, att: Attempt, timings: Timings, running: Running, bench: bool) -> str | None:
        """Smoke, then bench and gates; returns the failed phase or None."""
        exp = self.exp
        base_url = self.host.url(running.port)
        if exp.smoke.enabled:
            t = time.monotonic()
            smoke = run_smoke(
                base_url,
                n=exp.smoke.questions,
                seed=exp.smoke.seed,
                max_tokens=exp.smoke.max_tokens,
                timeout_s=exp.smoke.timeout_s,
            )
            timings.smoke_s = round(time.monotonic() - t, 3)
            att.smoke = smoke
            self.emit(Event("smoke", att.index, pv.name, att.role, text=f"smoke {smoke.passed}/{smoke.total}"))
            if not smoke.ok:
                att.note = f"smoke: {smoke.passed}/{smoke.total} answers right"
                return "smoke"
        settings = self.bench_settings
        if bench and settings is not None:
            from campaign.bench import BenchResult, run_bench
            from campaign.gates import check_gates

            t = time.monotonic()

            def progress(ev: Any) -> None:
                self.emit(Event("bench_progress", att.index, pv.name, att.role, payload=ev))

            try:
                result = run_bench(base_url, settings, progress=progress)
            except BenchError as e:
                att.note = f"bench could not run: {e}"
                timings.bench_s = round(time.monotonic() - t, 3)
                return "bench"
            timings.bench_s = round(time.monotonic() - t, 3)
            att.bench = result.model_dump(mode="json")
            self.emit(Event("bench", att.index, pv.name, att.role, payload=result))
            if not result.passed:
                att.note = "bench: a level's error rate passed max_error_rate"
                return "bench"
            baseline = BenchResult.model_validate(self.baseline_bench) if self.baseline_bench else None
            if settings.gates and att.role == "variant" and pv.name != exp.baseline.name:
                att.gates = check_gates(result, baseline, settings.gates)
                failed = [g for g in att.gates if not g.passed]
                if failed:
                    att.note = "gate failed: " + "; ".join(g.detail for g in failed)
                    return "gates"
        return None

    def _vars(self) -> dict[str, str]:
        tmpl_vars = dict(self.exp.vars)
        if self.exp.host.kind == "local":
            tmpl_vars.setdefault("python", sys.executable)
        return tmpl_vars

    # -- report extras ------------------------------------------------------------------------------------

    def _attribute(self) -> None:
        if not (self.exp.matrix is not None or self.isolate):
            return
        if not any(a.outcome == "failed" for a in self.report.attempts if a.role != "restore"):
            return
        baseline = self.baseline_knobs
        try:
            findings = attribute(self.report.attempts, baseline)
        except Exception as e:  # attribution is an explanation; a bug there must not lose the run's report
            self.report.attribution = [{"status": "error", "statement": f"attribution failed: {e!r}"}]
            return
        self.report.attribution = [f.model_dump(mode="json") for f in findings]

    def _environment(self) -> dict[str, Any]:
        """Host facts that make runs comparable: OS, Python, GPU and driver, campaign version."""
        from campaign import __version__

        res = self.host.run(
            "uname -srm; python3 -c 'import platform; print(platform.python_version())' 2>/dev/null || echo -; "
            "(command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi --query-gpu=name,driver_version "
            "--format=csv,noheader | head -1) || echo none",
            timeout=30,
        )
        lines = [*res.stdout.strip().splitlines(), "", "", ""]
        gpu, _, driver = lines[2].partition(",")
        probes: dict[str, str | None] = {}
        tmpl_vars = {**self.loaded.recipe.vars, **self._vars()}
        for name, template in self.loaded.recipe.probes.items():
            try:
                cmd = " ".join(shlex.quote(part.format(**tmpl_vars)) for part in template)
            except (KeyError, IndexError, ValueError):
                probes[name] = None
                continue
            # A probe that fails or hangs costs the run nothing but its figure.
            try:
                out = self.host.run(cmd + " 2>/dev/null", timeout=60)
            except CampaignError:
                probes[name] = None
                continue
            tail = out.stdout.strip().splitlines()
            probes[name] = tail[-1].strip() if out.ok and tail else None
        return {
            "host": self.host.name,
            "os": lines[0],
            "python": lines[1],
            "gpu": gpu.strip() or "none",
            "driver": driver.strip() or None,
            "campaign_version": __version__,
            "recipe": self.loaded.recipe.name,
            "clock_offset_s": round(self._offset, 4),
            **probes,
        }

    def _masked_resolved(self) -> dict[str, Any]:
        def walk(node: Any, key: str = "") -> Any:
            if isinstance(node, dict):
                return {k: walk(v, str(k)) for k, v in node.items()}
            if isinstance(node, list):
                return [walk(v, key) for v in node]
            if isinstance(node, str) and key and is_secret(key):
                return "***"
            return node

        out: dict[str, Any] = walk(self.loaded.resolved)
        return out


def _show(v: Any) -> str:
    if isinstance(v, bool):
        return "on" if v else "off"
    return str(v)


def _safe_name(name: str) -> str:
    return "".join(c if c.isalnum() or c in "._=,+-~" else "_" for c in name)[:120]


def restore_now(loaded: Loaded, host: Host, store: Store, *, on_event: EventSink | None = None) -> RunReport:
    """`campaign restore`: relaunch the host's known-good and prove it, recorded as a run of its own."""
    return Campaign(loaded, host, store, on_event=on_event).run(restore_only=True)
