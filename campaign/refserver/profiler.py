"""The server's own profiler: ``POST /start_profile`` and ``POST /stop_profile`` over torch.profiler, as SGLang has.

``/start_profile`` takes an optional JSON body ``{"output_dir": ..., "activities": ["CPU", "GPU"]}``: the folder
the trace goes to (default: ``$REFSERVER_TORCH_PROFILER_DIR``, as SGLang reads ``SGLANG_TORCH_PROFILER_DIR``) and
what to record (default: CPU, and GPU where the server runs on CUDA). ``/stop_profile`` stops it, writes one Chrome
trace JSON (``torch.profiler``'s own export) and answers where it is: ``{"trace": path, "bytes": n, ...}``.

Every thread is recorded (the scheduler thread runs the model, not the HTTP thread that starts the profiler), with
Python stacks, so a summary can tell which code issued an op (``campaign.profile`` reads the decode steps and the
attention calls from them). Stacks cost time: a profiled run is slower than an unprofiled one.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from pathlib import Path
from typing import Any, Protocol

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from campaign.refserver.log import logger

#: Where traces go when a start request names no folder.
DIR_ENV = "REFSERVER_TORCH_PROFILER_DIR"
ACTIVITIES = ("CPU", "GPU")


class ProfileError(Exception):
    """A profiler request the server refuses (HTTP ``status``), with its reason."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.message = message
        self.status = status


class Profiler:
    """One torch.profiler session at a time: started by one request, stopped and exported by another."""

    def __init__(self, device: str) -> None:
        self.device = device
        self._lock = threading.Lock()
        self._prof: Any = None
        self._dir: Path | None = None
        self._started = 0.0
        self._count = 0

    def start(self, output_dir: str | None, activities: list[str] | None) -> dict[str, Any]:
        """Start recording into ``output_dir`` (or the environment's folder); raises ``ProfileError``."""
        import torch
        from torch.profiler import ProfilerActivity, profile

        folder = output_dir or os.environ.get(DIR_ENV)
        if not folder:
            raise ProfileError(f"no folder for the trace: send output_dir, or start the server with {DIR_ENV} set")
        asked = [a.upper() for a in (activities or (["CPU", "GPU"] if self.device == "cuda" else ["CPU"]))]
        unknown = [a for a in asked if a not in ACTIVITIES and a != "CUDA"]
        if unknown:
            raise ProfileError(f"unknown activities {unknown}; use {list(ACTIVITIES)}")
        kinds = []
        if "CPU" in asked:
            kinds.append(ProfilerActivity.CPU)
        if ("GPU" in asked or "CUDA" in asked) and torch.cuda.is_available():
            kinds.append(ProfilerActivity.CUDA)
        with self._lock:
            if self._prof is not None:
                raise ProfileError("a profile is already running; stop it first", status=409)
            path = Path(folder).expanduser().resolve()
            try:
                path.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise ProfileError(f"cannot create {path}: {exc.strerror}") from exc
            prof = profile(activities=kinds, with_stack=True, **_all_threads())
            prof.start()
            self._prof, self._dir, self._started = prof, path, time.monotonic()
        names = [k.name for k in kinds]
        logger.info(f"Profiling starts. output_dir={path}, activities={names}")
        return {"output_dir": str(path), "activities": names}

    def stop(self) -> dict[str, Any]:
        """Stop recording and write the trace; returns where it is. Raises ``ProfileError`` when none runs."""
        with self._lock:
            prof, folder = self._prof, self._dir
            if prof is None or folder is None:
                raise ProfileError("no profile is running; start one with POST /start_profile", status=409)
            self._prof = None
            prof.stop()
            window = time.monotonic() - self._started
            self._count += 1
            trace = folder / f"refserver-{os.getpid()}-{int(time.time())}-{self._count}.trace.json"
            prof.export_chrome_trace(str(trace))
        size = trace.stat().st_size
        logger.info(f"Profiling done. trace={trace}, bytes={size}, window_s={window:.3f}")
        return {"trace": str(trace), "bytes": size, "window_s": round(window, 4)}


def _all_threads() -> dict[str, Any]:
    """The profiler option that records every thread, where this torch has it (2.8 and later)."""
    import torch

    try:
        return {"experimental_config": torch._C._profiler._ExperimentalConfig(profile_all_threads=True)}
    except (AttributeError, TypeError):
        return {}


class ProfilerLike(Protocol):
    """What the routes drive: a ``Profiler``, or the HTTP process's proxy for the engine process's one."""

    def start(self, output_dir: str | None, activities: list[str] | None) -> dict[str, Any]: ...

    def stop(self) -> dict[str, Any]: ...


def add_profile_routes(app: FastAPI, profiler: ProfilerLike) -> None:
    """Add ``/start_profile`` and ``/stop_profile`` to ``app``, driving ``profiler``."""

    def refused(exc: ProfileError) -> JSONResponse:
        return JSONResponse(
            {"error": {"message": exc.message, "type": "invalid_request_error", "param": None, "code": None}},
            status_code=exc.status,
        )

    @app.post("/start_profile")
    async def start_profile(request: Request) -> JSONResponse:
        raw = await request.body()
        try:
            body = await request.json() if raw.strip() else {}
        except ValueError:
            return refused(ProfileError("the body is not valid JSON"))
        if not isinstance(body, dict):
            return refused(ProfileError("the body must be a JSON object"))
        output_dir, activities = body.get("output_dir"), body.get("activities")
        if output_dir is not None and not isinstance(output_dir, str):
            return refused(ProfileError("output_dir must be a string"))
        if activities is not None and not (
            isinstance(activities, list) and all(isinstance(a, str) for a in activities)
        ):
            return refused(ProfileError("activities must be a list of strings"))
        try:
            return JSONResponse(await asyncio.to_thread(profiler.start, output_dir, activities))
        except ProfileError as exc:
            return refused(exc)

    @app.post("/stop_profile")
    async def stop_profile() -> JSONResponse:
        # Exporting a large trace takes seconds: off the event loop, so streams in flight keep flowing.
        try:
            return JSONResponse(await asyncio.to_thread(profiler.stop))
        except ProfileError as exc:
            return refused(exc)
