"""The profile step: one bench level run again under the server's own profiler, and where its time went.

``profile_level`` starts the recipe's profiler (its ``profile:`` endpoints: SGLang's and vLLM's ``/start_profile``
and ``/stop_profile``, the reference server's own), runs the chosen level's requests, stops it, waits for the traces
to be written on the host, copies them into the run folder and summarises them with ``summarise``. It never raises
for a profile that cannot be taken: the returned ``ProfileResult`` says ``unavailable`` or ``failed`` and why, and
the attempt goes on (a profile explains a measurement; it is not one the attempt is judged by).

``summarise`` is pure: Chrome traces in (as torch.profiler exports them, gzipped or not), a ``ProfileResult`` out.
Which time is attention, GEMM or other is data (``campaign/kernel_classes.yaml``, read by ``KernelRules``):

- A GPU trace sums device kernel durations (memcpy and memset count as other); a trace without kernels (a CPU-only
  server) sums the self time of CPU ops (an op's time less the ops it called), so nothing is counted twice.
- An event takes the class of the innermost range around it that a rule's ``scopes`` names (the Python function,
  annotation or op that issued it: for a kernel, the range around its launch), else of its own name.
- When ranges mark decode steps (``decode_scopes``), only the time inside them is summed (``scope: decode``).
"""

from __future__ import annotations

import gzip
import json
import re
import shlex
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

import httpx
import yaml

from campaign.bench import run_bench
from campaign.errors import BenchError, CampaignError
from campaign.hosts.base import Host
from campaign.records import BenchEvent, BenchSettings
from campaign.records.profile import (
    KERNEL_CLASSES,
    ClassTime,
    KernelTime,
    ProfileEndpoints,
    ProfileResult,
    ProfileSettings,
    fill,
)

#: Trace events that are ranges on a CPU thread (what scopes and self times are made of).
_CPU_CATS = frozenset({"cpu_op", "python_function", "user_annotation", "cuda_runtime", "cuda_driver", "Runtime"})
#: Trace events that are device time.
_DEVICE_CATS = frozenset({"kernel", "Kernel", "gpu_memcpy", "Memcpy", "gpu_memset", "Memset"})
_KERNEL_CATS = frozenset({"kernel", "Kernel"})
#: Largest kernels listed per class.
TOP = 5


# ---------------------------------------------------------------------------------------------------------------------
# The rules


@dataclass(frozen=True)
class ClassRule:
    """The patterns of one class: the ranges that make an event theirs, and the kernel and op names."""

    name: str
    scopes: tuple[re.Pattern[str], ...] = ()
    kernels: tuple[re.Pattern[str], ...] = ()
    ops: tuple[re.Pattern[str], ...] = ()


@dataclass(frozen=True)
class KernelRules:
    """The classification rules of ``campaign/kernel_classes.yaml`` (or another file of that shape)."""

    classes: tuple[ClassRule, ...]
    decode_scopes: tuple[re.Pattern[str], ...]

    @classmethod
    def parse(cls, data: Mapping[str, Any], label: str) -> KernelRules:
        """Rules from parsed YAML; ``ValueError`` naming ``label`` and the key when a pattern or a key is wrong."""

        def patterns(where: str, values: Any) -> tuple[re.Pattern[str], ...]:
            if values is None:
                return ()
            if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
                raise ValueError(f"{label}: {where} must be a list of regular expressions")
            out = []
            for v in values:
                try:
                    out.append(re.compile(v, re.IGNORECASE))
                except re.error as e:
                    raise ValueError(f"{label}: {where}: {v!r} is not a valid regular expression: {e}") from e
            return tuple(out)

        unknown = set(data) - {"decode_scopes", *KERNEL_CLASSES[:-1]}
        if unknown:
            raise ValueError(f"{label}: unknown keys {sorted(unknown)}; the classes are attention and gemm")
        classes = []
        for name in KERNEL_CLASSES[:-1]:
            spec = data.get(name) or {}
            if not isinstance(spec, dict) or set(spec) - {"scopes", "kernels", "ops"}:
                raise ValueError(f"{label}: {name} takes scopes, kernels and ops")
            classes.append(
                ClassRule(
                    name,
                    patterns(f"{name}.scopes", spec.get("scopes")),
                    patterns(f"{name}.kernels", spec.get("kernels")),
                    patterns(f"{name}.ops", spec.get("ops")),
                )
            )
        return cls(tuple(classes), patterns("decode_scopes", data.get("decode_scopes")))

    def by_scope(self, names: Iterable[str]) -> str | None:
        """The class the innermost named range gives, or None (``names`` innermost first)."""
        for name in names:
            for rule in self.classes:
                if any(p.search(name) for p in rule.scopes):
                    return rule.name
        return None

    def by_name(self, name: str, *, kernel: bool) -> str:
        """The class of an event by its own name: ``attention``, ``gemm`` or ``other``."""
        for rule in self.classes:
            if any(p.search(name) for p in (rule.kernels if kernel else rule.ops)):
                return rule.name
        return "other"

    def in_decode(self, names: Iterable[str]) -> bool:
        """Whether one of the ranges ``names`` is a decode step."""
        return any(p.search(n) for n in names for p in self.decode_scopes)


@cache
def default_rules() -> KernelRules:
    """The rules shipped in ``campaign/kernel_classes.yaml``."""
    text = resources.files("campaign").joinpath("kernel_classes.yaml").read_text()
    return KernelRules.parse(yaml.safe_load(text), "campaign/kernel_classes.yaml")


# ---------------------------------------------------------------------------------------------------------------------
# Traces


def read_trace(data: bytes, label: str = "trace") -> list[dict[str, Any]]:
    """The events of one Chrome trace (JSON, gzipped or not); ``ValueError`` when it is neither."""
    if data[:2] == b"\x1f\x8b":
        try:
            data = gzip.decompress(data)
        except (OSError, EOFError) as e:
            raise ValueError(f"{label}: a gzip file that does not decompress ({e})") from e
    try:
        doc = json.loads(data)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{label}: not a JSON trace ({e})") from e
    events = doc.get("traceEvents") if isinstance(doc, dict) else doc
    if not isinstance(events, list):
        raise ValueError(f"{label}: no traceEvents list in it")
    return [e for e in events if isinstance(e, dict)]


@dataclass
class _Range:
    name: str
    cat: str
    start: float
    end: float
    parent: _Range | None = None
    #: Time of the nearest CPU ops inside it (subtracted for its self time).
    inner_ops: float = 0.0


def _ranges(events: Sequence[dict[str, Any]], offset: int) -> tuple[list[_Range], dict[int, _Range]]:
    """CPU ranges nested per thread, and the runtime call of each correlation id (``offset`` keeps files apart)."""
    by_thread: dict[tuple[Any, Any], list[_Range]] = defaultdict(list)
    launches: dict[int, _Range] = {}
    for e in events:
        if e.get("ph") != "X" or e.get("cat") not in _CPU_CATS:
            continue
        try:
            start, dur = float(e["ts"]), float(e.get("dur", 0.0))
        except (KeyError, TypeError, ValueError):
            continue
        r = _Range(str(e.get("name", "")), str(e["cat"]), start, start + dur)
        by_thread[(e.get("pid"), e.get("tid"))].append(r)
        corr = (e.get("args") or {}).get("correlation")
        if isinstance(corr, int) and e["cat"] in ("cuda_runtime", "cuda_driver", "Runtime"):
            launches[offset + corr] = r
    every: list[_Range] = []
    for ranges in by_thread.values():
        ranges.sort(key=lambda r: (r.start, -r.end))
        stack: list[_Range] = []
        for r in ranges:
            while stack and stack[-1].end <= r.start:
                stack.pop()
            r.parent = stack[-1] if stack else None
            if r.cat == "cpu_op":
                op = r.parent
                while op is not None and op.cat != "cpu_op":
                    op = op.parent
                if op is not None:
                    op.inner_ops += r.end - r.start
            stack.append(r)
        every.extend(ranges)
    return every, launches


class _Scopes:
    """What the ranges around an event say (its scope's class, whether it is in a decode step), once per range.

    ``KernelRules.by_scope`` and ``in_decode`` over a range's whole chain cost its depth times the patterns, and a
    trace with Python stacks is millions of ranges tens of frames deep (a 272 MB H200 trace took minutes). A range's
    answer is its own name's or else its parent's, so each range is matched once and its answer reused below it.
    """

    def __init__(self, rules: KernelRules) -> None:
        self.rules = rules
        self._scope: dict[int, str | None] = {}
        self._decode: dict[int, bool] = {}

    def _walk(self, r: _Range | None, memo: dict[int, Any], own: Callable[[str], Any], empty: Any) -> Any:
        # Up to the first range already answered, then down again filling in: iterative, stacks can be deep.
        path: list[_Range] = []
        while r is not None and id(r) not in memo:
            path.append(r)
            r = r.parent
        answer = memo[id(r)] if r is not None else empty
        for node in reversed(path):
            mine = own(node.name)
            answer = mine if mine not in (None, False) else answer
            memo[id(node)] = answer
        return answer

    def scope(self, r: _Range | None) -> str | None:
        """``KernelRules.by_scope`` of ``r``'s chain (``r`` itself included)."""
        result: str | None = self._walk(r, self._scope, lambda n: self.rules.by_scope((n,)), None)
        return result

    def decode(self, r: _Range | None) -> bool:
        """``KernelRules.in_decode`` of ``r``'s chain."""
        return bool(self._walk(r, self._decode, lambda n: self.rules.in_decode((n,)), False))


def summarise(traces: Sequence[Sequence[dict[str, Any]]], rules: KernelRules | None = None) -> ProfileResult:
    """The breakdown of the events of ``traces`` (one list per file) into attention, GEMM and other."""
    rules = rules or default_rules()
    scopes = _Scopes(rules)
    # (class, name, microseconds, in decode)
    items: list[tuple[str, str, float, bool]] = []
    device_items: list[tuple[str, str, float, bool]] = []
    for i, events in enumerate(traces):
        offset = i << 40
        ranges, launches = _ranges(events, offset)
        for r in ranges:
            if r.cat != "cpu_op":
                continue
            cls = scopes.scope(r.parent) or rules.by_name(r.name, kernel=False)
            items.append((cls, r.name, max(0.0, r.end - r.start - r.inner_ops), scopes.decode(r)))
        for e in events:
            if e.get("ph") != "X" or e.get("cat") not in _DEVICE_CATS:
                continue
            try:
                dur = float(e.get("dur", 0.0))
            except (TypeError, ValueError):
                continue
            name = str(e.get("name", ""))
            corr = (e.get("args") or {}).get("correlation")
            launch = launches.get(offset + corr) if isinstance(corr, int) else None
            kernel = e["cat"] in _KERNEL_CATS
            cls = (scopes.scope(launch) or rules.by_name(name, kernel=True)) if kernel else "other"
            device_items.append((cls, name, dur, scopes.decode(launch)))
    device = "gpu" if device_items else "cpu"
    chosen = device_items if device == "gpu" else items
    decode = [it for it in chosen if it[3]]
    scope = "decode" if decode else "all"
    summed = decode if decode else chosen
    if not summed:
        return ProfileResult(status="failed", note="the trace holds no kernels and no CPU ops", device=None)
    per: dict[str, dict[str, list[float]]] = {c: defaultdict(lambda: [0.0, 0.0]) for c in KERNEL_CLASSES}
    for cls, name, us, _ in summed:
        slot = per[cls][name]
        slot[0] += us
        slot[1] += 1
    total_us = sum(us for _, _, us, _ in summed)
    classes = []
    for c in KERNEL_CLASSES:
        us = sum(v[0] for v in per[c].values())
        top = sorted(per[c].items(), key=lambda kv: -kv[1][0])[:TOP]
        classes.append(
            ClassTime(
                name=c,  # type: ignore[arg-type]
                time_ms=us / 1000.0,
                share=us / total_us if total_us > 0 else 0.0,
                count=int(sum(v[1] for v in per[c].values())),
                top=[KernelTime(name=n, time_ms=v[0] / 1000.0, count=int(v[1])) for n, v in top],
            )
        )
    by = {c.name: c for c in classes}
    return ProfileResult(
        status="measured",
        device=device,  # type: ignore[arg-type]
        scope=scope,  # type: ignore[arg-type]
        total_ms=total_us / 1000.0,
        attention_ms=by["attention"].time_ms,
        gemm_ms=by["gemm"].time_ms,
        other_ms=by["other"].time_ms,
        attention_share=by["attention"].share,
        gemm_share=by["gemm"].share,
        other_share=by["other"].share,
        classes=classes,
        events=len(summed),
    )


# ---------------------------------------------------------------------------------------------------------------------
# The step


def _listing(host: Host, folder: str) -> dict[str, int]:
    """Trace files under ``folder`` on the host and their sizes (empty when it does not exist)."""
    q = shlex.quote(folder)
    res = host.run(
        f"[ -d {q} ] && find {q} -type f \\( -name '*.json' -o -name '*.json.gz' \\) -exec wc -c {{}} + 2>/dev/null",
        timeout=60,
    )
    out: dict[str, int] = {}
    for line in res.stdout.splitlines():
        size, _, path = line.strip().partition(" ")
        if size.isdigit() and path and path != "total":
            out[path] = int(size)
    return out


@dataclass
class ProfileTarget:
    """Where one attempt is profiled: its server, its folder on the host, and where copies go locally."""

    host: Host
    base_url: str
    #: The attempt's folder on the host (its traces go to ``<remote_dir>/profile``).
    remote_dir: str
    experiment: str
    #: The local folder the traces are copied into, and its path relative to the run folder.
    local_dir: Path
    rel_dir: str


def profile_level(
    target: ProfileTarget,
    endpoints: ProfileEndpoints | None,
    recipe: str,
    settings: ProfileSettings,
    bench: BenchSettings,
    *,
    rules: KernelRules | None = None,
    progress: Callable[[BenchEvent], None] | None = None,
    poll_s: float = 0.5,
) -> ProfileResult:
    """Run one bench level under the server's profiler and summarise the traces; never raises for a bad profile."""
    if endpoints is None:
        return ProfileResult(
            status="unavailable",
            note=f"profile is not available for recipe {recipe}: it declares no profiler endpoints "
            "(a `profile:` block with start and stop, see docs/profile.md)",
        )
    try:
        load = settings.load_of(bench)
    except ValueError as e:
        return ProfileResult(status="failed", note=f"profile.{e}")
    run_settings = settings.run_settings(bench)
    names = {"output_dir": f"{target.remote_dir}/profile", "profile_dir": settings.folder(target.experiment)}
    traces_dir = str(fill(endpoints.traces, names))
    try:
        before = _listing(target.host, traces_dir)
    except CampaignError as e:
        return ProfileResult(status="failed", level=load.label, note=f"cannot list {traces_dir} on the host: {e}")
    headers = run_settings.request_headers()
    timeout = httpx.Timeout(settings.wait_s, connect=10.0)
    state: dict[str, Any] = {"started": None, "error": None}

    def call(which: str) -> httpx.Response:
        spec = endpoints.start if which == "start" else endpoints.stop
        body = fill(spec.body, names) if spec.body is not None else None
        return httpx.request(spec.method, target.base_url + spec.path, json=body, headers=headers, timeout=timeout)

    def on_event(ev: BenchEvent) -> None:
        # The first measured repeat is about to start: the window opens here, after the bench's test request.
        if ev.kind == "repeat" and state["started"] is None and state["error"] is None:
            try:
                reply = call("start")
            except httpx.HTTPError as e:
                state["error"] = f"{endpoints.start.path}: {e}"
            else:
                if reply.status_code >= 400:
                    state["error"] = f"{endpoints.start.path} answered HTTP {reply.status_code}: {reply.text[:300]}"
                else:
                    state["started"] = time.monotonic()
        if progress is not None:
            progress(ev)

    level = None
    run_error: str | None = None
    try:
        result = run_bench(target.base_url, run_settings, progress=on_event)
        level = result.levels[0] if result.levels else None
    except BenchError as e:
        run_error = f"the profiled run could not run: {e}"
    window: float | None = None
    if state["started"] is not None:
        try:
            reply = call("stop")
            window = round(time.monotonic() - state["started"], 3)
            if reply.status_code >= 400:
                run_error = run_error or f"{endpoints.stop.path} answered HTTP {reply.status_code}: {reply.text[:300]}"
        except httpx.HTTPError as e:
            run_error = run_error or f"{endpoints.stop.path}: {e}"
    if state["error"] is not None:
        status = "unavailable" if "HTTP 404" in state["error"] else "failed"
        return ProfileResult(
            status=status,  # type: ignore[arg-type]
            level=load.label,
            bench=level,
            note=f"the server refused to start its profiler: {state['error']}"
            + (" (a vLLM started without --profiler-config has no /start_profile)" if status == "unavailable" else ""),
        )
    if run_error is not None and state["started"] is None:
        return ProfileResult(status="failed", level=load.label, bench=level, note=run_error)
    new = _await_traces(target.host, traces_dir, before, settings.wait_s, poll_s)
    if not new:
        return ProfileResult(
            status="failed",
            level=load.label,
            bench=level,
            window_s=window,
            note=run_error
            or f"no trace appeared in {traces_dir} within {settings.wait_s:g} s of {endpoints.stop.path}",
        )
    return _collect(target, new, settings, rules, load.label, level, window, run_error)


def _await_traces(host: Host, folder: str, before: Mapping[str, int], wait_s: float, poll_s: float) -> dict[str, int]:
    """The trace files new in ``folder`` once their sizes stop changing (or what there is after ``wait_s``)."""
    deadline = time.monotonic() + wait_s
    last: dict[str, int] = {}
    while True:
        try:
            now = {p: s for p, s in _listing(host, folder).items() if p not in before}
        except CampaignError:
            now = {}
        if now and now == last and all(s > 0 for s in now.values()):
            return now
        last = now
        if time.monotonic() >= deadline:
            return now
        time.sleep(poll_s)


def _collect(
    target: ProfileTarget,
    new: Mapping[str, int],
    settings: ProfileSettings,
    rules: KernelRules | None,
    label: str,
    level: Any,
    window: float | None,
    run_error: str | None,
) -> ProfileResult:
    """Copy the new traces into the run folder and summarise them."""
    target.local_dir.mkdir(parents=True, exist_ok=True)
    limit = int(settings.max_mb * 1024 * 1024)
    files, parsed, notes = [], [], []
    for path, size in sorted(new.items()):
        base = Path(path).name
        if size > limit:
            notes.append(f"{path} ({size / 2**20:.0f} MB) is over profile.max_mb and was not copied")
            continue
        data = target.host.read_file(path)
        (target.local_dir / base).write_bytes(data)
        files.append(f"{target.rel_dir}/{base}")
        try:
            parsed.append(read_trace(data, base))
        except ValueError as e:
            notes.append(str(e))
    result = (
        summarise(parsed, rules)
        if parsed
        else ProfileResult(status="failed", note="no trace could be read", device=None)
    )
    if run_error:
        notes.insert(0, run_error)
    result.note = "; ".join([*([result.note] if result.note else []), *notes])
    result.level = label
    result.bench = level
    result.window_s = window
    result.trace_files = files
    result.host_traces = sorted(new)
    return result
