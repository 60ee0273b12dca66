"""Attribution over synthetic attempt lists: which knob, or which interaction, explains a failure."""

from __future__ import annotations

import itertools

from rich.console import Console

from campaign.attribution import attribute, plan_isolation
from campaign.console.diagnosis import render_findings
from campaign.records import Attempt, Diagnosis, KnobValue, LaunchSpec, Role

_SPEC = LaunchSpec(recipe="refserver", command=["python"], port=30000, ready_marker="r", health_path="/health_generate")
BASELINE: dict[str, KnobValue] = {"attention": "torch", "torch_compile": False, "cuda_graph": False}


def _attempt(index: int, knobs: dict[str, KnobValue], failed_with: str | None, role: Role = "variant") -> Attempt:
    return Attempt(
        index=index,
        variant=f"v{index}",
        role=role,
        knobs=knobs,
        spec=_SPEC,
        outcome="failed" if failed_with else "passed",
        diagnosis=Diagnosis(kind=failed_with) if failed_with else None,
    )


def _run(knobs: dict[str, KnobValue], truth: str, kind: str) -> str | None:
    """What the (simulated) server does: fail with ``kind`` when ``truth`` holds."""
    holds = {
        "cuda_graph": knobs["cuda_graph"] is True,
        "compile_and_graph": knobs["torch_compile"] is True and knobs["cuda_graph"] is True,
    }[truth]
    return kind if holds else None


def test_a_single_knob_across_two_attention_backends() -> None:
    # CUDA graphs on a CPU-only host fail whatever the attention kernel.
    grid = itertools.product(["simt", "mma"], [True, False])
    matrix: list[dict[str, KnobValue]] = [{"attention": a, "torch_compile": False, "cuda_graph": g} for a, g in grid]
    attempts = [_attempt(i, k, _run(k, "cuda_graph", "unsupported_hardware")) for i, k in enumerate(matrix)]
    (finding,) = attribute(attempts, BASELINE)
    assert finding.status == "explained"
    assert finding.cause == {"cuda_graph": True}
    assert finding.independent_of == {"attention": ["simt", "mma"]}
    assert (
        finding.statement == "unsupported_hardware iff cuda_graph=on; independent of attention (seen with simt and mma)"
    )
    assert finding.failed == [0, 2] and finding.passed == [1, 3]


def test_an_interaction_found_by_the_isolation_runs() -> None:
    failed: dict[str, KnobValue] = {"attention": "mma", "torch_compile": True, "cuda_graph": True}
    attempts = [_attempt(0, failed, "stream_capture_isolation")]
    plan = plan_isolation(failed, BASELINE, [failed])
    assert plan == [
        {"attention": "torch", "torch_compile": True, "cuda_graph": True},
        {"attention": "mma", "torch_compile": False, "cuda_graph": True},
        {"attention": "mma", "torch_compile": True, "cuda_graph": False},
    ]
    for i, knobs in enumerate(plan, start=1):
        attempts.append(_attempt(i, knobs, _run(knobs, "compile_and_graph", "stream_capture_isolation"), "isolation"))
    (finding,) = attribute(attempts, BASELINE)
    assert finding.status == "explained"
    assert finding.cause == {"torch_compile": True, "cuda_graph": True}
    assert finding.independent_of == {"attention": ["mma", "torch"]}
    assert finding.statement == (
        "stream_capture_isolation iff torch_compile=on and cuda_graph=on; "
        "independent of attention (seen with mma and torch)"
    )
    assert sorted(finding.evidence) == [0, 1, 2, 3]


def test_not_enough_evidence_names_the_runs_that_would_settle_it() -> None:
    failed: dict[str, KnobValue] = {"attention": "mma", "torch_compile": True, "cuda_graph": True}
    no_compile = {**failed, "torch_compile": False}
    attempts = [_attempt(0, failed, "stream_capture_isolation"), _attempt(1, no_compile, None, "isolation")]
    (finding,) = attribute(attempts, BASELINE)
    assert finding.status == "not_enough_evidence"
    assert finding.cause == {}
    assert finding.candidates == [{"torch_compile": True}]
    assert finding.settle_with == [
        {"attention": "torch", "torch_compile": True, "cuda_graph": True},
        {"attention": "mma", "torch_compile": True, "cuda_graph": False},
    ]
    # Running exactly those settles it.
    for i, knobs in enumerate(finding.settle_with, start=2):
        attempts.append(_attempt(i, knobs, _run(knobs, "compile_and_graph", "stream_capture_isolation"), "isolation"))
    (settled,) = attribute(attempts, BASELINE)
    assert settled.status == "explained"
    assert settled.cause == {"torch_compile": True, "cuda_graph": True}


def test_one_failure_and_nothing_to_compare_asks_for_the_isolation_runs() -> None:
    failed: dict[str, KnobValue] = {"attention": "mma", "torch_compile": False, "cuda_graph": True}
    (finding,) = attribute([_attempt(0, failed, "illegal_memory_access")], BASELINE)
    assert finding.status == "not_enough_evidence"
    assert finding.settle_with == plan_isolation(failed, BASELINE, [failed])
    assert {"attention": "mma"} in finding.candidates and {"cuda_graph": True} in finding.candidates


def test_a_flaky_failure_is_not_pinned_on_a_knob() -> None:
    knobs: dict[str, KnobValue] = {"attention": "mma", "torch_compile": False, "cuda_graph": True}
    attempts = [
        _attempt(0, knobs, "nccl_error"),
        _attempt(1, knobs, None),
        _attempt(2, {**knobs, "cuda_graph": False}, None),
    ]
    (finding,) = attribute(attempts, BASELINE)
    assert finding.status == "not_enough_evidence"
    assert finding.cause == {}
    assert "no knob assignment separates" in finding.statement


def test_one_kind_with_two_causes_names_both() -> None:
    # As on the H200: torch.compile's workspace and a starved memory fraction both end in gpu_oom.
    base: dict[str, KnobValue] = {"attention": "simt", "torch_compile": False, "cuda_graph": True}
    attempts = [
        _attempt(0, base, None),
        _attempt(1, {**base, "torch_compile": True}, "gpu_oom"),
        _attempt(2, {**base, "attention": "mma"}, None),
        _attempt(3, {**base, "attention": "mma", "torch_compile": True}, "gpu_oom"),
        _attempt(4, {**base, "attention": "mma", "mem_fraction": 0.001}, "gpu_oom"),
        _attempt(5, {**base, "mem_fraction": 0.001}, "gpu_oom", role="isolation"),
    ]
    (finding,) = attribute(attempts, base)
    assert finding.status == "not_enough_evidence" and finding.cause == {}
    assert finding.candidates == [{"torch_compile": True}, {"mem_fraction": 0.001}]
    assert finding.statement == (
        "gpu_oom: more than one cause fits, each seen in no passing run: "
        "torch_compile=on (attempts 1, 3); mem_fraction=0.001 (attempts 4, 5)"
    )


def test_only_variant_and_isolation_attempts_count_and_each_kind_gets_a_finding() -> None:
    on: dict[str, KnobValue] = {"attention": "simt", "torch_compile": False, "cuda_graph": True}
    off: dict[str, KnobValue] = {**on, "cuda_graph": False}
    attempts = [
        _attempt(0, on, "unsupported_hardware"),
        _attempt(1, off, None),
        _attempt(2, BASELINE, None, "restore"),
        # A failure of another kind neither shows nor rules out the first one.
        _attempt(3, off | {"attention": "mma"}, "bad_args"),
        Attempt(index=4, variant="v4", knobs=off, spec=_SPEC, outcome="skipped"),
    ]
    findings = attribute(attempts, BASELINE)
    assert [f.kind for f in findings] == ["unsupported_hardware", "bad_args"]
    assert findings[0].passed == [1]
    assert findings[1].failed == [3]


def test_plan_isolation_skips_what_was_tried_and_drops_knobs_the_baseline_leaves_to_the_recipe() -> None:
    failed: dict[str, KnobValue] = {"attention": "mma", "torch_compile": False, "cuda_graph": True, "mem_fraction": 0.7}
    tried = [failed, {"attention": "torch", "cuda_graph": True, "mem_fraction": 0.7}]
    assert plan_isolation(failed, BASELINE, tried) == [
        {"attention": "mma", "torch_compile": False, "cuda_graph": False, "mem_fraction": 0.7},
        {"attention": "mma", "torch_compile": False, "cuda_graph": True},
    ]
    assert plan_isolation(BASELINE, BASELINE, []) == []


def test_findings_render_with_the_statement_and_the_runs_to_settle() -> None:
    failed: dict[str, KnobValue] = {"attention": "mma", "torch_compile": True, "cuda_graph": True}
    attempts = [_attempt(0, failed, "stream_capture_isolation"), _attempt(1, {**failed, "cuda_graph": False}, None)]
    console = Console(record=True, width=200)
    render_findings(console, attribute(attempts, BASELINE))
    text = console.export_text()
    assert "stream_capture_isolation" in text and "not enough evidence" in text
    assert "to settle, run: attention=torch, torch_compile=on, cuda_graph=on" in text
    render_findings(console, [])
    assert "no failures to explain" in console.export_text()


def test_the_port_each_attempt_listened_on_is_not_a_suspect() -> None:
    grid = itertools.product(["simt", "mma"], [True, False])
    matrix: list[dict[str, KnobValue]] = [
        {"attention": a, "torch_compile": False, "cuda_graph": g, "port": 30001 + i} for i, (a, g) in enumerate(grid)
    ]
    attempts = [_attempt(i, k, _run(k, "cuda_graph", "unsupported_hardware")) for i, k in enumerate(matrix)]
    (finding,) = attribute(attempts, {**BASELINE, "port": 30000})
    assert finding.status == "explained"
    assert finding.cause == {"cuda_graph": True}
    assert "port" not in finding.independent_of
    failed = matrix[0]
    assert all(run["port"] == failed["port"] for run in plan_isolation(failed, {**BASELINE, "port": 30000}, [failed]))


def test_knobs_only_some_attempts_set_do_not_break_the_analysis() -> None:
    base: dict[str, KnobValue] = {"cuda_graph": False}
    attempts = [
        _attempt(0, {"cuda_graph": True, "mem_fraction": 0.9}, "gpu_oom"),
        _attempt(1, {"cuda_graph": True}, "gpu_oom"),
        _attempt(2, {"cuda_graph": False, "max_batch": 8}, None),
        _attempt(3, {"cuda_graph": False}, None),
    ]
    (finding,) = attribute(attempts, base)
    assert finding.status == "explained"
    assert finding.cause == {"cuda_graph": True}
    # Not setting a knob is a value too: the failures were seen with mem_fraction 0.9 and left to the recipe.
    assert finding.independent_of == {"mem_fraction": [0.9, None]}
    assert finding.statement == "gpu_oom iff cuda_graph=on; independent of mem_fraction (seen with 0.9 and unset)"
    (alone,) = attribute(attempts[:2], base)
    assert alone.status == "not_enough_evidence"
    assert alone.candidates == [{"cuda_graph": True}]
    assert alone.settle_with == [{"cuda_graph": False, "mem_fraction": 0.9}]


def test_over_a_full_matrix_every_single_knob_or_pair_cause_is_found_exactly() -> None:
    axes: dict[str, list[KnobValue]] = {
        "attention": ["simt", "mma"],
        "torch_compile": [False, True],
        "cuda_graph": [False, True],
        "mem_fraction": [0.8, 0.9],
    }
    matrix = [dict(zip(axes, values, strict=True)) for values in itertools.product(*axes.values())]
    literals = [(k, v) for k, vs in axes.items() for v in vs]
    truths = [dict([a]) for a in literals] + [
        dict([a, b]) for a, b in itertools.combinations(literals, 2) if a[0] != b[0]
    ]
    for truth in truths:
        attempts = [
            _attempt(i, k, "gpu_oom" if all(k[n] == v for n, v in truth.items()) else None)
            for i, k in enumerate(matrix)
        ]
        (finding,) = attribute(attempts, BASELINE)
        assert finding.status == "explained", truth
        assert finding.cause == truth
        assert set(finding.independent_of) == set(axes) - set(truth)
