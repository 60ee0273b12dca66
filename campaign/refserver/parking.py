"""The sleep-mode routes of the HTTP process: vLLM's ``POST /sleep?level=1``, ``POST /wake_up``, ``GET /is_sleeping``.

They drive the engine process's ``Sleeper`` (``campaign.refserver.sleeper``) through its call channel; while the
server is parked (from the moment a sleep is asked for until a wake is done) the generation routes and /health
answer 503 (``app``). ``--disable-sleep-mode`` leaves them out: a server with no sleep endpoint, which only a
checkpoint of the whole process (cuda-checkpoint) can park.
"""

from __future__ import annotations

import asyncio
from typing import Any, Protocol

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from campaign.refserver.profiler import ProfileError


class SleepControl(Protocol):
    """What the sleep routes drive: the engine process's ``sleep``/``wake`` calls, answered or refused."""

    def call(self, name: str, *args: Any) -> Any:
        """Run ``name`` in the engine process; raises ``ProfileError``."""
        ...


class ParkState(Protocol):
    """The server state the sleep routes read and set."""

    parked: bool


def add_sleep_routes(app: FastAPI, state: ParkState, engine: SleepControl) -> None:
    """Add vLLM's sleep-mode routes to ``app``: ``POST /sleep?level=1``, ``POST /wake_up``, ``GET /is_sleeping``.

    ``state.parked`` turns true before the engine is asked to sleep (so no request slips in between) and false only
    once it is awake: the generation routes and /health answer 503 meanwhile.
    """
    lock = asyncio.Lock()

    def refused(exc: ProfileError) -> JSONResponse:
        body = {"error": {"message": exc.message, "type": "invalid_request_error", "param": None, "code": None}}
        return JSONResponse(body, status_code=exc.status)

    @app.post("/sleep")
    async def sleep(request: Request) -> JSONResponse:
        try:
            level = int(request.query_params.get("level", "1"))
        except ValueError:
            return refused(ProfileError("level must be an integer"))
        async with lock:
            was = state.parked
            state.parked = True
            try:
                answer = await asyncio.to_thread(engine.call, "sleep", level)
            except ProfileError as exc:
                state.parked = was
                return refused(exc)
        return JSONResponse(answer)

    @app.post("/wake_up")
    async def wake_up() -> JSONResponse:
        async with lock:
            try:
                answer = await asyncio.to_thread(engine.call, "wake")
            except ProfileError as exc:
                return refused(exc)
            state.parked = False
        return JSONResponse(answer)

    @app.get("/is_sleeping")
    async def is_sleeping() -> dict[str, bool]:
        return {"is_sleeping": state.parked}
