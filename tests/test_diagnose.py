"""Diagnosis on real log excerpts (tests/data/real-failures.jsonl) and on realistic variants (tests/data/variants/)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from rich.console import Console

from campaign.console.diagnosis import render_diagnosis
from campaign.diagnose import KINDS, diagnose, diagnose_file, parse_signatures, signatures
from campaign.errors import ConfigError, UsageError
from campaign.records import SmokeCheck, SmokeResult, Timings

DATA = Path(__file__).parent / "data"
REAL = [json.loads(line) for line in (DATA / "real-failures.jsonl").read_text().splitlines() if line.strip()]
VARIANTS = sorted((DATA / "variants").glob("*.log"))
#: Excerpts whose label the excerpt itself cannot show (the cause is only in the thread's title).
KNOWN_MISSES = {
    "kt-784-capture-invalidated-local-chat": "the excerpt is a bare Python traceback through fire/local_chat; "
    "the capture error is only in the thread title",
}
LAUNCH_LOGS = [r for r in REAL if r["category"] != "wrong_output"]


def _by_id(excerpt_id: str) -> dict[str, str]:
    return next(r for r in REAL if r["id"] == excerpt_id)


def _variant_kind(path: Path) -> str:
    return path.name.split("--", 1)[0]


@pytest.mark.parametrize("record", LAUNCH_LOGS, ids=[r["id"] for r in LAUNCH_LOGS])
def test_real_excerpt_gets_its_label(record: dict[str, str]) -> None:
    if record["id"] in KNOWN_MISSES:
        pytest.xfail(KNOWN_MISSES[record["id"]])
    d = diagnose(record["excerpt"])
    assert d.kind == record["category"], d.summary


def test_real_excerpts_score_at_least_90_percent_and_no_healthy_log_is_a_failure() -> None:
    results = [(r["category"], diagnose(r["excerpt"]).kind) for r in LAUNCH_LOGS]
    right = sum(1 for want, got in results if want == got)
    assert right / len(results) >= 0.9
    assert all(got == "healthy" for want, got in results if want == "healthy")
    # The converse matters as much: a real failure is never waved through as healthy.
    assert not [want for want, got in results if want != "healthy" and got == "healthy"]


@pytest.mark.parametrize("path", VARIANTS, ids=[p.stem for p in VARIANTS])
def test_variant_log_gets_its_label(path: Path) -> None:
    d = diagnose_file(path)
    assert d.kind == _variant_kind(path), d.summary


def test_every_rule_has_an_example_in_the_tests_that_it_explains() -> None:
    real = {r["id"]: r["excerpt"] for r in REAL}
    variants = {p.name.split("--", 1)[1].removesuffix(".log"): p.read_text() for p in VARIANTS}
    for rule in signatures().rules:
        assert rule.example in real or rule.example in variants, f"rule {rule.id} names no test example"
        text = real.get(rule.example) or variants[rule.example]
        assert diagnose(text).kind == rule.kind, rule.id


def test_evidence_lines_are_1_based_and_match_the_log() -> None:
    log = (DATA / "variants" / "gpu_oom--vllm-wrapper-cause-40-lines-above.log").read_text()
    lines = log.split("\n")
    d = diagnose(log, server="vllm")
    assert d.evidence
    for ev in d.evidence:
        assert lines[ev.line - 1].strip() == ev.text
    # The cause, not the wrapper at the end, is the headline evidence.
    assert "CUDA out of memory" in d.evidence[0].text
    assert d.evidence[0].line < len(lines) - 40


def test_hint_uses_the_flag_spelling_of_the_server() -> None:
    log = _by_id("vllm-9290-oom-multistep-gpu-util-0941")["excerpt"]
    assert "--gpu-memory-utilization" in diagnose(log, server="vllm").hint
    assert "--mem-fraction-static" in diagnose(log, server="sglang").hint
    assert "--gpu-memory-utilization" not in diagnose(log, server="sglang").hint
    capture = _by_id("sgl-7918-torchcompile-moe-gate-stream-capturing")["excerpt"]
    assert "-cc.cudagraph_mode=NONE" in diagnose(capture, server="vllm").hint
    assert "--disable-cuda-graph" in diagnose(capture, server="refserver").hint


def test_killed_after_an_earlier_error_is_that_error() -> None:
    log = (DATA / "variants" / "gpu_oom--sglang-killed-after-oom.log").read_text()
    assert diagnose(log, exit_code=137, server="sglang").kind == "gpu_oom"


def test_a_sigkill_with_no_other_cause_is_the_host_oom_killer() -> None:
    log = "[2026-12-01 10:00:00 TP0] Load weight begin. avail mem=79.10 GB\n"
    d = diagnose(log, exit_code=137, server="sglang")
    assert d.kind == "host_oom_killed"
    assert d.confidence < 0.6
    assert diagnose(log, exit_code=-9).kind == "host_oom_killed"


def test_a_deadline_names_the_phase_it_stalled_in() -> None:
    capture = (
        "[2026-12-01 10:00:00 TP0] Memory pool end. avail mem=18.61 GB\n"
        "[2026-12-01 10:00:01 TP0] Capture cuda graph begin. This can take up to several minutes.\n"
    )
    assert diagnose(capture, timed_out=True, server="sglang").kind == "cuda_graph_capture_failed"
    load = "[2026-12-01 10:00:00 TP0] Load weight begin. avail mem=79.10 GB\n"
    d = diagnose(load, timed_out=True, phase="load", server="sglang")
    assert d.kind == "startup_timeout"
    assert "'load'" in d.summary
    # The loop's phase wins over what the log shows.
    assert diagnose(load, timed_out=True, phase="graph_capture").kind == "cuda_graph_capture_failed"


def test_an_error_beats_the_deadline() -> None:
    log = _by_id("vllm-6042-watchdog-allreduce-timeout-exit6")["excerpt"]
    assert diagnose(log, timed_out=True).kind == "nccl_error"


def _smoke(*answers: tuple[int, int]) -> SmokeResult:
    return SmokeResult(
        checks=[SmokeCheck(question=f"{e} = ?", expected=e, reply=str(g), got=g, passed=e == g) for e, g in answers]
    )


def test_wrong_answers_on_a_healthy_log_are_wrong_output() -> None:
    log = (DATA / "variants" / "healthy--refserver-cpu.log").read_text()
    d = diagnose(log, server="refserver", smoke=_smoke((4, 4), (9, 7)))
    assert d.kind == "wrong_output"
    assert "1/2" in d.summary and "got '7'" in d.summary
    assert diagnose(log, server="refserver", smoke=_smoke((4, 4), (9, 9))).kind == "healthy"


def test_a_healthy_log_stays_healthy_without_an_exit_and_fails_when_the_server_dies() -> None:
    log = (DATA / "variants" / "healthy--sglang-full-startup.log").read_text()
    assert diagnose(log, server="sglang").kind == "healthy"
    assert diagnose(log, server="sglang", timings=Timings(launch_to_ready_s=66.0)).kind == "healthy"
    died = log + (
        "[2026-11-30 08:05:00 TP0] Scheduler hit an exception: Traceback (most recent call last):\n"
        "RuntimeError: CUDA error: an illegal memory access was encountered\n"
        "[2026-11-30 08:05:00] Received sigquit from a child process. It usually means the child failed.\n"
    )
    assert diagnose(died, server="sglang").kind == "illegal_memory_access"


def test_a_cuda_error_after_readiness_is_fatal_but_a_refused_request_is_not() -> None:
    log = (DATA / "variants" / "healthy--vllm-v1-full-startup.log").read_text()
    refused = log + (
        "(APIServer pid=101) ERROR 11-30 09:12:00 [serving_chat.py:222] ValueError: This model's maximum context "
        "length is 40960 tokens. However, you requested 50000 tokens.\n"
        '(APIServer pid=101) INFO:     127.0.0.1:5110 - "POST /v1/chat/completions HTTP/1.1" 400 Bad Request\n'
    )
    assert diagnose(refused, server="vllm").kind == "healthy"
    crashed = log + (
        "(EngineCore_DP0 pid=230) ERROR 11-30 09:12:00 [core.py:850] RuntimeError: CUDA error: an illegal memory "
        "access was encountered\n"
    )
    assert diagnose(crashed, server="vllm").kind == "illegal_memory_access"


def test_errors_before_readiness_that_did_not_stop_it_are_not_failures() -> None:
    log = (
        "ERROR 11-30 09:10:00 [x.py:1] ImportError: flash_attn is not installed; falling back to SDPA\n"
        + (DATA / "variants" / "healthy--vllm-v1-full-startup.log").read_text()
    )
    assert diagnose(log, server="vllm").kind == "healthy"


def test_sglang_uvicorn_up_without_the_ready_line_is_not_ready() -> None:
    log = _by_id("sgl-744-warmup-failed-after-uvicorn-up")["excerpt"]
    assert diagnose(log, server="sglang").kind == "startup_timeout"
    # The same "Application startup complete." is vLLM's readiness marker.
    vllm = "(APIServer pid=1) INFO:     Application startup complete.\n"
    assert diagnose(vllm, server="vllm").kind == "healthy"


def test_usage_banner_with_exit_2_is_bad_args() -> None:
    log = (DATA / "variants" / "bad_args--sglang-0520-removed-flag.log").read_text()
    d = diagnose(log, exit_code=2, server="sglang")
    assert d.kind == "bad_args"
    assert any("--cuda-graph-max-bs 8" in ev.text for ev in d.evidence)


def test_an_unknown_crash_is_not_forced_into_a_known_kind() -> None:
    log = "Traceback (most recent call last):\n  File \"/x/y.py\", line 3, in main\nKeyError: 'frobnicate'\n"
    d = diagnose(log, exit_code=1)
    assert d.kind == "unknown"
    assert d.confidence <= 0.3
    assert d.evidence[-1].text == "KeyError: 'frobnicate'"


def test_every_returned_kind_is_declared_with_a_title_and_a_hint() -> None:
    sigs = signatures()
    for kind in KINDS:
        assert kind in sigs.kinds
        assert kind == "healthy" or sigs.kinds[kind].hint(None)


def test_diagnose_file_decodes_bad_bytes_and_reports_a_missing_file(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    log.write_bytes(b"\xff\xfe garbage\nOSError: [Errno 98] Address already in use\n")
    assert diagnose_file(log).kind == "port_in_use"
    with pytest.raises(UsageError, match="log file not found"):
        diagnose_file(tmp_path / "missing.log")
    with pytest.raises(UsageError, match="directory"):
        diagnose_file(tmp_path)


def test_a_broken_rules_file_is_a_config_error_naming_the_field() -> None:
    with pytest.raises(ConfigError, match=r"rules\[0\]\.patterns"):
        parse_signatures("kinds: {gpu_oom: {title: x}}\nrules:\n  - {id: r, kind: gpu_oom, patterns: ['(']}\n")
    with pytest.raises(ConfigError, match="not declared"):
        parse_signatures("kinds: {}\nrules:\n  - {id: r, kind: gpu_oom, patterns: ['x']}\n")


def test_a_diagnosis_renders_kind_evidence_with_line_numbers_and_hint() -> None:
    log = (DATA / "variants" / "stream_capture_isolation--sglang-new-capture-wording.log").read_text()
    d = diagnose(log, server="sglang")
    console = Console(record=True, width=200)
    render_diagnosis(console, d)
    text = console.export_text()
    assert "stream_capture_isolation" in text and "confidence 0.95" in text
    assert f"{d.evidence[0].line} " in text and "operation not permitted when stream is capturing" in text
    assert "next step:" in text and "--disable-cuda-graph" in text
    assert f"fingerprint {d.fingerprint}" in text


def test_a_ready_line_without_a_healthy_endpoint_by_the_deadline_is_a_stall() -> None:
    log = (DATA / "variants" / "healthy--refserver-cpu.log").read_text()
    d = diagnose(log, server="refserver", timed_out=True, phase="ready")
    assert d.kind == "startup_timeout"
    assert "'ready'" in d.summary


def test_a_gate_failure_on_a_healthy_server_is_not_blamed_on_the_log() -> None:
    # Healthy and slower than a gate allows: its own kind, so attribution and `runs --failures` say "below_gate".
    log = (DATA / "variants" / "healthy--refserver-cpu.log").read_text()
    d = diagnose(log, server="refserver", phase="gates", timings=Timings(launch_to_ready_s=1.2))
    assert d.kind == "below_gate"
    assert "missed a bench gate" in d.summary and "repeats" in d.hint
    assert [e.line for e in d.evidence] == [diagnose(log, server="refserver").evidence[0].line]


def test_the_loops_launch_phase_means_no_phase_seen() -> None:
    capture = "[2026-12-01 10:00:01 TP0] Capture cuda graph begin. This can take up to several minutes.\n"
    assert diagnose(capture, timed_out=True, phase="launch").kind == "cuda_graph_capture_failed"


def test_an_empty_log_is_judged_by_the_exit_status_alone() -> None:
    assert diagnose("").kind == "healthy"
    assert diagnose("").confidence < 0.5
    assert diagnose("", exit_code=1).kind == "unknown"
    assert diagnose("", exit_code=137).kind == "host_oom_killed"
    assert diagnose("", timed_out=True).kind == "startup_timeout"


def test_a_megabyte_progress_bar_line_does_not_hide_the_error_after_it() -> None:
    bar = "Capturing batches: " + "\r 10%|#   | 1/10 [00:01<00:09]" * 100_000
    d = diagnose(bar + "\nRuntimeError: CUDA error: an illegal memory access was encountered\n")
    assert d.kind == "illegal_memory_access"
    assert d.evidence[0].line == 2


@pytest.mark.parametrize(
    "last_line",
    [
        "Killed",
        "[1]+  Killed                  python3 -m sglang.launch_server --model-path /models/x",
        "bash: line 1: 4242 Killed                  vllm serve /models/x",
    ],
)
def test_the_shells_ways_of_saying_killed_are_the_oom_killer_when_nothing_else_is_wrong(last_line: str) -> None:
    log = "Loading safetensors checkpoint shards:  37% Completed | 60/163 [01:12<02:04,  1.21s/it]\n" + last_line + "\n"
    d = diagnose(log)
    assert d.kind == "host_oom_killed"
    assert d.evidence[0].text == last_line


def test_high_memory_fraction_is_only_blamed_when_capture_left_no_error_text() -> None:
    head = (
        "INFO 03-27 10:29:01 [worker.py:267] the current vLLM instance can use total_gpu_memory (44.53GiB) x "
        "gpu_memory_utilization (0.98) = 43.64GiB\n"
        "INFO 03-27 10:29:03 [model_runner.py:1442] Capturing cudagraphs for decoding.\n"
    )
    assert diagnose(head, server="vllm").kind == "gpu_oom"
    crashed = head + "RuntimeError: CUDA error: invalid argument\n"
    assert diagnose(crashed, server="vllm", exit_code=1).kind == "cuda_graph_capture_failed"
