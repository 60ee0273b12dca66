"""Attribution findings: what a run's attempts say about each failure kind (``RunReport.attribution``)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from campaign.records.knobs import KnobValue


class Finding(BaseModel):
    """What the attempts say about one failure kind: the knobs that explain it, or the runs that would.

    ``status`` is ``error`` only when attribution itself failed; ``statement`` then says how (and ``kind`` is empty).
    """

    kind: str = ""
    status: Literal["explained", "not_enough_evidence", "error"]
    #: The knob assignment (one knob, or an interaction of several) present in every failure and in no pass.
    cause: dict[str, KnobValue] = Field(default_factory=dict)
    #: When not settled: every assignment that fits the evidence so far.
    candidates: list[dict[str, KnobValue]] = Field(default_factory=list)
    #: Knobs the failure does not depend on, with the values it was seen failing with.
    independent_of: dict[str, list[KnobValue]] = Field(default_factory=dict)
    #: One line for a person, e.g. "stream_capture_isolation iff torch_compile=on and cuda_graph=on; ...".
    statement: str
    #: Attempt indexes the conclusion rests on: the failures and the passes compared with them.
    evidence: list[int] = Field(default_factory=list)
    failed: list[int] = Field(default_factory=list)
    passed: list[int] = Field(default_factory=list)
    #: Knob assignments whose runs would settle a ``not_enough_evidence`` finding.
    settle_with: list[dict[str, KnobValue]] = Field(default_factory=list)
