"""Our load generator and vLLM's bench client side by side, against one endpoint whose timing is known.

Starts the scheduled endpoint (campaign/bench/testing.py) once. At each concurrency it runs
``campaign.bench.run_bench`` and then ``vllm bench serve`` (backend ``openai-chat``, from a separate venv: see
scripts/vllm_venv.sh) with the same load: the same number of requests at the same concurrency, all queued at once
(``--request-rate inf``), one warm-up request per stream, random prompts of the same words and length, the same
output length with ``ignore_eos``, temperature 0. It reads vLLM's saved result JSON, compares both tools' TTFT,
ITL, TPOT and E2E with the schedule, measures each client's CPU time over its measured part only, prints a table
and writes JSON.

    .venv/bin/python scripts/bench_vs_vllm.py --vllm-python /tmp/vllm-venv/bin/python --out bench_vs_vllm.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
from rich.console import Console
from rich.table import Table

from campaign.bench import PROMPT_WORDS
from campaign.bench.testing import MODEL_ID, ScheduledServer, endpoint_stats, measured_level
from campaign.records import BenchSettings

#: SSE events the endpoint sends per request besides the content tokens: role, finish, usage and [DONE].
EXTRA_EVENTS = 4

# A word-level tokenizer over the same words campaign's random prompts use, so vLLM's random dataset (which needs
# a tokenizer and may not fetch one from a hub here) builds prompts of ``input_len`` of those words, as ours does.
_TOKENIZER_CODE = """
import json, sys
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast
words = json.loads(sys.argv[2])
vocab = {"[UNK]": 0, **{w: i + 1 for i, w in enumerate(words)}}
tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]").save_pretrained(sys.argv[1])
"""

_VERSIONS_CODE = """
import json, platform, importlib.metadata as m
print(json.dumps({"python": platform.python_version(),
                  **{p: m.version(p) for p in ("vllm", "aiohttp", "torch", "transformers", "tokenizers")}}))
"""


def _env() -> dict[str, str]:
    # Offline: nothing may be fetched from a hub. vLLM's aiohttp session trusts the environment's proxy settings,
    # so loopback is exempted explicitly. Unbuffered, so the progress lines arrive when they are printed.
    return {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
        "NO_PROXY": "127.0.0.1,localhost",
        "no_proxy": "127.0.0.1,localhost",
        "PYTHONUNBUFFERED": "1",
    }


def _proc_cpu_s(pid: int) -> float:
    """User + system CPU seconds of a running process (all its threads), from /proc/PID/stat."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _schedule(args: argparse.Namespace) -> dict[str, float]:
    return {
        "ttft_ms": args.ttft_ms,
        "itl_ms": args.itl_ms,
        "tpot_ms": args.itl_ms,
        "e2e_ms": args.ttft_ms + (args.tokens - 1) * args.itl_ms,
    }


def _with_deltas(m: dict[str, Any], sched: dict[str, float]) -> dict[str, Any]:
    for name in ("ttft", "itl", "tpot", "e2e"):
        for stat in ("median", "mean", "p99"):
            v = m[name][stat]
            m[name][f"{stat}_delta_ms"] = None if v is None else v - sched[f"{name}_ms"]
    return m


def run_ours(url: str, c: int, n: int, args: argparse.Namespace) -> dict[str, Any]:
    """campaign's client at concurrency ``c``: ``n`` measured requests after ``c`` warm-up requests."""
    settings = BenchSettings(
        concurrency=[c],
        requests=n,
        warmup=c,
        prompts="random",
        input_len=args.input_len,
        output_len=args.tokens,
        ignore_eos=True,
        temperature=0.0,
        timeout_s=120,
        max_error_rate=0.0,
    )
    # Clocks and the endpoint's counters cover the measured part only, as they do for vLLM below.
    lv, cpu, wall, srv = measured_level(url, settings, MODEL_ID)
    events = lv.output_tokens + EXTRA_EVENTS * lv.successful

    def pick(s: Any) -> dict[str, Any]:
        return {"median": s.median, "mean": s.mean, "p99": s.p99, "p90": s.p90, "count": s.count}

    return {
        "sent": lv.sent,
        "completed": lv.successful,
        "failed": lv.failed + lv.incomplete,
        "errors": lv.errors,
        "output_tokens": lv.output_tokens,
        "duration_s": lv.duration_s,
        "ttft": pick(lv.ttft),
        "itl": pick(lv.itl),
        "tpot": pick(lv.tpot),
        "e2e": pick(lv.e2e),
        "output_tokens_per_s": lv.output_throughput,
        "requests_per_s": lv.request_throughput,
        "client_cpu_s": cpu,
        "client_wall_s": wall,
        "client_cpu_share": cpu / wall,
        "client_cpu_us_per_event": 1e6 * cpu / events if events else None,
        "cpu_measured_over": "process_time() of this process, from the first measured request to the level's end",
        "server_first_token_late_ms": srv["first_token_late"],
        "server_chunk_late_ms": srv["chunk_late"],
    }


def run_vllm(
    vllm: Path, url: str, c: int, n: int, args: argparse.Namespace, tokenizer: Path, work: Path
) -> dict[str, Any]:
    """``vllm bench serve`` at concurrency ``c`` with the same load; its saved JSON, its CPU and the command."""
    name = f"vllm-c{c}.json"
    cmd = [
        str(vllm),
        "bench",
        "serve",
        "--backend",
        "openai-chat",
        "--endpoint",
        "/v1/chat/completions",
        "--base-url",
        url,
        "--model",
        MODEL_ID,
        "--tokenizer",
        str(tokenizer),
        "--dataset-name",
        "random",
        "--random-input-len",
        str(args.input_len),
        "--random-output-len",
        str(args.tokens),
        "--random-range-ratio",
        "0",
        "--ignore-eos",
        "--temperature",
        "0",
        "--seed",
        "0",
        "--num-prompts",
        str(n),
        "--max-concurrency",
        str(c),
        "--request-rate",
        "inf",
        "--num-warmups",
        str(c),
        "--percentile-metrics",
        "ttft,tpot,itl,e2el",
        "--metric-percentiles",
        "50,90,99",
        "--disable-tqdm",
        "--save-result",
        "--result-dir",
        str(work),
        "--result-filename",
        name,
    ]
    log: list[str] = []
    marks: dict[str, float] = {}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, text=True, env=_env()
    )
    assert proc.stdout is not None
    # vLLM prints one line just before its measured requests start (after the tokenizer, the dataset and the
    # warm-up) and one once they are summarised. Its process CPU between the two is the client's cost of the
    # measured part, comparable with ours; the whole process (imports, dataset) is reported beside it.
    for line in proc.stdout:
        log.append(line)
        if line.startswith("Starting main benchmark run"):
            endpoint_stats(url, reset=True)
            marks["cpu0"], marks["wall0"] = _proc_cpu_s(proc.pid), time.perf_counter()
        elif "Serving Benchmark Result" in line and "cpu0" in marks:
            marks["cpu"] = _proc_cpu_s(proc.pid) - marks["cpu0"]
            marks["wall"] = time.perf_counter() - marks["wall0"]
    rc = proc.wait()
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    (work / f"vllm-c{c}.log").write_text("".join(log))
    path = work / name
    if rc != 0 or not path.exists() or "cpu" not in marks:
        tail = "".join(log[-30:])
        raise RuntimeError(f"vllm bench serve failed (exit {rc}) at c={c}:\n{tail}")
    srv = endpoint_stats(url)
    d: dict[str, Any] = json.loads(path.read_text())

    def pick(metric: str) -> dict[str, Any]:
        return {s: d.get(f"{s}_{metric}_ms") for s in ("median", "mean", "p99", "p90")}

    events = d["total_output_tokens"] + EXTRA_EVENTS * d["completed"]
    return {
        "sent": d["completed"] + d["failed"],
        "completed": d["completed"],
        "failed": d["failed"],
        "output_tokens": d["total_output_tokens"],
        "duration_s": d["duration"],
        "ttft": pick("ttft"),
        "itl": pick("itl"),
        "tpot": pick("tpot"),
        "e2e": pick("e2el"),
        "output_tokens_per_s": d["output_throughput"],
        "requests_per_s": d["request_throughput"],
        "client_cpu_s": marks["cpu"],
        "client_wall_s": marks["wall"],
        "client_cpu_share": marks["cpu"] / marks["wall"],
        "client_cpu_us_per_event": 1e6 * marks["cpu"] / events if events else None,
        "cpu_measured_over": "/proc/PID/stat of the vllm process between its 'Starting main benchmark run' "
        "and 'Serving Benchmark Result' lines (10 ms ticks)",
        "process_cpu_s": (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime),
        "server_first_token_late_ms": srv["first_token_late"],
        "server_chunk_late_ms": srv["chunk_late"],
        "command": cmd,
        "result_keys": {k: v for k, v in d.items() if not isinstance(v, list | dict)},
    }


def _fmt(v: float | None, spec: str = ".2f") -> str:
    return "-" if v is None else format(v, spec)


def _table(levels: list[dict[str, Any]], args: argparse.Namespace) -> Table:
    t = Table(
        title=f"campaign vs vllm bench serve (schedule: TTFT {args.ttft_ms:g} ms, ITL {args.itl_ms:g} ms, "
        f"{args.tokens} tokens; medians unless noted, Δ = against the schedule)"
    )
    cols = (
        "streams",
        "client",
        "ok/sent",
        "TTFT med",
        "Δ",
        "mean Δ",
        "p99",
        "ITL med",
        "Δ",
        "mean Δ",
        "p99",
        "TPOT med",
        "Δ",
        "E2E med",
        "Δ",
        "tok/s",
        "req/s",
        "srv late",
        "CPU",
        "µs/event",
    )
    for col in cols:
        t.add_column(col, justify="right")
    for lv in levels:
        for tool in ("ours", "vllm"):
            m = lv[tool]
            t.add_row(
                str(lv["concurrency"]),
                "campaign" if tool == "ours" else "vllm",
                f"{m['completed']}/{m['sent']}",
                _fmt(m["ttft"]["median"]),
                _fmt(m["ttft"]["median_delta_ms"], "+.2f"),
                _fmt(m["ttft"]["mean_delta_ms"], "+.2f"),
                _fmt(m["ttft"]["p99"]),
                _fmt(m["itl"]["median"]),
                _fmt(m["itl"]["median_delta_ms"], "+.2f"),
                _fmt(m["itl"]["mean_delta_ms"], "+.2f"),
                _fmt(m["itl"]["p99"]),
                _fmt(m["tpot"]["median"]),
                _fmt(m["tpot"]["median_delta_ms"], "+.2f"),
                _fmt(m["e2e"]["median"], ".1f"),
                _fmt(m["e2e"]["median_delta_ms"], "+.2f"),
                _fmt(m["output_tokens_per_s"], ".0f"),
                _fmt(m["requests_per_s"], ".2f"),
                _fmt(m["server_chunk_late_ms"].get("median_ms")),
                f"{100 * m['client_cpu_share']:.0f}%",
                _fmt(m["client_cpu_us_per_event"], ".1f"),
            )
        t.add_section()
    return t


def main() -> int:
    """Run both clients at each level, print the table, write the JSON; 2 when the vLLM venv is missing."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--vllm-python", default="/tmp/vllm-venv/bin/python", help="python of the venv holding vLLM")
    p.add_argument("--ttft-ms", type=float, default=50.0)
    p.add_argument("--itl-ms", type=float, default=20.0)
    p.add_argument("--tokens", type=int, default=64, help="output tokens per request")
    p.add_argument("--input-len", type=int, default=32, help="prompt length in words (= tokens of both tokenizers)")
    p.add_argument("--concurrency", default="1,64,256")
    p.add_argument("--requests-per-stream", type=int, default=3, help="measured requests = this x concurrency")
    p.add_argument(
        "--endpoint", choices=("spin", "sleep"), default="spin", help="busy-polling (punctual) or sleeping endpoint"
    )
    p.add_argument("--out", default="bench_vs_vllm.json")
    args = p.parse_args()
    console = Console(highlight=False, width=240)

    py = Path(args.vllm_python)
    vllm = py.parent / "vllm"
    if not py.exists() or not vllm.exists():
        console.print(
            f"[red]no vLLM venv at {py.parent}[/] ({py.name} and vllm needed): build it with "
            f"`bash scripts/vllm_venv.sh {py.parent.parent}`, or pass --vllm-python"
        )
        return 2
    theirs = json.loads(subprocess.run([str(py), "-c", _VERSIONS_CODE], check=True, capture_output=True).stdout)
    sched = _schedule(args)
    loadavg_before = os.getloadavg()
    levels: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="bench-vs-vllm-") as tmp:
        work = Path(tmp)
        tokenizer = work / "tokenizer"
        subprocess.run(
            [str(py), "-c", _TOKENIZER_CODE, str(tokenizer), json.dumps(list(PROMPT_WORDS))], check=True, env=_env()
        )
        with ScheduledServer(ttft_ms=args.ttft_ms, itl_ms=args.itl_ms, spin=args.endpoint == "spin") as srv:
            for c in (int(x) for x in args.concurrency.split(",")):
                n = args.requests_per_stream * c
                console.print(f"c={c}: campaign ({n} requests) ...")
                ours = _with_deltas(run_ours(srv.url, c, n, args), sched)
                console.print(f"c={c}: vllm bench serve ({n} requests) ...")
                vl = _with_deltas(run_vllm(vllm, srv.url, c, n, args, tokenizer, work), sched)
                levels.append(
                    {"concurrency": c, "requests": n, "warmup": c, "schedule": sched, "ours": ours, "vllm": vl}
                )
    console.print(_table(levels, args))
    console.print(
        "srv late: the endpoint's own median lateness per chunk during that run; CPU: the client's CPU time over "
        "the wall time of its measured part; µs/event: that CPU per SSE event received (tokens + 4 per request)"
    )
    # Both tools must have seen the same work, or the comparison means nothing.
    problems = [
        f"c={lv['concurrency']} {tool}: {lv[tool]['completed']}/{lv['requests']} ok, {lv[tool]['output_tokens']} tokens"
        for lv in levels
        for tool in ("ours", "vllm")
        if lv[tool]["completed"] != lv["requests"] or lv[tool]["output_tokens"] != lv["requests"] * args.tokens
    ]
    out = {
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "machine": {
            "cpus": os.cpu_count(),
            "cpus_usable": len(os.sched_getaffinity(0)),
            "platform": platform.platform(),
            "loadavg_before": loadavg_before,
            "loadavg_after": os.getloadavg(),
        },
        "versions": {
            "python": platform.python_version(),
            "httpx": httpx.__version__,
            "vllm_venv": {"path": str(py), **theirs},
        },
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "schedule": {**sched, "tokens": args.tokens, "input_len": args.input_len},
        "endpoint": args.endpoint,
        "levels": levels,
        "problems": problems,
    }
    Path(args.out).write_text(json.dumps(out, indent=2) + "\n")
    console.print(f"wrote {args.out}")
    for line in problems:
        console.print(f"[red]{line}[/]")
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
