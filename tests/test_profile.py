"""The profile step: one bench level under the server's own profiler, summarised into attention, GEMM and the rest.

The reference server runs for real on CPU and is driven over HTTP (its /start_profile and /stop_profile included);
campaigns run through the installed `campaign` command. The summariser reads traces torch.profiler writes in the
test itself; the GPU-kernel path (kernels tied to their launch by correlation ids), which needs a GPU to record,
is checked on events built the way kineto writes them.
"""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from campaign.config import load, load_recipe, plan
from campaign.flags import ServerHelp, check_plan, parse_help
from campaign.hosts.local import LocalHost
from campaign.profile import KernelRules, ProfileTarget, default_rules, profile_level, read_trace, summarise
from campaign.records import BenchSettings, ProfileCall, ProfileEndpoints, ProfileSettings, RunReport
from tests.fixtures.refserver import CPU_ARGS, free_port, start_refserver, stop_refserver, wait_ready

torch = pytest.importorskip("torch")

REPO = Path(__file__).resolve().parents[1]
ENTRY = Path(sys.executable).with_name("campaign")
VLLM_HELP = REPO / "tests" / "data" / "help" / "vllm-0.34.0.txt"


def campaign(*args: str, runs: Path) -> subprocess.CompletedProcess[str]:
    """The installed `campaign` command, as a user runs it."""
    env = {**os.environ, "COLUMNS": "200"}
    return subprocess.run(
        [str(ENTRY), "--runs-dir", str(runs), *args], cwd=REPO, capture_output=True, text=True, timeout=600, env=env
    )


def experiment(tmp_path: Path, name: str, recipe: str = "refserver", **extra: Any) -> Path:
    """A one-variant experiment on this machine's reference server (CPU), with a small bench at c=2."""
    doc: dict[str, Any] = {
        "name": name,
        "host": {"kind": "local", "workdir": str(tmp_path / "work")},
        "recipe": recipe,
        "baseline": {
            "name": "baseline",
            "knobs": {"device": "cpu", "attention": "torch", "cuda_graph": False, "port": free_port()},
        },
        "smoke": {"questions": 2},
        "bench": {"concurrency": [1, 2], "requests": 4, "warmup": 1},
        "timeouts": {"ready_s": 180, "stop_grace_s": 5},
        "at_end": "stop",
        **extra,
    }
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def only_report(runs: Path) -> RunReport:
    (report,) = runs.glob("*/report.json")
    return RunReport.model_validate_json(report.read_text())


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A ready reference server on CPU, shared by the tests that drive its profiler directly."""
    port = free_port()
    log = tmp_path_factory.mktemp("refserver") / "server.log"
    proc = start_refserver(CPU_ARGS, port=port, log_path=log)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(proc, url, log, timeout=180)
        yield url
    finally:
        stop_refserver(proc)


# ---------------------------------------------------------------------------------------------------------------------
# Through `campaign run`, `show` and `compare`


def test_a_profiled_run_records_where_decode_time_goes(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    cfg = experiment(tmp_path, "profiled", profile={"level": 2, "requests": 4})
    res = campaign("run", str(cfg), runs=runs)
    assert res.returncode == 0, res.stdout + res.stderr
    report = only_report(runs)
    (att,) = report.attempts
    assert att.outcome == "passed" and att.bench is not None
    p = att.profile
    assert p is not None and p.status == "measured", p
    assert p.level == "c=2" and p.device == "cpu" and p.scope == "decode"
    # The classes add up to the profiled total; attention (the torch reference's einsum/bmm path) is a real share.
    assert [c.name for c in p.classes] == ["attention", "gemm", "other"]
    assert p.attention_ms + p.gemm_ms + p.other_ms == pytest.approx(p.total_ms, rel=1e-9)
    assert sum(c.share for c in p.classes) == pytest.approx(1.0)
    assert p.attention_share is not None and 0.0 < p.attention_share < 1.0
    assert p.gemm_share is not None and 0.0 < p.gemm_share < 1.0
    names = {k.name for c in p.classes if c.name == "attention" for k in c.top}
    assert "aten::bmm" in names, p.classes
    assert p.bench is not None and p.bench.successful == 4
    # The trace is in the run folder, and reading it again gives the recorded breakdown.
    (rel,) = p.trace_files
    trace = runs / report.run_id / rel
    assert trace.is_file() and trace.stat().st_size > 0
    again = summarise([read_trace(trace.read_bytes())])
    assert again.total_ms == pytest.approx(p.total_ms) and again.attention_ms == pytest.approx(p.attention_ms)

    shown = campaign("show", report.run_id, runs=runs)
    assert shown.returncode == 0, shown.stderr
    assert "#0 profile at c=2" in shown.stdout and "decode steps" in shown.stdout
    assert f"{100 * p.attention_share:.1f}%" in shown.stdout and "aten::bmm" in shown.stdout

    compared = campaign("compare", report.run_id, "--json", runs=runs)
    assert compared.returncode == 0, compared.stderr
    doc = json.loads(compared.stdout)
    (col,) = doc["profiles"]
    assert col["status"] == "measured" and col["attention_share"] == pytest.approx(p.attention_share)
    (section,) = [t for t in doc["tables"] if t["title"].startswith("Profile")]
    assert ["attention share", f"{100 * p.attention_share:.1f}%"] in section["rows"]
    md = campaign("compare", report.run_id, "--md", runs=runs)
    assert "## Profile" in md.stdout and "| attention share |" in md.stdout


def test_a_recipe_without_profiler_endpoints_says_so_and_the_attempt_passes(tmp_path: Path) -> None:
    """The reference server launched through a recipe that declares no profiler: a note, not a failure."""
    recipe = yaml.safe_load((REPO / "campaign" / "recipes" / "refserver.yaml").read_text())
    del recipe["profile"]
    recipe["name"] = "refserver-noprofile"
    recipe_file = tmp_path / "refserver-noprofile.yaml"
    recipe_file.write_text(yaml.safe_dump(recipe))
    runs = tmp_path / "runs"
    cfg = experiment(tmp_path, "unprofiled", recipe=str(recipe_file), profile={"level": 1})
    res = campaign("run", str(cfg), runs=runs)
    assert res.returncode == 0, res.stdout + res.stderr
    (att,) = only_report(runs).attempts
    assert att.outcome == "passed" and att.bench is not None
    assert att.profile is not None and att.profile.status == "unavailable"
    assert "profile is not available for recipe refserver-noprofile" in att.profile.note
    assert "not available" in res.stdout
    assert not (runs / only_report(runs).run_id / "profiles").exists()


def test_profile_blocks_that_cannot_run_are_refused_at_load(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    no_bench = experiment(tmp_path, "nobench", profile={"level": 2})
    doc = yaml.safe_load(no_bench.read_text())
    del doc["bench"]
    no_bench.write_text(yaml.safe_dump(doc, sort_keys=False))
    res = campaign("run", "--dry-run", str(no_bench), runs=runs)
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert "a profile runs one level of the bench" in res.stderr and "profile" in res.stderr

    fine = experiment(tmp_path, "fine", profile={"level": 2, "requests": 3})
    res = campaign("run", "--dry-run", str(fine), runs=runs)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "Profile (each variant): c=2 again with 3 requests between /start_profile and /stop_profile" in res.stdout

    wrong = experiment(tmp_path, "wronglevel", profile={"level": 8})
    res = campaign("run", "--dry-run", str(wrong), runs=runs)
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert "level 8 is not a level of the bench (concurrency: 1, 2)" in res.stderr
    assert "profile.level" in res.stderr


# ---------------------------------------------------------------------------------------------------------------------
# The reference server's endpoints, and the step against them


def test_the_reference_servers_profiler_over_http(server: str, tmp_path: Path) -> None:
    refused = httpx.post(server + "/stop_profile", timeout=30)
    assert refused.status_code == 409 and "no profile is running" in refused.json()["error"]["message"]
    bad = httpx.post(server + "/start_profile", json={"output_dir": str(tmp_path), "activities": ["TPU"]}, timeout=30)
    assert bad.status_code == 400 and "unknown activities" in bad.json()["error"]["message"]
    nowhere = httpx.post(server + "/start_profile", timeout=30)
    assert nowhere.status_code == 400 and "REFSERVER_TORCH_PROFILER_DIR" in nowhere.json()["error"]["message"]

    started = httpx.post(server + "/start_profile", json={"output_dir": str(tmp_path / "traces")}, timeout=30)
    assert started.status_code == 200 and started.json()["activities"] == ["CPU"]
    again = httpx.post(server + "/start_profile", json={"output_dir": str(tmp_path)}, timeout=30)
    assert again.status_code == 409
    reply = httpx.post(
        server + "/v1/chat/completions",
        json={"messages": [{"role": "user", "content": "What is 12+30?"}], "max_tokens": 8, "temperature": 0},
        timeout=60,
    )
    assert reply.status_code == 200
    stopped = httpx.post(server + "/stop_profile", timeout=120).json()
    trace = Path(stopped["trace"])
    assert trace.parent == tmp_path / "traces" and trace.stat().st_size == stopped["bytes"] > 0
    events = read_trace(trace.read_bytes())
    # The scheduler thread's ops are in it, not only the HTTP thread's: the decode step ran there.
    result = summarise([events])
    assert result.status == "measured" and result.scope == "decode" and result.attention_ms > 0


def test_a_server_that_refuses_to_profile_is_a_note(server: str, tmp_path: Path) -> None:
    """A server without the endpoint (vLLM started without --profiler-config answers 404): unavailable, and why."""
    endpoints = ProfileEndpoints(start=ProfileCall(path="/no_profiler_here"), stop=ProfileCall(path="/stop_profile"))
    host = LocalHost()
    target = ProfileTarget(host, server, str(tmp_path / "attempt"), "t", tmp_path / "copies", "profiles/00-x")
    bench = BenchSettings(concurrency=[1], requests=2, warmup=0)
    found = profile_level(target, endpoints, "somesrv", ProfileSettings(), bench, poll_s=0.05)
    assert found.status == "unavailable" and "HTTP 404" in found.note and found.bench is not None
    assert not (tmp_path / "copies").exists()


# ---------------------------------------------------------------------------------------------------------------------
# The summariser on real torch.profiler traces


def _record_trace(path: Path) -> None:
    """A trace of a scheduler-like thread: a prefill step, then decode steps through our kernels' torch backend."""
    from mla_kernels import sparse_mla_decode

    linear = torch.nn.Linear(64, 64)
    q = torch.randn(2, 4, 80)
    kv = torch.randn(32, 80)
    idx = torch.arange(16, dtype=torch.int32).repeat(2, 1)
    # Large enough that relu's time stays among the five largest of its class on a loaded machine (it once fell
    # behind randn and the other small ops there).
    activations = torch.randn(512, 1024)

    def _prefill() -> None:
        linear(torch.randn(16, 64))

    def _launch_decode() -> None:
        linear(torch.randn(2, 64))
        torch.relu(activations)
        sparse_mla_decode(q, kv, idx, 0.1, "torch", d_v=64)

    go = threading.Event()

    def scheduler() -> None:
        go.wait(timeout=60)
        with torch.no_grad():
            _prefill()
            for _ in range(3):
                _launch_decode()

    from campaign.refserver.profiler import _all_threads

    # The scheduler thread exists before the profiler starts, as the server's does (Python stacks are recorded
    # for the threads alive at the start).
    worker = threading.Thread(target=scheduler)
    worker.start()
    prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], with_stack=True, **_all_threads())
    prof.start()
    go.set()
    worker.join()
    time.sleep(0.01)
    prof.stop()
    prof.export_chrome_trace(str(path))


def test_the_summariser_classifies_the_ops_of_a_real_trace(tmp_path: Path) -> None:
    path = tmp_path / "t.json"
    _record_trace(path)
    events = read_trace(path.read_bytes())
    result = summarise([events])
    assert result.status == "measured" and result.device == "cpu" and result.scope == "decode"
    by = {c.name: {k.name: k for k in c.top} for c in result.classes}
    # nn.Linear is GEMM (aten::addmm under aten::linear); relu is other; everything sparse_mla_decode ran is
    # attention, the bmm of its einsums and the gather (index_select) alike.
    assert "aten::addmm" in by["gemm"] and by["gemm"]["aten::addmm"].count == 3  # the prefill's is not summed
    assert "aten::relu" in by["other"]
    assert "aten::bmm" in by["attention"] and "aten::einsum" in by["attention"]
    assert all(name not in by["other"] for name in ("aten::bmm", "aten::index_select", "aten::addmm"))
    assert result.total_ms == pytest.approx(sum(c.time_ms for c in result.classes))
    # Self times: no op counted with the time of the ops it called.
    linear_ops = [e for e in events if e.get("cat") == "cpu_op" and e["name"] in ("aten::linear", "aten::addmm")]
    assert by["gemm"]["aten::linear"].time_ms < sum(e["dur"] for e in linear_ops if e["name"] == "aten::linear")
    # Gzipped, as SGLang and vLLM write them, it reads the same.
    gz = read_trace(gzip.compress(path.read_bytes()))
    assert summarise([gz]).total_ms == pytest.approx(result.total_ms)


def test_the_rules_are_data(tmp_path: Path) -> None:
    path = tmp_path / "t.json"
    _record_trace(path)
    events = read_trace(path.read_bytes())
    # Without decode scopes the whole trace counts; with relu named a GEMM op it moves there.
    rules = KernelRules.parse({"gemm": {"ops": ["aten::relu", "aten::addmm"]}}, "test rules")
    result = summarise([events], rules)
    assert result.scope == "all" and result.attention_ms == 0.0
    gemm = {k.name: k for c in result.classes if c.name == "gemm" for k in c.top}
    assert "aten::relu" in gemm and gemm["aten::addmm"].count == 4  # the prefill's too
    with pytest.raises(ValueError, match=r"test rules: gemm.ops: '\(' is not a valid regular expression"):
        KernelRules.parse({"gemm": {"ops": ["("]}}, "test rules")
    with pytest.raises(ValueError, match="unknown keys"):
        KernelRules.parse({"softmax": {}}, "test rules")
    with pytest.raises(ValueError, match="not a JSON trace"):
        read_trace(b"<html>", "x.json")


def test_gpu_kernels_take_the_scope_of_their_launch_and_else_their_name() -> None:
    """Kernels are tied to the runtime call that launched them by correlation id, as kineto writes GPU traces."""

    def rng(name: str, cat: str, ts: float, dur: float, corr: int | None = None) -> dict[str, Any]:
        args = {"correlation": corr} if corr is not None else {}
        return {"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": 1, "ts": ts, "dur": dur, "args": args}

    def kernel(name: str, ts: float, dur: float, corr: int, cat: str = "kernel") -> dict[str, Any]:
        args = {"correlation": corr, "stream": 7}
        return {"ph": "X", "cat": cat, "name": name, "pid": 0, "tid": 7, "ts": ts, "dur": dur, "args": args}

    events = [
        rng("engine.py(297): _launch_decode", "python_function", 0, 1000),
        rng("mla_kernels/decode.py(47): sparse_mla_decode", "python_function", 10, 100),
        rng("aten::bmm", "cpu_op", 20, 50),
        rng("cudaLaunchKernel", "cuda_runtime", 30, 5, corr=1),
        rng("aten::linear", "cpu_op", 200, 50),
        rng("cudaLaunchKernel", "cuda_runtime", 210, 5, corr=2),
        rng("cudaLaunchKernel", "cuda_runtime", 300, 5, corr=3),
        rng("cudaGraphLaunch", "cuda_runtime", 400, 5, corr=4),
        rng("cudaMemcpyAsync", "cuda_runtime", 500, 5, corr=5),
        rng("engine.py(279): _prefill", "python_function", 2000, 100),
        rng("cudaLaunchKernel", "cuda_runtime", 2010, 5, corr=6),
        kernel("ampere_sgemm_128x64_nn", 40, 30.0, 1),  # a GEMM kernel issued by the attention code
        kernel("nvjet_tst_192x128_64x4_1x2_h_bz_coopA_NNT", 220, 20.0, 2),
        kernel("triton_poi_fused_add_rms_norm_0", 310, 5.0, 3),
        kernel("_mma_decode_kernel", 410, 40.0, 4),  # in a CUDA graph: only its name tells
        kernel("Memcpy HtoD (Pageable -> Device)", 510, 5.0, 5, cat="gpu_memcpy"),
        kernel("sm90_xmma_gemm_bf16bf16_bf16f32", 2020, 500.0, 6),  # prefill: not summed
    ]
    result = summarise([events], default_rules())
    assert result.device == "gpu" and result.scope == "decode" and result.events == 5
    assert result.attention_ms == pytest.approx(0.070) and result.gemm_ms == pytest.approx(0.020)
    assert result.other_ms == pytest.approx(0.010) and result.total_ms == pytest.approx(0.100)
    assert result.attention_share == pytest.approx(0.7)


# ---------------------------------------------------------------------------------------------------------------------
# Engines' recipes


def test_a_profiled_vllm_experiment_launches_with_a_profiler_config_its_help_lists(tmp_path: Path) -> None:
    cfg = tmp_path / "v.yaml"
    cfg.write_text(
        yaml.safe_dump(
            {
                "name": "vprof",
                "recipe": "vllm",
                "vars": {"model": "some/model"},
                "bench": {"concurrency": [32], "requests": 64},
                "profile": {"level": 32, "dir": "/scratch/traces"},
            }
        )
    )
    loaded = load(str(cfg))
    (pv,) = plan(loaded.experiment, loaded.recipe)
    assert pv.spec.command[-2:] == [
        "--profiler-config.profiler=torch",
        "--profiler-config.torch_profiler_dir=/scratch/traces/vprof",
    ]
    help_ = ServerHelp("vllm", "local", "0.34.0", "host", parse_help(VLLM_HELP.read_text()))
    assert check_plan(loaded.experiment, loaded.recipe, [pv], help_) == []
    # Without a profile block nothing is added, and SGLang is told its folder at start time, not at launch.
    doc = yaml.safe_load(cfg.read_text())
    del doc["profile"]
    cfg.write_text(yaml.safe_dump(doc))
    plain = load(str(cfg))
    assert not any("profiler" in a for a in plan(plain.experiment, plain.recipe)[0].spec.command)
    sglang = load_recipe("sglang").profile
    assert sglang is not None and not sglang.launch_args and sglang.start.body is not None
    assert sglang.start.body["output_dir"] == "{output_dir}" and load_recipe("transformers").profile is None


def test_a_profiled_run_can_ask_for_fewer_tokens_than_the_bench() -> None:
    # A trace grows with every decode step (272 MB for 4 requests of 512 tokens at 8k contexts on the H200), so the
    # profiled run may ask for fewer tokens; everything else about the level stays the bench's.
    bench = BenchSettings.model_validate(
        {"prompts": "long-context", "input_len": 8192, "output_len": 512, "concurrency": [32], "requests": 64}
    )
    short = ProfileSettings(level=32, requests=4, output_len=32).run_settings(bench)
    assert (short.output_len, short.effective_max_tokens(), short.requests) == (32, 32, 4)
    assert (short.input_len, short.prompts, short.concurrency) == (8192, "long-context", [32])
    same = ProfileSettings(level=32).run_settings(bench)
    assert (same.output_len, same.effective_max_tokens(), same.requests) == (512, 512, 64)
