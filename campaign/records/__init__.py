"""The records campaign writes and returns: one typed tree, from a launch spec up to a run report.

These pydantic models are the schema of ``runs/<run-id>/report.json`` and the values the core returns; every other
room imports them from here, and nothing here imports another room. Pure modules (diagnose, attribution, compare,
gates) read and build them; only ``store`` writes them to disk.

    RunReport                         report.py
    ├── attempts: [Attempt]
    │   ├── spec: LaunchSpec
    │   ├── phases, timings, smoke: SmokeResult, diagnosis: Diagnosis, restore: Restore
    │   ├── bench: BenchResult        benchmark.py (settings: BenchSettings with gates: [Gate]; levels: [LevelResult])
    │   ├── profile: ProfileResult    profile.py (classes: [ClassTime]; settings: ProfileSettings, ProfileEndpoints)
    │   └── gates: [GateResult]
    ├── restores: [Restore], final: Final, hosts: [HostRun] (a fleet's parts)
    ├── attribution: [Finding]        findings.py
    └── environment: Environment

    RunPlan, RunSummary, HostStatus,  documents.py: what commands print with --json
    StopReport, RunRow, FailureGroup,
    Healing, ErrorDocument

Format history (``SCHEMA_VERSION``, written as ``RunReport.schema_version``; ``BenchResult.schema_version`` has its
own, ``RESULT_SCHEMA_VERSION``):

- 1: the first stored layout. Reading a report of version 1 needs nothing special: the typed ``bench``,
  ``attribution`` and ``environment`` read the same JSON the earlier untyped dicts held
  (``tests/data/reports/schema1-bench-isolate.json`` holds one written before the typing). Fields added
  since (all optional: smoke verdicts and comparisons) read as their defaults.

A change that renames or removes a field bumps ``SCHEMA_VERSION`` and adds a reader for the older layout to
``store``; adding an optional field does not.
"""

from campaign.records.benchmark import (
    RESULT_SCHEMA_VERSION,
    BenchEvent,
    BenchResult,
    BenchSettings,
    Gate,
    LevelResult,
    Load,
    RepeatSample,
    RequestRow,
    SlaResult,
    SlaSettings,
    SlaTrial,
)
from campaign.records.documents import (
    AttemptSummary,
    DiagnosisSummary,
    ErrorDocument,
    FailureGroup,
    FlagsChecked,
    FlagsUnchecked,
    Healing,
    HostStatus,
    KnownGoodRef,
    LockHolder,
    PlanEntry,
    PlanEstimate,
    ProcessRef,
    RestoreSummary,
    RunPlan,
    RunRow,
    RunSummary,
    ServerState,
    SmokeCount,
    StopReport,
    VariantCost,
)
from campaign.records.findings import Finding
from campaign.records.knobs import KnobValue, show_value
from campaign.records.metrics import (
    METRICS,
    PLOTTED_METRICS,
    SHOWN_METRICS,
    SLA_METRICS,
    TABLE,
    LatencyStats,
    Metric,
    percentile,
    unit_of,
)
from campaign.records.profile import (
    KERNEL_CLASSES,
    ClassTime,
    KernelTime,
    ProfileCall,
    ProfileEndpoints,
    ProfileResult,
    ProfileSettings,
)
from campaign.records.report import (
    SCHEMA_VERSION,
    Attempt,
    Diagnosis,
    Environment,
    Evidence,
    Final,
    GateResult,
    HostRun,
    LaunchSpec,
    Outcome,
    PhaseMark,
    Restore,
    Resume,
    Role,
    RunReport,
    RunStatus,
    SmokeCheck,
    SmokeComparison,
    SmokeResult,
    SmokeVerdict,
    Timings,
)

__all__ = [
    "KERNEL_CLASSES",
    "METRICS",
    "PLOTTED_METRICS",
    "RESULT_SCHEMA_VERSION",
    "SCHEMA_VERSION",
    "SHOWN_METRICS",
    "SLA_METRICS",
    "TABLE",
    "Attempt",
    "AttemptSummary",
    "BenchEvent",
    "BenchResult",
    "BenchSettings",
    "ClassTime",
    "Diagnosis",
    "DiagnosisSummary",
    "Environment",
    "ErrorDocument",
    "Evidence",
    "FailureGroup",
    "Final",
    "Finding",
    "FlagsChecked",
    "FlagsUnchecked",
    "Gate",
    "GateResult",
    "Healing",
    "HostRun",
    "HostStatus",
    "KernelTime",
    "KnobValue",
    "KnownGoodRef",
    "LatencyStats",
    "LaunchSpec",
    "LevelResult",
    "Load",
    "LockHolder",
    "Metric",
    "Outcome",
    "PhaseMark",
    "PlanEntry",
    "PlanEstimate",
    "ProcessRef",
    "ProfileCall",
    "ProfileEndpoints",
    "ProfileResult",
    "ProfileSettings",
    "RepeatSample",
    "RequestRow",
    "Restore",
    "RestoreSummary",
    "Resume",
    "Role",
    "RunPlan",
    "RunReport",
    "RunRow",
    "RunStatus",
    "RunSummary",
    "ServerState",
    "SlaResult",
    "SlaSettings",
    "SlaTrial",
    "SmokeCheck",
    "SmokeComparison",
    "SmokeCount",
    "SmokeResult",
    "SmokeVerdict",
    "StopReport",
    "Timings",
    "VariantCost",
    "percentile",
    "show_value",
    "unit_of",
]
