"""Diagnosis on real log excerpts (tests/data/real-failures.jsonl) and on realistic variants (tests/data/variants/)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from rich.console import Console

from campaign.bench import run_bench
from campaign.bench.testing import ScheduledServer
from campaign.console.diagnosis import render_diagnosis
from campaign.diagnose import diagnose, diagnose_file, parse_signatures, rules_text, signatures
from campaign.diagnosis.signatures import CODE_KINDS
from campaign.errors import ConfigError, UsageError
from campaign.records import BenchSettings, SmokeCheck, SmokeResult, Timings
from campaign.retry import failure_class, needs_proven_box

DATA = Path(__file__).parent / "data"
REAL = [json.loads(line) for line in (DATA / "real-failures.jsonl").read_text().splitlines() if line.strip()]
VARIANTS = sorted((DATA / "variants").glob("*.log"))
CORPUS = [json.loads(line) for line in (DATA / "corpus" / "excerpts.jsonl").read_text().splitlines() if line.strip()]
#: Excerpts whose label the excerpt itself cannot show (the cause is only in the thread's title).
KNOWN_MISSES = {
    "kt-784-capture-invalidated-local-chat": "the excerpt is a bare Python traceback through fire/local_chat; "
    "the capture error is only in the thread title",
}
#: Excerpts that show no failure and no readiness: the label comes from the thread (its title, a later comment), so
#: the log alone is inconclusive, and saying so is right (guessing would be wrong on the next such log).
KNOWN_INCONCLUSIVE = {
    "sgl-pr11275-capture-hang-custom-ar": "the capture hangs at 0/52; no error is printed",
    "kt-1885-sglang-kt-capture-assertion": "cut inside capture; the assertion is only in the thread title",
    "vllm-15598-oom-during-cudagraph-capture-ray": "ends at 'Capturing cudagraphs'; the OOM is in the thread title",
    "sgl-744-warmup-failed-after-uvicorn-up": "ends at uvicorn's start; the warm-up error is in the thread title",
}
LAUNCH_LOGS = [r for r in REAL if r["category"] != "wrong_output"]


def _expected(record: dict[str, str]) -> str:
    return "inconclusive" if record["id"] in KNOWN_INCONCLUSIVE else record["category"]


def _by_id(excerpt_id: str) -> dict[str, str]:
    return next(r for r in REAL if r["id"] == excerpt_id)


def _variant_kind(path: Path) -> str:
    return path.name.split("--", 1)[0]


@pytest.mark.parametrize("record", LAUNCH_LOGS, ids=[r["id"] for r in LAUNCH_LOGS])
def test_real_excerpt_gets_its_label(record: dict[str, str]) -> None:
    if record["id"] in KNOWN_MISSES:
        pytest.xfail(KNOWN_MISSES[record["id"]])
    d = diagnose(record["excerpt"])
    assert d.kind == _expected(record), d.summary


def test_real_excerpts_score_at_least_90_percent_and_no_healthy_log_is_a_failure() -> None:
    results = [(r["category"], diagnose(r["excerpt"]).kind) for r in LAUNCH_LOGS]
    right = sum(1 for (want, got), r in zip(results, LAUNCH_LOGS, strict=True) if got in (want, _expected(r)))
    assert right / len(results) >= 0.9
    assert all(got == "healthy" for want, got in results if want == "healthy")
    # The converse matters as much: a real failure is never waved through as healthy.
    assert not [want for want, got in results if want != "healthy" and got == "healthy"]


@pytest.mark.parametrize("path", VARIANTS, ids=[p.stem for p in VARIANTS])
def test_variant_log_gets_its_label(path: Path) -> None:
    d = diagnose_file(path)
    assert d.kind == _variant_kind(path), d.summary


def test_every_rule_has_an_example_in_the_tests_that_it_explains() -> None:
    real = {r["id"]: r["excerpt"] for r in REAL + CORPUS}
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
    d = diagnose(log, server="sglang")
    assert d.kind == "inconclusive" and "'server'" in d.summary
    assert diagnose(log, server="sglang", timed_out=True).kind == "startup_timeout"
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
    # The decisive error first, quoted in the summary; the generic next step in the hint.
    assert d.evidence[0].text == "KeyError: 'frobnicate'"
    assert "line 3: KeyError: 'frobnicate'" in d.summary
    assert "add a rule" in d.hint


def test_every_returned_kind_is_declared_with_a_title_and_a_hint() -> None:
    sigs = signatures()
    for kind in (*CODE_KINDS, *(r.kind for r in sigs.rules)):
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


def _rules_with(change: Callable[[dict[str, Any]], None]) -> str:
    """The shipped rules file's text, changed by ``change`` (a temporary signatures file, as a user would edit it)."""
    data = yaml.safe_load(rules_text())
    change(data)
    return yaml.safe_dump(data, sort_keys=False)


def test_a_broken_rules_file_is_a_config_error_naming_the_field() -> None:
    def bad_pattern(d: dict[str, Any]) -> None:
        d["rules"][0]["patterns"] = ["("]

    with pytest.raises(ConfigError, match=r"rules\[0\]\.patterns"):
        parse_signatures(_rules_with(bad_pattern))
    with pytest.raises(ConfigError, match="not declared"):
        parse_signatures(_rules_with(lambda d: d["rules"].append({"id": "r", "kind": "no_such", "patterns": ["x"]})))
    # A kind with no retry class would silently become "deterministic, not damaging": the file must say which.
    with pytest.raises(ConfigError, match=r"kinds\.disk_full\.class"):
        parse_signatures(_rules_with(lambda d: d["kinds"].update({"disk_full": {"title": "t", "hint": "h"}})))
    with pytest.raises(ConfigError, match=r"kinds\.disk_full\.damaging"):
        parse_signatures(
            _rules_with(lambda d: d["kinds"].update({"disk_full": {"title": "t", "hint": "h", "class": "transient"}}))
        )
    # The kinds campaign's own checks return cannot be left out.
    with pytest.raises(ConfigError, match="healthy"):
        parse_signatures(_rules_with(lambda d: d["kinds"].pop("healthy")))


@pytest.mark.parametrize("cls", ["transient", "deterministic"])
def test_a_kind_added_in_a_temporary_rules_file_is_diagnosed_and_retried_by_its_class(cls: str) -> None:
    # Adding a failure kind is one YAML entry (and its log): no list in code to update.
    def add(d: dict[str, Any]) -> None:
        d["kinds"]["disk_full"] = {
            "title": "The disk is full",
            "class": cls,
            "damaging": cls == "deterministic",
            "hint": {"default": "Free disk space where the server writes (the model cache, /tmp)."},
        }
        d["rules"].insert(0, {"id": "no-space", "kind": "disk_full", "patterns": [r"No space left on device"]})

    sigs = parse_signatures(_rules_with(add))
    log = (
        "INFO 12-01 10:00:01 Loading weights\n"
        "Traceback (most recent call last):\n"
        '  File "/app/loader.py", line 9, in save\n'
        "OSError: [Errno 28] No space left on device: '/root/.cache/x.safetensors'\n"
    )
    d = diagnose(log, sigs=sigs, exit_code=1)
    assert d.kind == "disk_full"
    assert d.summary.startswith("The disk is full") and "Free disk space" in d.hint
    assert failure_class(d.kind, "load", sigs) == cls
    assert needs_proven_box(d.kind, sigs) == (cls == "deterministic")
    # The shipped rules know no such kind: the same log there is no disk_full, and an undeclared kind is not retried.
    assert diagnose(log, exit_code=1).kind != "disk_full"
    assert failure_class("disk_full", "load") == "deterministic" and needs_proven_box("disk_full")


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


@pytest.mark.parametrize(
    ("mode", "error", "meaning"),
    [
        ("drop", "incomplete:connection_closed", "Connection closed or reset: the server or something on the path"),
        ("http_500", "http_500", "The server's own error: the server answered with an error"),
    ],
)
def test_request_errors_in_a_real_bench_are_bench_errors_never_healthy(mode: str, error: str, meaning: str) -> None:
    # What the loop passes when a bench level's error rate passed max_error_rate on a server whose log shows no
    # failure (an H200 run: one of 32 streams cut, diagnosed `healthy` before this kind existed).
    log = (DATA / "variants" / "healthy--refserver-cpu.log").read_text()
    with ScheduledServer(ttft_ms=2, itl_ms=1, tokens=4, fail_mode=mode, fail_every=4) as srv:
        bench = run_bench(srv.url, BenchSettings(concurrency=[2], requests=8, warmup=0, max_error_rate=0.01))
    assert not bench.passed
    d = diagnose(log, server="refserver", phase="bench", timings=Timings(launch_to_ready_s=1.2), bench=bench)
    assert d.kind == "bench_errors"
    assert f"2 of 8 bench requests failed: {error} 2" in d.summary
    assert d.evidence[0].line == 0 and d.evidence[0].text.startswith(f"bench request error {error} (2 of 8): ")
    ready = diagnose(log, server="refserver").evidence[0].line
    assert ready in [e.line for e in d.evidence]
    assert meaning in d.hint
    assert failure_class(d.kind, "bench") == "transient"


def test_a_bench_phase_failure_is_never_healthy_even_without_its_result() -> None:
    log = (DATA / "variants" / "healthy--refserver-cpu.log").read_text()
    # The bench could not run (its first request failed): the attempt's note has the error, the kind says where.
    d = diagnose(log, server="refserver", phase="bench", timings=Timings(launch_to_ready_s=1.2))
    assert d.kind == "bench_errors" and "before it measured a level" in d.summary
    assert diagnose(log, server="refserver", phase="smoke").kind != "healthy"


def test_the_loops_launch_phase_means_no_phase_seen() -> None:
    capture = "[2026-12-01 10:00:01 TP0] Capture cuda graph begin. This can take up to several minutes.\n"
    assert diagnose(capture, timed_out=True, phase="launch").kind == "cuda_graph_capture_failed"


def test_an_empty_log_is_judged_by_the_exit_status_alone() -> None:
    d = diagnose("")
    assert d.kind == "inconclusive" and "empty" in d.summary
    assert diagnose(" \n\n").kind == "inconclusive"
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
    # The log alone ends there: inconclusive, but the deadline (or an exit) makes it a failure to explain.
    assert diagnose(head, server="vllm").kind == "inconclusive"
    assert diagnose(head, server="vllm", timed_out=True).kind == "gpu_oom"
    crashed = head + "RuntimeError: CUDA error: invalid argument\n"
    assert diagnose(crashed, server="vllm", exit_code=1).kind == "cuda_graph_capture_failed"


def test_an_error_after_the_ready_line_wins_over_it() -> None:
    # uvicorn prints "Application startup complete." before it binds; the bind failure after it is the verdict.
    log = (
        "INFO:     Started server process [593]\nINFO:     Waiting for application startup.\n"
        "INFO:     Application startup complete.\n"
        "ERROR:    [Errno 98] error while attempting to bind on address ('0.0.0.0', 8000): address already in use\n"
    )
    assert diagnose(log).kind == "port_in_use"
    crashed = (DATA / "variants" / "healthy--vllm-v1-full-startup.log").read_text() + (
        "Traceback (most recent call last):\n"
        '  File "/vllm/v1/engine/core.py", line 700, in run_busy_loop\n'
        "KeyError: 'frobnicate'\n"
    )
    assert diagnose(crashed, server="vllm").kind == "unknown"
    # The same traceback followed by more served requests did not take the server down.
    served = crashed + '(APIServer pid=101) INFO:     127.0.0.1:5110 - "POST /v1/completions HTTP/1.1" 200 OK\n'
    assert diagnose(served, server="vllm").kind == "healthy"


def test_no_ready_marker_and_no_failure_is_inconclusive_with_the_last_phase() -> None:
    log = "[2026-12-01 10:00:00 TP0] Load weight begin. avail mem=79.10 GB\n"
    d = diagnose(log, server="sglang")
    assert d.kind == "inconclusive"
    assert "'load'" in d.summary and d.evidence[0].line == 1
    assert diagnose("some unrelated text\n").kind == "inconclusive"


def test_a_waiting_loop_is_a_startup_timeout_but_one_waiting_line_is_not() -> None:
    line = "2023-02-20T16:45:24.091665Z  INFO text_generation_launcher: Waiting for shard 0 to be ready...\n"
    assert diagnose(line * 3).kind == "startup_timeout"
    assert diagnose(line).kind == "inconclusive"


def test_a_dynamo_frame_the_stack_passed_through_is_not_a_torch_compile_failure() -> None:
    # transformers' continuous batching: the request loop runs under torch._dynamo's eval_frame wrapper, and the
    # error is raised deeper, in the paged cache's own code.
    head = (
        "Traceback (most recent call last):\n"
        '  File "/venv/lib/python3.11/site-packages/transformers/generation/continuous_batching/continuous_api.py", '
        "line 800, in _run_generation_loop\n"
        "    self._inner_generation_loop(batch_processor)\n"
        '  File "/venv/lib/python3.11/site-packages/torch/_dynamo/eval_frame.py", line 929, in _fn\n'
        "    return fn(*args, **kwargs)\n"
    )
    raised = (
        '  File "/venv/lib/python3.11/site-packages/transformers/generation/continuous_batching/cache.py", line 420, '
        "in update\n"
        "    key_states = self.key_cache[layer_idx].index_copy_(0, write_index, key_states)\n"
        "RuntimeError: index_copy_(): Source/destination tensor must have same slice shapes. Destination slice "
        "shape: 8 64 at dimension 0 and source slice shape: 1 512 at dimension 0.\n"
    )
    d = diagnose(head + raised, exit_code=1)
    assert d.kind == "unknown", d.summary
    assert any("index_copy_()" in e.text for e in d.evidence)
    # The same stack ending inside Dynamo (the error raised by Dynamo's own code) is torch.compile's.
    inside = (
        '  File "/venv/lib/python3.11/site-packages/torch/_dynamo/symbolic_convert.py", line 724, in run\n'
        "    and self.step()\n"
        "AssertionError\n"
    )
    assert diagnose(head + inside, exit_code=1).kind == "torch_compile_error"


def test_a_watchdogs_one_minute_wait_is_a_stall_but_not_when_the_server_then_serves() -> None:
    wait = (
        "(EngineCore_DP0 pid=222) INFO 08-15 11:16:19 [shm_broadcast.py:705] No available shared memory broadcast "
        "block found in 60 seconds. This typically happens when some processes are hanging or doing some "
        "time-consuming work (e.g. compilation, weight/kv cache quantization).\n"
    )
    assert diagnose(wait).kind == "startup_timeout"
    served = wait + '(APIServer pid=1) INFO:     127.0.0.1:5110 - "POST /v1/completions HTTP/1.1" 200 OK\n'
    assert diagnose(served).kind == "healthy"


def test_a_supervisors_timeout_error_is_a_startup_timeout_and_a_clients_after_ready_is_not() -> None:
    tail = (
        '  File "/root/deploy.py", line 319, in wait_ready\n'
        '    raise TimeoutError(f"server not ready within {timeout} seconds")\n'
        "TimeoutError: server not ready within 300 seconds\n"
    )
    d = diagnose("Traceback (most recent call last):\n" + tail)
    assert d.kind == "startup_timeout"
    # The exception line is the evidence, not the source line echoed above it.
    assert d.evidence[0].text.startswith("TimeoutError:")
    healthy = (DATA / "variants" / "healthy--vllm-v1-full-startup.log").read_text()
    assert diagnose(healthy + "Traceback (most recent call last):\n" + tail, server="vllm").kind != "startup_timeout"


@pytest.mark.parametrize(
    "line",
    [
        # vLLM: no KV blocks fit, or a negative KV budget; SGLang: a negative profiled token count.
        "INFO 04-27 10:13:05 llm_engine.py:275] # GPU blocks: 0, # CPU blocks: 256",
        "INFO 05-01 10:00:00 [gpu_worker.py:1] Available KV cache memory: -1.25 GiB",
        "[2025-07-02 07:41:59 TP0] max_total_tokens=131072 is larger than the profiled value -561981. Use the profiled "
        "value instead.",
    ],
)
def test_a_kv_budget_printed_zero_or_negative_is_an_oom_sizing_the_pool(line: str) -> None:
    d = diagnose(line + "\n")
    assert d.kind == "gpu_oom"
    assert "KV-cache pool" in d.summary


def test_a_positive_kv_budget_is_no_oom() -> None:
    log = "INFO 05-01 10:00:00 [gpu_worker.py:1] Available KV cache memory: 0.50 GiB\n"
    assert diagnose(log).kind == "inconclusive"


@pytest.mark.parametrize(
    "line",
    [
        "[2024-10-22 06:31:49 TP0] Capture cuda graph begin. This can take up to several minutes.",
        "Capturing CUDA graphs (mixed prefill-decode, PIECEWISE):  34%|███▍      | 23/67 [00:02<00:04,  8.92it/s]",
        "INFO 04-28 20:50:23 model_runner.py:791] Capturing the model for CUDA graphs. This may lead to unexpected "
        "consequences if the model is not static.",
    ],
)
def test_any_servers_capture_announcement_places_a_crash_inside_capture(line: str) -> None:
    crash = "Fatal Python error: Segmentation fault\n"
    assert diagnose(line + "\n" + crash).kind == "cuda_graph_capture_failed"


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b"", "empty"),
        (b"\n\n   \n", "empty"),
        (bytes(range(256)) * 64, "binary"),
        (b"\x89PNG\r\n\x1a\n" + b"\x00\x01\x02\x03" * 4000, "binary"),
        # High bytes that are no UTF-8 (a log in some other multi-byte encoding, or compressed data sans control bytes).
        (bytes(range(128, 256)) * 200, "not utf-8 text"),
    ],
    ids=["empty", "blank", "all-bytes", "png", "high-bytes"],
)
def test_empty_binary_and_undecodable_logs_are_inconclusive_with_the_reason(
    tmp_path: Path, data: bytes, reason: str
) -> None:
    path = tmp_path / "server.log"
    path.write_bytes(data)
    d = diagnose_file(path)
    assert d.kind == "inconclusive"
    assert reason in d.summary
    # An exit status still says something: the process died, and the log cannot say why.
    assert diagnose_file(path, exit_code=1).kind == "unknown"


def test_a_latin1_log_is_still_read_and_a_utf16_log_with_a_byte_order_mark_too(tmp_path: Path) -> None:
    latin = tmp_path / "latin.log"
    latin.write_bytes("D\u00e9marrage du serveur\nOSError: [Errno 98] Address already in use\n".encode("latin-1"))
    assert diagnose_file(latin).kind == "port_in_use"
    path = tmp_path / "utf16.log"
    path.write_bytes("OSError: [Errno 98] Address already in use\r\n".encode("utf-16"))
    assert diagnose_file(path).kind == "port_in_use"


def test_a_log_bigger_than_what_is_kept_still_finds_the_cause_at_its_end(tmp_path: Path) -> None:
    from campaign.logscan import HEAD_LINES

    served = '[2026-12-01 10:00:00] INFO:     127.0.0.1:1 - "POST /generate HTTP/1.1" 200 OK\n'
    noisy = "[2026-12-01 10:00:00 TP0] Decode batch. #running-req: 1, cuda graph: True, token usage: 0.01\n"
    errors = "[2026-12-01 10:00:00 TP0] ERROR ValueError: request 7 rejected\n"
    log = (
        "[2026-12-01 10:00:00] The server is fired up and ready to roll!\n"
        + (served + noisy + errors) * (HEAD_LINES + 10)
        + "[2026-12-01 12:00:00 TP0] RuntimeError: CUDA error: an illegal memory access was encountered\n"
        + "[2026-12-01 12:00:00] Received sigquit from a child process. It usually means the child failed.\n"
    )
    path = tmp_path / "big.log"
    path.write_text(log)
    d = diagnose_file(path)
    assert d.kind == "illegal_memory_access"
    assert d.evidence[0].line == 3 * (HEAD_LINES + 10) + 2


def test_an_inconclusive_diagnosis_renders_without_a_fingerprint(tmp_path: Path) -> None:
    d = diagnose("[2026-12-01 10:00:00 TP0] Load weight begin. avail mem=79.10 GB\n")
    console = Console(record=True, width=200)
    render_diagnosis(console, d)
    text = console.export_text()
    assert "inconclusive" in text and "'load'" in text and "fingerprint" not in text


def test_a_kill_after_the_process_raised_is_its_end_not_host_oom() -> None:
    # The termination line is the messenger: the exception before it is the decisive error, quoted, and the hint is
    # not "add RAM".
    log = (
        "INFO 12-01 10:00:00 [core.py:1] Initializing a V1 LLM engine (v0.9.1)\n"
        "Traceback (most recent call last):\n"
        '  File "/app/worker.py", line 88, in init_device\n'
        "    raise ValueError(f'unsupported rope scaling type {kind!r}')\n"
        "ValueError: unsupported rope scaling type 'yarn2'\n"
        "run.sh: line 12:  4242 Killed                  vllm serve /models/m\n"
    )
    d = diagnose(log, exit_code=137)
    assert d.kind == "unknown"
    assert "ValueError: unsupported rope scaling type 'yarn2'" in d.summary
    assert d.evidence[0].text.startswith("ValueError")
    assert "RAM" not in d.hint
    # The same kill with no exception of the process's own is still the OOM killer's usual work.
    bare = diagnose("INFO 12-01 10:00:00 Loading weights\nrun.sh: line 12:  4242 Killed    vllm serve m\n")
    assert bare.kind == "host_oom_killed"


def test_a_part_of_the_server_failed_is_not_ready_however_ready_the_others_are() -> None:
    # Triton's model table: one model READY, another UNAVAILABLE, then the server starts its endpoints.
    log = (
        "I1204 10:00:01.000 1 server.cc:674]\n"
        "+---------+---------+--------------------------------------------------------------+\n"
        "| Model   | Version | Status                                                       |\n"
        "+---------+---------+--------------------------------------------------------------+\n"
        "| ensemble| 1       | READY                                                        |\n"
        "| llm     | 1       | UNAVAILABLE: Internal: unexpected error when creating model |\n"
        "+---------+---------+--------------------------------------------------------------+\n"
        'I1204 10:00:02.000 1 grpc_server.cc:2451] "Started GRPCInferenceService at 0.0.0.0:8001"\n'
    )
    d = diagnose(log)
    assert d.kind not in ("healthy", "inconclusive")
    assert any("UNAVAILABLE" in e.text for e in d.evidence)
    ready_only = log.replace("UNAVAILABLE: Internal: unexpected error when creating model", "READY" + " " * 53)
    assert diagnose(ready_only).kind == "healthy"


def test_a_capture_fallback_warning_is_not_a_capture_failure() -> None:
    log = (
        "INFO 12-01 10:00:00 [gpu_model_runner.py:1] Capturing CUDA graphs (mixed prefill-decode, PIECEWISE)\n"
        "WARNING 12-01 10:00:05 [cuda_graph.py:2] CUDA graph capture failed for size 512; falling back to eager "
        "for this size\n"
        "INFO 12-01 10:00:09 [gpu_model_runner.py:3] Graph capturing finished in 9 secs\n"
    )
    d = diagnose(log)
    assert d.kind == "inconclusive"
    assert diagnose(log + "INFO:     Application startup complete.\n").kind == "healthy"


def test_a_segfault_while_replaying_a_captured_graph_is_a_graph_failure() -> None:
    log = (
        "[2026-12-01 10:00:00 TP0] Capture cuda graph end. Time elapsed: 12.1 s\n"
        "[2026-12-01 10:00:01] INFO:     Uvicorn running on http://127.0.0.1:30000\n"
        "Fatal Python error: Segmentation fault\n"
        "\n"
        "Thread 0x00007f3a (most recent call first):\n"
        '  File "/sgl/python/sglang/srt/model_executor/cuda_graph_runner.py", line 612 in replay\n'
        '  File "/sgl/python/sglang/srt/model_executor/model_runner.py", line 1203 in forward_decode\n'
    )
    d = diagnose(log)
    assert d.kind == "cuda_graph_capture_failed", d.summary


def test_a_toolchain_that_does_not_know_the_gpu_is_not_told_to_shrink_blocks() -> None:
    log = (
        "Traceback (most recent call last):\n"
        '  File "/usr/lib/python3/site-packages/triton/backends/nvidia/compiler.py", line 338, in make_cubin\n'
        "RuntimeError: Internal Triton PTX codegen error\n"
        "ptxas fatal   : Value 'sm_121a' is not defined for option 'gpu-name'\n"
    )
    d = diagnose(log)
    assert d.kind == "triton_compile_error"
    assert "does not know this GPU" in d.summary
    assert "Reduce" not in d.hint and "reduce" not in d.hint and "newer ptxas" in d.hint
    assert diagnose("RuntimeError: CUDA error: no kernel image is available for execution on the device\n").kind == (
        "unsupported_hardware"
    )


def test_an_external_memory_monitor_killing_workers_is_host_memory() -> None:
    log = (
        "INFO 12-01 10:00:00 Loading weights\n"
        "(raylet) [2026-12-01 10:00:09] Task was killed due to the node running low on memory.\n"
        "Last 5 lines of the memory monitor: Memory on the node was 61.2GB / 62.0GB (0.98); worker killed\n"
    )
    assert diagnose(log).kind == "host_oom_killed"
    assert diagnose("Pod llm-0 container vllm: Last State: Terminated Reason: OOMKilled Exit Code: 137\n").kind == (
        "host_oom_killed"
    )
