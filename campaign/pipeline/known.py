"""The known-failure policy: a spec a stored run saw fail deterministically on this host is skipped, not run again.

The skip is an attempt of its own (``known_failure`` names the stored run, the note its kind and fingerprint);
``--retry-known`` runs such variants anyway.
"""

from __future__ import annotations

from campaign.config import PlannedVariant
from campaign.pipeline.events import Event
from campaign.pipeline.state import RunState
from campaign.records import Attempt
from campaign.redaction import mask_spec
from campaign.retry import failure_class
from campaign.store import now_iso


def known_failure(state: RunState, pv: PlannedVariant) -> bool:
    """Skip ``pv`` when a stored run saw its exact spec fail deterministically on this host (unless retry_known)."""
    if state.retry_known:
        return False
    spec_hash = pv.spec.spec_hash()
    stored = next(
        (
            f
            for f in state.store.stored_failures(state.host.name, spec_hash, exclude_run=state.report.run_id)
            if failure_class(f.kind, f.failed_phase) == "deterministic"
        ),
        None,
    )
    if stored is None:
        return False
    note = (
        f"known failure: this spec failed with {stored.kind or 'unknown'} in {stored.failed_phase} in run "
        f"{stored.ref} (fingerprint {stored.fingerprint}); skipped, --retry-known runs it again"
    )
    att = Attempt(
        index=state.next_index(),
        variant=pv.name,
        role="variant",
        host=state.host.name,
        knobs=dict(pv.knobs),
        spec=mask_spec(pv.spec),
        spec_hash=spec_hash,
        started_at=now_iso(),
        ended_at=now_iso(),
        note=note,
        known_failure=stored.ref,
    )
    state.report.attempts.append(att)
    state.save()
    state.emit(Event("attempt_start", att.index, pv.name, att.role, text="variant"))
    state.emit(Event("attempt_end", att.index, pv.name, att.role, text="skipped", record=att))
    state.emit(Event("note", att.index, pv.name, att.role, text=f"{pv.name}: {note}"))
    return True
