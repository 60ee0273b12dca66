"""Fingerprints: the same failure seen again is recognised; different causes are told apart."""

from __future__ import annotations

import json
from pathlib import Path

from campaign.diagnose import diagnose
from campaign.fingerprint import fingerprint, normalise, strip_prefix

DATA = Path(__file__).parent / "data"

# One OOM during KV allocation, as two different runs on two different boxes print it.
_OOM_RUN = """\
[{ts} TP{rank}] Load weight end. type=LlamaForCausalLM, dtype=torch.bfloat16, avail mem={avail} GB
[{ts} TP{rank}] Scheduler hit an exception: Traceback (most recent call last):
  File "{site}/sglang/srt/mem_cache/memory_pool.py", line 508, in _create_buffers
    torch.zeros((self.size + self.page_size, self.head_num), device=self.device)
torch.OutOfMemoryError: CUDA out of memory. Tried to allocate {alloc} GiB. GPU {rank} has a total capacity of \
79.19 GiB of which {free} MiB is free. Process {pid} has 78.10 GiB memory in use.
[{ts}] Received sigquit from a child process. It usually means the child failed.
Killed
"""


def test_normalise_drops_what_varies_between_runs() -> None:
    a = normalise(
        "[2025-10-06 20:05:22 DP0 TP3] ptr 0x7f2a5c1b3f78 in /tmp/tmpuca253mo/main.c on port 30011 (pid=3125)"
    )
    b = normalise("[2026-01-01 01:00:00 DP1 TP0] ptr 0x55555d5d7420 in /tmp/tmpab12cd34/main.c on port 8000 (pid=77)")
    assert a == b
    assert "<addr>" in a and "main.c" in a and "tmpuca253mo" not in a


def test_strip_prefix_removes_logging_prefixes_and_colour() -> None:
    line = "\x1b[0;36m(VllmWorker rank=1 pid=115)\x1b[0;0m ERROR 07-27 23:31:27 [multiproc.py:522] RuntimeError: x"
    assert strip_prefix(line) == "RuntimeError: x"
    assert strip_prefix("^[[0;36m(APIServer pid=31)^[[0;0m INFO 02-03 19:00:05 [hf.py:310] Detected") == "Detected"
    assert strip_prefix("ollama  | llama_model_load: error loading model") == "llama_model_load: error loading model"


def test_the_same_failure_in_two_runs_has_one_fingerprint() -> None:
    # (timestamp, rank, avail GB, site-packages, GiB asked, MiB free, pid): everything that differs between two boxes.
    runs = [
        ("2026-11-01 10:00:01", 0, "2.31", "/usr/local/lib/python3.10/dist-packages", "1.25", "913.50", 4412),
        ("2026-11-29 23:59:59", 3, "1.07", "/opt/conda/envs/sgl/lib/python3.11/site-packages", "3.00", "12.00", 98765),
    ]
    keys = ("ts", "rank", "avail", "site", "alloc", "free", "pid")
    a, b = (diagnose(_OOM_RUN.format(**dict(zip(keys, run, strict=True))), server="sglang") for run in runs)
    assert a.kind == b.kind == "gpu_oom"
    assert a.fingerprint == b.fingerprint


def test_different_causes_have_different_fingerprints() -> None:
    records = [json.loads(line) for line in (DATA / "real-failures.jsonl").read_text().splitlines() if line.strip()]
    by_print: dict[str | None, set[str]] = {}
    for r in records:
        d = diagnose(r["excerpt"])
        by_print.setdefault(d.fingerprint, set()).add(d.kind)
    assert all(len(kinds) == 1 for kinds in by_print.values())
    # Two OOMs with different messages are two fingerprints too: the evidence text counts, not only the kind.
    oom_prints = {p for p, kinds in by_print.items() if kinds == {"gpu_oom"}}
    assert len(oom_prints) > 1


def test_repeated_lines_count_once_and_kind_counts() -> None:
    line = "RuntimeError: CUDA error: an illegal memory access was encountered"
    assert fingerprint("illegal_memory_access", [line]) == fingerprint("illegal_memory_access", [line, line])
    assert fingerprint("illegal_memory_access", [line]) != fingerprint("gpu_oom", [line])
    assert len(fingerprint("x", [])) == 16


def test_two_real_reference_server_runs_of_one_failure_share_a_fingerprint() -> None:
    # Captured from `python -m campaign.refserver --device cpu` with CUDA graphs on, attention torch and mma,
    # minutes apart on different ports.
    variants = DATA / "variants"
    torch_run = diagnose((variants / "unsupported_hardware--refserver-real-cuda-graph-on-cpu.log").read_text())
    mma_run = diagnose((variants / "unsupported_hardware--refserver-real-cuda-graph-on-cpu-mma.log").read_text())
    assert torch_run.kind == mma_run.kind == "unsupported_hardware"
    assert torch_run.fingerprint == mma_run.fingerprint
    port_held = diagnose((variants / "port_in_use--refserver-real-port-held.log").read_text())
    assert port_held.fingerprint != torch_run.fingerprint
