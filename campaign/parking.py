"""Parking a live server: park it (its GPU memory freed, the process kept), wake it, and measure what it holds.

A recipe's ``park:`` block (``config.Parking``) says how: through the server's own sleep mode (``via: endpoints``:
vLLM's ``/sleep`` and ``/wake_up``, SGLang's memory release and resume, the reference server's vLLM-shaped routes)
or through NVIDIA's ``cuda-checkpoint --toggle`` on each of its processes that holds GPU memory (``via:
cuda_checkpoint``, for a server without such routes; the driver moves the memory to host memory and back). Each call
returns a ``Parked`` record with its wall time and the memory measured before and after: the group's resident memory
(``ps``) everywhere, and its GPU memory where ``nvidia-smi`` exists.

The calls go through ``Host.url`` (a forwarded port over SSH) and ``Host.run``; a refusal or a transport error is a
``ParkError`` with the server's words, never a traceback, so the caller can fall back to a cold relaunch.
"""

from __future__ import annotations

import shlex
import time
from dataclasses import dataclass, field

import httpx

from campaign.config import ParkCall, Parking
from campaign.errors import ParkError
from campaign.hosts.base import Host

#: Longest wait for a sleep or wake call: a large model's weights take seconds each way over PCIe.
CALL_TIMEOUT_S = 600.0


@dataclass
class Memory:
    """What a server's processes hold: resident host memory and GPU memory (None where it cannot be measured)."""

    rss_bytes: int | None = None
    gpu_bytes: int | None = None


@dataclass
class Parked:
    """One park or wake: how long it took, and the memory before and after."""

    action: str
    seconds: float
    before: Memory = field(default_factory=Memory)
    after: Memory = field(default_factory=Memory)
    #: The server's own answer (its JSON body, where it sent one).
    answer: dict[str, object] | None = None


def memory(host: Host, pids: list[int]) -> Memory:
    """The resident memory of ``pids`` (``ps``) and the GPU memory they hold (``nvidia-smi``, where present)."""
    if not pids:
        return Memory()
    listed = ",".join(str(p) for p in pids)
    rss = None
    res = host.run(f"ps -o rss= -p {shlex.quote(listed)}", timeout=15)
    values = [int(v) for v in res.stdout.split() if v.isdigit()]
    if values:
        rss = sum(values) * 1024
    held = gpu_by_pid(host)
    gpu = None if held is None else sum(held.get(p, 0) for p in pids)
    return Memory(rss_bytes=rss, gpu_bytes=gpu)


def gpu_by_pid(host: Host) -> dict[int, int] | None:
    """GPU memory (bytes) per process holding some, per nvidia-smi; None on a host without it."""
    smi = host.run(
        "command -v nvidia-smi >/dev/null 2>&1 || exit 3; "
        "nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits",
        timeout=30,
    )
    if smi.exit_code != 0:
        return None
    held: dict[int, int] = {}
    for line in smi.stdout.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 2 and parts[0].isdigit() and parts[1].isdigit():
            held[int(parts[0])] = held.get(int(parts[0]), 0) + (int(parts[1]) << 20)  # MiB
    return held


def _call(host: Host, port: int, call: ParkCall, what: str) -> dict[str, object] | None:
    url = host.url(port) + call.path
    try:
        reply = httpx.request(call.method, url, json=call.body, timeout=CALL_TIMEOUT_S)
    except httpx.HTTPError as exc:
        raise ParkError(f"{what}: {call.method} {call.path} got no answer: {exc}") from None
    if reply.status_code >= 400:
        raise ParkError(f"{what}: {call.method} {call.path} answered {reply.status_code}: {reply.text[:300]}")
    try:
        body = reply.json()
    except ValueError:
        return None
    return body if isinstance(body, dict) else None


def _toggle(host: Host, pids: list[int], what: str) -> None:
    """``cuda-checkpoint --toggle`` each of ``pids`` (lock and checkpoint, or restore and unlock)."""
    if not pids:
        raise ParkError(f"{what}: no process of the server holds GPU memory to checkpoint")
    for pid in pids:
        res = host.run(f"cuda-checkpoint --toggle --pid {shlex.quote(str(pid))}", timeout=CALL_TIMEOUT_S)
        if not res.ok:
            raise ParkError(f"{what}: cuda-checkpoint --toggle --pid {pid} failed: {res.tail(3)}")


def park(host: Host, port: int, spec: Parking, pids: list[int], *, gpu_pids: list[int] | None = None) -> Parked:
    """Park the server on ``port`` (its processes ``pids``); raises ``ParkError`` when it does not park.

    ``gpu_pids``: the processes a checkpoint toggles (default: those of ``pids`` that nvidia-smi says hold memory).
    """
    return _act(host, port, spec, pids, gpu_pids, "park")


def wake(host: Host, port: int, spec: Parking, pids: list[int], *, gpu_pids: list[int] | None = None) -> Parked:
    """Wake the parked server on ``port``; raises ``ParkError`` when it does not wake (the caller relaunches)."""
    return _act(host, port, spec, pids, gpu_pids, "wake")


def _act(host: Host, port: int, spec: Parking, pids: list[int], gpu_pids: list[int] | None, action: str) -> Parked:
    before = memory(host, pids)
    began = time.monotonic()
    answer = None
    if spec.via == "endpoints":
        call = spec.sleep if action == "park" else spec.wake
        assert call is not None  # the recipe's validator requires both
        answer = _call(host, port, call, action)
    else:
        if gpu_pids is None:  # only a process with a CUDA context can be checkpointed (not the HTTP front end)
            held = gpu_by_pid(host) or {}
            gpu_pids = [p for p in pids if p in held]
        _toggle(host, gpu_pids, action)
    seconds = time.monotonic() - began
    return Parked(action, seconds, before, memory(host, pids), answer)


def is_parked(host: Host, port: int, spec: Parking) -> bool | None:
    """Whether the server says it is parked (None: it has no such route, or did not answer)."""
    if spec.is_sleeping is None:
        return None
    try:
        reply = httpx.get(host.url(port) + spec.is_sleeping, timeout=5)
        value = reply.json().get("is_sleeping") if reply.status_code == 200 else None
    except (httpx.HTTPError, ValueError, AttributeError):
        return None
    return value if isinstance(value, bool) else None
