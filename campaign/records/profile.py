"""Profile records: the ``profile:`` block of an experiment, a recipe's profiler endpoints, and what a profile found.

``ProfileSettings`` says which bench level is run once more under the server's own profiler; ``ProfileEndpoints``
is the recipe data that says how that server's profiler is started and stopped and where its traces land;
``ProfileResult`` (``Attempt.profile``) is the breakdown of the traced time into attention, GEMMs and the rest
(``campaign.profile`` makes it). Times are milliseconds, shares fractions of ``total_ms``.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from campaign.records.benchmark import BenchSettings, LevelResult, Load

#: The classes a profile sorts time into, in the order they are tried and shown.
KERNEL_CLASSES = ("attention", "gemm", "other")


class ProfileSettings(BaseModel):
    """The ``profile:`` block of an experiment: which bench level is measured once more under the profiler.

    Written as ``profile: {level: 32}``: after a variant's bench, the level at concurrency 32 (or request rate 32
    when the bench sweeps rates) runs again with ``requests`` requests between the server's start- and
    stop-profile calls. The profiled run is a measurement of its own: the bench's figures carry no profiler
    overhead.
    """

    model_config = ConfigDict(extra="forbid")

    #: The level's concurrency (or request rate); None: the bench's last level.
    level: float | None = Field(default=None, gt=0)
    #: Measured requests in the profiled run (None: the bench's ``requests``); a trace grows with every one.
    requests: int | None = Field(default=None, ge=1)
    #: Tokens each profiled request asks for (None: the bench's). A trace grows with every decode step: at 8k
    #: contexts 4 requests of 512 tokens made a 272 MB trace on the H200, 32 tokens profile the same steady decode.
    output_len: int | None = Field(default=None, ge=1)
    #: Where on the host a server that must be told at launch writes its traces (vLLM's torch_profiler_dir);
    #: servers told at start-profile time (SGLang, the reference server) write into the attempt's folder.
    dir: str = "/tmp/campaign-profiles"
    #: How long to wait after stop-profile for the traces to be written (large GPU traces take minutes).
    wait_s: float = Field(default=300.0, gt=0, allow_inf_nan=False)
    #: Traces larger than this are not copied (their path on the host is still recorded).
    max_mb: float = Field(default=1024.0, gt=0, allow_inf_nan=False)

    def folder(self, experiment: str) -> str:
        """The launch-time trace folder on the host: ``dir`` and the experiment's name."""
        return f"{self.dir.rstrip('/')}/{experiment}"

    def load_of(self, bench: BenchSettings) -> Load:
        """The bench level this profiles; ``ValueError`` when ``level`` is not one the bench runs."""
        if bench.sla is not None:
            return bench.sla.load(self.level if self.level is not None else bench.sla.high, bench.max_concurrency)
        loads = bench.loads()
        if self.level is None:
            return loads[-1]
        for load in loads:
            if load.x == self.level:
                return load
        over = "concurrency" if bench.concurrency is not None else "request_rate"
        levels = ", ".join(f"{x.x:g}" for x in loads)
        raise ValueError(f"level {self.level:g} is not a level of the bench ({over}: {levels})")

    def run_settings(self, bench: BenchSettings) -> BenchSettings:
        """The bench of the profiled run: the chosen level once, no warm-up (the server is warm), no gates."""
        load = self.load_of(bench)
        update: dict[str, Any] = {
            "concurrency": [load.concurrency] if load.concurrency is not None else None,
            "request_rate": [load.request_rate] if load.request_rate is not None else None,
            "max_concurrency": load.max_concurrency,
            "sla": None,
            "repeats": 1,
            "warmup": 0,
            "gates": [],
            "launches": 1,
            "requests": self.requests or bench.requests,
        }
        if self.output_len is not None:
            update.update(output_len=self.output_len, max_tokens=self.output_len)
        return bench.model_copy(update=update)


class ProfileCall(BaseModel):
    """One HTTP call of a server's profiler: the path, and the JSON body (``{output_dir}`` is filled in)."""

    model_config = ConfigDict(extra="forbid")

    path: str
    method: Literal["POST", "GET"] = "POST"
    body: dict[str, Any] | None = None


class ProfileEndpoints(BaseModel):
    """A recipe's ``profile:`` block: how its server's profiler starts and stops, and where traces land.

    ``traces`` is the folder on the host to look in once stop returns: ``{output_dir}`` (the attempt's own
    ``profile`` folder, which the start body passes on) or ``{profile_dir}`` (the experiment's ``profile.dir``,
    which ``launch_args``/``launch_env`` give the server at launch, for a server that cannot be told later).
    """

    model_config = ConfigDict(extra="forbid")

    start: ProfileCall
    stop: ProfileCall
    traces: str = "{output_dir}"
    launch_args: list[str] = Field(default_factory=list)
    launch_env: dict[str, str] = Field(default_factory=dict)

    def launch(self, profile_dir: str) -> tuple[list[str], dict[str, str]]:
        """The args and env a launch needs to be profiled later, ``{profile_dir}`` filled in."""
        names = {"profile_dir": profile_dir}
        return [fill(a, names) for a in self.launch_args], {k: fill(v, names) for k, v in self.launch_env.items()}


def fill(value: Any, names: dict[str, str]) -> Any:
    """``value`` with ``{output_dir}``-style names replaced, through lists and mappings (other braces stay)."""
    if isinstance(value, str):
        for k, v in names.items():
            value = value.replace("{" + k + "}", v)
        return value
    if isinstance(value, list):
        return [fill(v, names) for v in value]
    if isinstance(value, dict):
        return {k: fill(v, names) for k, v in value.items()}
    return value


class KernelTime(BaseModel):
    """One kernel (or op) name's time within a class."""

    name: str
    time_ms: float
    count: int


class ClassTime(BaseModel):
    """The time of one class: its total, its share of the profiled total, and its largest kernels."""

    name: Literal["attention", "gemm", "other"]
    time_ms: float
    share: float
    count: int
    top: list[KernelTime] = Field(default_factory=list)


class ProfileResult(BaseModel):
    """What the profile step found for one attempt (``Attempt.profile``).

    ``status``: ``measured`` (a breakdown), ``unavailable`` (the recipe has no profiler endpoints, or the server
    refused them: ``note`` says which), ``failed`` (the profiled run or the trace went wrong: ``note`` says how).
    ``device``: ``gpu`` when the trace holds device kernels (their durations are summed), ``cpu`` when it holds only
    CPU ops (their self times are summed). ``scope``: ``decode`` when the trace marks decode steps and only their
    time is summed, ``all`` when prefill and decode could not be told apart.
    """

    status: Literal["measured", "unavailable", "failed"]
    note: str = ""
    level: str | None = None
    device: Literal["gpu", "cpu"] | None = None
    scope: Literal["decode", "all"] | None = None
    total_ms: float = 0.0
    attention_ms: float = 0.0
    gemm_ms: float = 0.0
    other_ms: float = 0.0
    attention_share: float | None = None
    gemm_share: float | None = None
    other_share: float | None = None
    classes: list[ClassTime] = Field(default_factory=list)
    #: Kernel (or op) events summed.
    events: int = 0
    #: The trace files as copied into the run folder (relative to it), and where they were on the host.
    trace_files: list[str] = Field(default_factory=list)
    host_traces: list[str] = Field(default_factory=list)
    #: Seconds from start-profile to stop-profile returning.
    window_s: float | None = None
    #: The profiled level's own figures (with the profiler's overhead in them: not comparable to the bench's).
    bench: LevelResult | None = None

    def summary(self) -> str:
        """One line: each class's share and time, of what, where; or why there is no breakdown."""
        if self.status != "measured":
            return f"{self.status}: {self.note}" if self.note else self.status
        what = "GPU kernel time" if self.device == "gpu" else "CPU op self time"
        where = "decode steps" if self.scope == "decode" else "prefill and decode"
        parts = [f"{c.name} {100 * c.share:.1f}% ({c.time_ms:.1f} ms)" for c in self.classes]
        return f"{', '.join(parts)} of {self.total_ms:.1f} ms {what} in {where} at {self.level}"

    def share(self, name: str) -> float | None:
        """The share of ``attention``, ``gemm`` or ``other`` in the total (None when nothing was measured)."""
        value: float | None = getattr(self, f"{name}_share")
        return value
