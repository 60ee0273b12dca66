"""The HTTP face of the server: an OpenAI-compatible FastAPI app over the engine.

Routes: POST /v1/chat/completions (streaming and not), GET /v1/models, GET /health and /health_generate (503 until
warm-up finished, then 200 only after a real one-token generation), GET /get_model_info and GET /metrics
(Prometheus text). Bad requests get a 400 with an OpenAI-style error body.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from campaign.refserver.engine import Engine
from campaign.refserver.engine import Request as GenRequest
from campaign.refserver.tokenizer import EOS, decode_ids, encode_prompt

HEALTH_TIMEOUT_S = 20.0


class ContentPart(BaseModel):
    """One part of a list-form message content; only text parts carry a prompt."""

    model_config = ConfigDict(extra="allow")
    type: str
    text: str | None = None


class Message(BaseModel):
    """A chat message."""

    model_config = ConfigDict(extra="allow")
    role: str
    content: str | list[ContentPart] | None = None


class StreamOptions(BaseModel):
    """OpenAI's ``stream_options``."""

    include_usage: bool = False


class ChatRequest(BaseModel):
    """The fields of a chat completion request this server acts on; others are accepted and ignored."""

    model_config = ConfigDict(extra="allow")
    model: str | None = None
    messages: list[Message] = Field(min_length=1)
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int = Field(default=1, ge=1, le=1)
    ignore_eos: bool = False


class BadRequest(Exception):
    """A request the server refuses with a 400."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param


def error_response(
    status: int, message: str, *, kind: str = "invalid_request_error", param: str | None = None
) -> JSONResponse:
    """An OpenAI-style error body."""
    return JSONResponse({"error": {"message": message, "type": kind, "param": param, "code": None}}, status_code=status)


def prompt_text(chat: ChatRequest) -> str:
    """The last user message's text (the prompt); raises ``BadRequest`` when there is none."""
    for message in reversed(chat.messages):
        if message.role != "user":
            continue
        if isinstance(message.content, str):
            return message.content
        if isinstance(message.content, list):
            return "".join(part.text or "" for part in message.content if part.type == "text")
        raise BadRequest("the last user message has no content", "messages")
    raise BadRequest("messages must contain a message with role 'user'", "messages")


class ServerState:
    """What the routes share: the engine, the model id, and whether warm-up finished."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.model_id = engine.model_id
        self.ready = False
        self.created = int(time.time())


def _usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def build_app(state: ServerState) -> FastAPI:
    """The FastAPI app over ``state``."""
    app = FastAPI(title="campaign reference server", docs_url=None, redoc_url=None, openapi_url=None)
    engine = state.engine
    context_len = engine.cfg.context_len

    def make_request(chat: ChatRequest) -> GenRequest:
        prompt = encode_prompt(prompt_text(chat))
        asked = chat.max_completion_tokens if chat.max_completion_tokens is not None else chat.max_tokens
        if len(prompt) >= context_len:
            raise BadRequest(
                f"This model's maximum context length is {context_len} tokens. However, your messages resulted "
                f"in {len(prompt)} tokens. Please reduce the length of the messages.",
                "messages",
            )
        max_new = asked if asked is not None else context_len - len(prompt)
        if len(prompt) + max_new > context_len:
            raise BadRequest(
                f"This model's maximum context length is {context_len} tokens. However, you requested "
                f"{len(prompt) + max_new} tokens ({len(prompt)} in the messages, {max_new} in the completion). "
                "Please reduce the length of the messages or completion.",
                "max_tokens",
            )
        temperature = 1.0 if chat.temperature is None else chat.temperature  # OpenAI's default
        return GenRequest(prompt, max_new, temperature=temperature, ignore_eos=chat.ignore_eos)

    async def generate(gen: GenRequest) -> AsyncIterator[tuple[int | None, str | None]]:
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[tuple[int | None, str | None]] = asyncio.Queue()

        def sink(token: int | None, reason: str | None) -> None:
            loop.call_soon_threadsafe(queue.put_nowait, (token, reason))

        gen.sink = sink
        engine.submit(gen)
        try:
            while True:
                token, reason = await queue.get()
                yield token, reason
                if reason is not None:
                    return
        finally:
            if gen.finish_reason is None:
                engine.abort(gen)  # the client went away mid-generation

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        try:
            body = json.loads(await request.body())
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            return error_response(400, f"the request body is not valid JSON: {exc}")
        try:
            chat = ChatRequest.model_validate(body)
            gen = make_request(chat)
        except ValidationError as exc:
            first = exc.errors()[0]
            param = ".".join(str(p) for p in first["loc"]) or None
            return error_response(400, f"{param}: {first['msg']}" if param else first["msg"], param=param)
        except BadRequest as exc:
            return error_response(400, exc.message, param=exc.param)
        if engine.fatal is not None:
            return error_response(503, f"the engine stopped after an error: {engine.fatal}", kind="server_error")
        rid = f"chatcmpl-{uuid.uuid4().hex[:24]}"
        created = int(time.time())
        model = chat.model or state.model_id

        def chunk(delta: dict[str, Any], finish: str | None) -> str:
            payload = {
                "id": rid,
                "object": "chat.completion.chunk",
                "created": created,
                "model": model,
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
            }
            return f"data: {json.dumps(payload)}\n\n"

        if chat.stream:
            include_usage = chat.stream_options is not None and chat.stream_options.include_usage

            async def events() -> AsyncIterator[str]:
                yield chunk({"role": "assistant", "content": ""}, None)
                finish: str | None = None
                async for token, reason in generate(gen):
                    if reason == "error":
                        err = {"error": {"message": "generation failed", "type": "server_error", "code": None}}
                        yield f"data: {json.dumps(err)}\n\n"
                        break
                    text = decode_ids([token]) if token is not None and token != EOS else ""
                    if text:
                        yield chunk({"content": text}, None)
                    finish = reason
                if finish is not None:
                    yield chunk({}, finish)
                if include_usage:
                    usage = {
                        "id": rid,
                        "object": "chat.completion.chunk",
                        "created": created,
                        "model": model,
                        "choices": [],
                        "usage": _usage(len(gen.prompt), len(gen.output)),
                    }
                    yield f"data: {json.dumps(usage)}\n\n"
                yield "data: [DONE]\n\n"

            return StreamingResponse(events(), media_type="text/event-stream")

        finish_reason: str | None = None
        async for _token, reason in generate(gen):
            finish_reason = reason
        if finish_reason == "error":
            return error_response(500, "generation failed: the engine stopped", kind="server_error")
        text = decode_ids(t for t in gen.output if t != EOS)
        return JSONResponse(
            {
                "id": rid,
                "object": "chat.completion",
                "created": created,
                "model": model,
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": text},
                        "finish_reason": finish_reason,
                    }
                ],
                "usage": _usage(len(gen.prompt), len(gen.output)),
            }
        )

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {
            "object": "list",
            "data": [
                {
                    "id": state.model_id,
                    "object": "model",
                    "created": state.created,
                    "owned_by": "campaign",
                    "root": state.model_id,
                    "max_model_len": context_len,
                }
            ],
        }

    @app.get("/get_model_info")
    async def model_info() -> dict[str, Any]:
        return {"model_path": str(engine.args.model_path), "is_generation": True, "model_id": state.model_id}

    async def health() -> Response:
        if not state.ready or engine.fatal is not None:
            return PlainTextResponse("starting" if engine.fatal is None else "engine stopped", status_code=503)
        gen = GenRequest(encode_prompt("What is 1+1?"), 1, temperature=0.0)
        try:
            async with asyncio.timeout(HEALTH_TIMEOUT_S):
                async for _token, reason in generate(gen):
                    if reason == "error":
                        return PlainTextResponse("generation failed", status_code=503)
        except TimeoutError:
            return PlainTextResponse(f"no token within {HEALTH_TIMEOUT_S:.0f} s", status_code=503)
        return Response(status_code=200)

    app.add_api_route("/health", health, methods=["GET"])
    app.add_api_route("/health_generate", health, methods=["GET"])

    @app.get("/metrics")
    async def metrics() -> PlainTextResponse:
        s = engine.stats
        lines = [
            "# HELP refserver:num_requests_total Requests finished (completed or aborted).",
            "# TYPE refserver:num_requests_total counter",
            f"refserver:num_requests_total {s.requests_finished}",
            "# HELP refserver:prompt_tokens_total Prompt tokens prefilled.",
            "# TYPE refserver:prompt_tokens_total counter",
            f"refserver:prompt_tokens_total {s.prompt_tokens}",
            "# HELP refserver:generation_tokens_total Tokens generated.",
            "# TYPE refserver:generation_tokens_total counter",
            f"refserver:generation_tokens_total {s.generation_tokens}",
            "# HELP refserver:num_running_reqs Requests in the decode batch.",
            "# TYPE refserver:num_running_reqs gauge",
            f"refserver:num_running_reqs {s.running}",
            "# HELP refserver:num_queue_reqs Requests waiting for admission.",
            "# TYPE refserver:num_queue_reqs gauge",
            f"refserver:num_queue_reqs {s.queued}",
            "# HELP refserver:token_usage Fraction of KV pool slots reserved.",
            "# TYPE refserver:token_usage gauge",
            f"refserver:token_usage {engine.pool.used_slots / engine.pool.n_tokens:.6f}",
        ]
        return PlainTextResponse("\n".join(lines) + "\n", media_type="text/plain; version=0.0.4")

    return app
