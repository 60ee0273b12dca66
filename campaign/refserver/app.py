"""The HTTP face of the server: an OpenAI-compatible FastAPI app over the engine.

Routes: POST /v1/chat/completions and POST /v1/completions (streaming and not, with OpenAI-format ``logprobs``),
GET /v1/models, GET /health and /health_generate (503 until warm-up finished, then 200 only after a real one-token
generation; 503 "parked" while asleep), GET /get_model_info, GET /metrics (Prometheus text) and POST /tokenize (the
prompt's ids, as vLLM and SGLang answer it). Bad requests get a 400 with an OpenAI-style error body.
``chat_template_kwargs`` (e.g. ``{"enable_thinking": false}``) is accepted as SGLang and vLLM accept it; the model
has no template and no thinking, so it changes nothing.

POST /start_profile and /stop_profile drive torch.profiler as SGLang's do (``campaign.refserver.profiler``);
POST /sleep?level=1, POST /wake_up and GET /is_sleeping are vLLM's sleep mode (``campaign.refserver.parking``):
generation answers 503 while the server is parked.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any, TypeVar

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from pydantic import BaseModel, ValidationError

from campaign.refserver.engine_process import EngineProcess
from campaign.refserver.parking import add_sleep_routes
from campaign.refserver.profiler import add_profile_routes
from campaign.refserver.protocol import (
    BadRequest,
    ChatRequest,
    CompletionRequest,
    StreamOptions,
    chat_logprob,
    completion_logprobs,
    error_response,
    prompt_text,
    usage_of,
    visible,
)
from campaign.refserver.request import Request as GenRequest
from campaign.refserver.request import TokenLogprob
from campaign.refserver.tokenizer import EOS, decode_ids, encode_prompt

Req = TypeVar("Req", bound=BaseModel)

HEALTH_TIMEOUT_S = 20.0
PARKED = "the server is parked (asleep): POST /wake_up first"


class Relay:
    """Hands tokens from the scheduler thread to the event loop with one wake-up per batch, not one per token.

    A decode step hands out a token for every running request; waking the loop for each (a write to its self-pipe,
    then a turn of the loop) costs the GIL both threads need. The first ``put`` of a batch schedules one drain;
    the others only append.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._lock = threading.Lock()
        self._items: list[tuple[asyncio.Queue[Any], Any]] = []
        self._scheduled = False

    def put(self, queue: asyncio.Queue[Any], item: Any) -> None:
        """Queue ``item`` for ``queue`` from any thread; the loop delivers it at its next turn."""
        with self._lock:
            self._items.append((queue, item))
            if self._scheduled:
                return
            self._scheduled = True
        with contextlib.suppress(RuntimeError):  # the loop closed (shutdown): nobody is left to read
            self._loop.call_soon_threadsafe(self._drain)

    def _drain(self) -> None:
        with self._lock:
            items, self._items = self._items, []
            self._scheduled = False
        for queue, item in items:
            queue.put_nowait(item)


class ServerState:
    """What the routes share: the engine, the model id, whether warm-up finished, and the stream interval."""

    def __init__(self, engine: EngineProcess, *, stream_interval: int = 1, sleep_mode: bool = True) -> None:
        self.engine = engine
        #: Tokens a stream gathers before it writes them (``--stream-interval``); its last ones go out at once.
        self.stream_interval = stream_interval
        self.model_id = engine.model_id
        self.ready = False
        #: Asleep, or on the way to or from it (``parking``): generation and /health answer 503.
        self.parked = False
        self.created = int(time.time())
        #: Whether the sleep routes exist (``--disable-sleep-mode`` leaves them out).
        self.sleep_mode = sleep_mode


#: Builds one streamed payload from (token, its log-probability or None); or the last one from the finish reason.
PieceFn = Callable[[int, TokenLogprob | None], dict[str, Any]]
DoneFn = Callable[[str], dict[str, Any]]


def build_app(state: ServerState) -> FastAPI:
    """The FastAPI app over ``state``."""
    app = FastAPI(title="campaign reference server", docs_url=None, redoc_url=None, openapi_url=None)
    engine = state.engine
    add_profile_routes(app, engine.profiler)
    if state.sleep_mode:
        add_sleep_routes(app, state, engine)
    context_len = engine.context_len
    interval = state.stream_interval
    relays: dict[asyncio.AbstractEventLoop, Relay] = {}

    def make_request(
        text: str, asked: int | None, temperature: float | None, *, ignore_eos: bool, logprobs: int | None, what: str
    ) -> GenRequest:
        prompt = encode_prompt(text)
        if len(prompt) >= context_len:
            raise BadRequest(
                f"This model's maximum context length is {context_len} tokens. However, your {what} resulted "
                f"in {len(prompt)} tokens. Please reduce the length of the {what}.",
                what,
            )
        max_new = asked if asked is not None else context_len - len(prompt)
        if len(prompt) + max_new > context_len:
            raise BadRequest(
                f"This model's maximum context length is {context_len} tokens. However, you requested "
                f"{len(prompt) + max_new} tokens ({len(prompt)} in the {what}, {max_new} in the completion). "
                f"Please reduce the length of the {what} or completion.",
                "max_tokens",
            )
        temp = 1.0 if temperature is None else temperature  # OpenAI's default
        return GenRequest(prompt, max_new, temperature=temp, ignore_eos=ignore_eos, logprobs=logprobs)

    def chat_request(chat: ChatRequest) -> GenRequest:
        if chat.top_logprobs is not None and not chat.logprobs:
            raise BadRequest("top_logprobs needs logprobs: true", "top_logprobs")
        asked = chat.max_completion_tokens if chat.max_completion_tokens is not None else chat.max_tokens
        logprobs = (chat.top_logprobs or 0) if chat.logprobs else None
        return make_request(
            prompt_text(chat), asked, chat.temperature, ignore_eos=chat.ignore_eos, logprobs=logprobs, what="messages"
        )

    def completion_request(req: CompletionRequest) -> GenRequest:
        if req.echo:
            raise BadRequest("echo is not supported by this server", "echo")
        prompts = [req.prompt] if isinstance(req.prompt, str) else req.prompt
        if len(prompts) != 1:
            raise BadRequest("this server takes exactly one prompt per request", "prompt")
        return make_request(
            prompts[0], req.max_tokens, req.temperature, ignore_eos=req.ignore_eos, logprobs=req.logprobs, what="prompt"
        )

    async def generate(gen: GenRequest) -> AsyncIterator[list[tuple[int | None, str | None]]]:
        """The request's tokens as they come: each item is every (token, reason) that arrived since the last one."""
        loop = asyncio.get_running_loop()
        relay = relays.get(loop) or relays.setdefault(loop, Relay(loop))
        queue: asyncio.Queue[tuple[int | None, str | None]] = asyncio.Queue()
        gen.sink = lambda token, reason: relay.put(queue, (token, reason))
        engine.submit(gen)
        first = True  # the first token goes out at once, as SGLang's stream interval does: it dates TTFT
        try:
            while True:
                batch = [await queue.get()]
                while True:
                    while not queue.empty():  # behind the engine: what is queued goes out in one write
                        batch.append(queue.get_nowait())
                    if first or len(batch) >= interval or batch[-1][1] is not None:
                        first = False
                        break
                    # A write per token and stream is what bounds a fast engine at high concurrency: gather more.
                    batch.append(await queue.get())
                yield batch
                if batch[-1][1] is not None:
                    return
        finally:
            if gen.finish_reason is None:
                engine.abort(gen)  # the client went away mid-generation

    async def accept(
        request: Request, schema: type[Req], build: Callable[[Req], GenRequest]
    ) -> tuple[Req, GenRequest] | JSONResponse:
        """The parsed request and its generation request, or the error response that refuses it."""
        try:
            body = json.loads(await request.body())
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            return error_response(400, f"the request body is not valid JSON: {exc}")
        try:
            parsed = schema.model_validate(body)
            gen = build(parsed)
        except ValidationError as exc:
            first = exc.errors()[0]
            param = ".".join(str(p) for p in first["loc"]) or None
            return error_response(400, f"{param}: {first['msg']}" if param else first["msg"], param=param)
        except BadRequest as exc:
            return error_response(400, exc.message, param=exc.param)
        if engine.fatal is not None:
            return error_response(503, f"the engine stopped after an error: {engine.fatal}", kind="server_error")
        if state.parked:
            return error_response(503, PARKED, kind="server_error")
        return parsed, gen

    def stream(
        gen: GenRequest,
        head: dict[str, Any],
        first: dict[str, Any] | None,
        piece: PieceFn,
        done: DoneFn,
        options: StreamOptions | None,
    ) -> StreamingResponse:
        """Server-sent events: ``first`` (if any), a ``piece`` per text token, ``done``, usage when asked, [DONE].

        With ``continuous_usage_stats`` every piece and ``done`` carry the usage so far (as vLLM and SGLang send it):
        the completion tokens include those that make no text (eos under ``ignore_eos``), so a client can tell how
        many tokens each event stands for.
        """
        usage = options is not None and options.include_usage
        continuous = options is not None and options.continuous_usage_stats
        prompt_len = len(gen.prompt)

        def event(payload: dict[str, Any]) -> str:
            return f"data: {json.dumps({**head, **payload})}\n\n"

        def counted(text: str, completion: int) -> str:
            # The event with the usage so far appended to its object (``text`` ends with "}\n\n"), so that the
            # cached text of a token's event serves here too.
            return f'{text[:-3]}, "usage": {json.dumps(usage_of(prompt_len, completion))}}}\n\n'

        async def events() -> AsyncIterator[str]:
            if first is not None:
                yield event(first)
            finish: str | None = None
            seen = 0
            failed = False
            plain: dict[int, str] = {}
            async for batch in generate(gen):
                out: list[str] = []
                for token, reason in batch:
                    if reason == "error":
                        err = {"error": {"message": "generation failed", "type": "server_error", "code": None}}
                        out.append(f"data: {json.dumps(err)}\n\n")
                        failed = True
                        break
                    if token is not None:
                        seen += 1
                        if token != EOS and gen.logprobs is not None:
                            scored = event(piece(token, gen.token_logprobs[seen - 1]))
                            out.append(counted(scored, seen) if continuous else scored)
                        elif token != EOS:
                            # Without log-probabilities a token's event is the same string every time: built once
                            # per stream (a few dozen ids), since at tens of streams this is the HTTP side's hot loop.
                            text = plain.get(token)
                            if text is None:
                                text = plain[token] = event(piece(token, None))
                            out.append(counted(text, seen) if continuous else text)
                    finish = reason
                if out:
                    yield "".join(out)
                if failed:
                    break
            if finish is not None:
                last = event(done(finish))
                yield counted(last, seen) if continuous else last
            if usage:
                yield event({"choices": [], "usage": usage_of(len(gen.prompt), len(gen.output))})
            yield "data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    async def finish(gen: GenRequest) -> str | None:
        """Run ``gen`` to its end; its finish reason, or None when the engine failed."""
        finish_reason: str | None = None
        async for batch in generate(gen):
            finish_reason = batch[-1][1]
        return None if finish_reason == "error" else finish_reason

    def failed() -> JSONResponse:
        return error_response(500, "generation failed: the engine stopped", kind="server_error")

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        accepted = await accept(request, ChatRequest, chat_request)
        if isinstance(accepted, JSONResponse):
            return accepted
        chat, gen = accepted
        head = {
            "id": f"chatcmpl-{uuid.uuid4().hex[:24]}",
            "object": "chat.completion.chunk" if chat.stream else "chat.completion",
            "created": int(time.time()),
            "model": chat.model or state.model_id,
        }
        if chat.stream:

            def piece(token: int, lp: TokenLogprob | None) -> dict[str, Any]:
                logprobs = {"content": [chat_logprob(token, lp)]} if lp is not None else None
                choice = {"index": 0, "delta": {"content": decode_ids([token])}, "logprobs": logprobs}
                return {"choices": [{**choice, "finish_reason": None}]}

            def done(reason: str) -> dict[str, Any]:
                return {"choices": [{"index": 0, "delta": {}, "logprobs": None, "finish_reason": reason}]}

            opening = {"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}]}
            return stream(gen, head, opening, piece, done, chat.stream_options)

        reason = await finish(gen)
        if reason is None:
            return failed()
        tokens, lps = visible(gen)
        logprobs = (
            {"content": [chat_logprob(t, lp) for t, lp in zip(tokens, lps, strict=True)]} if chat.logprobs else None
        )
        message = {"role": "assistant", "content": decode_ids(tokens)}
        choice = {"index": 0, "message": message, "logprobs": logprobs, "finish_reason": reason}
        return JSONResponse({**head, "choices": [choice], "usage": usage_of(len(gen.prompt), len(gen.output))})

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        accepted = await accept(request, CompletionRequest, completion_request)
        if isinstance(accepted, JSONResponse):
            return accepted
        req, gen = accepted
        head = {
            "id": f"cmpl-{uuid.uuid4().hex[:24]}",
            "object": "text_completion",
            "created": int(time.time()),
            "model": req.model or state.model_id,
        }
        if req.stream:
            at = 0

            def piece(token: int, lp: TokenLogprob | None) -> dict[str, Any]:
                nonlocal at
                text = decode_ids([token])
                logprobs = completion_logprobs([token], [lp], at) if lp is not None else None
                at += len(text)
                return {"choices": [{"index": 0, "text": text, "logprobs": logprobs, "finish_reason": None}]}

            def done(reason: str) -> dict[str, Any]:
                return {"choices": [{"index": 0, "text": "", "logprobs": None, "finish_reason": reason}]}

            return stream(gen, head, None, piece, done, req.stream_options)

        reason = await finish(gen)
        if reason is None:
            return failed()
        tokens, lps = visible(gen)
        logprobs = completion_logprobs(tokens, lps) if req.logprobs is not None else None
        choice = {"index": 0, "text": decode_ids(tokens), "logprobs": logprobs, "finish_reason": reason}
        return JSONResponse({**head, "choices": [choice], "usage": usage_of(len(gen.prompt), len(gen.output))})

    @app.post("/tokenize")
    async def tokenize(request: Request) -> Response:
        # As vLLM and SGLang answer it: the ids the model would read for this prompt (bos and sep included).
        try:
            body = await request.json()
            prompt = body["prompt"]
        except (ValueError, KeyError, TypeError):
            return error_response(400, "tokenize needs a JSON body with a prompt", kind="invalid_request_error")
        if not isinstance(prompt, str):
            return error_response(400, "prompt must be a string", kind="invalid_request_error")
        ids = encode_prompt(prompt)
        return JSONResponse({"tokens": ids, "count": len(ids), "max_model_len": context_len})

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
        return {"model_path": engine.model_path, "is_generation": True, "model_id": state.model_id}

    async def health() -> Response:
        if state.parked:
            return PlainTextResponse("parked: asleep, POST /wake_up to serve", status_code=503)
        if not state.ready or engine.fatal is not None:
            return PlainTextResponse("starting" if engine.fatal is None else "engine stopped", status_code=503)
        gen = GenRequest(encode_prompt("What is 1+1?"), 1, temperature=0.0)
        try:
            async with asyncio.timeout(HEALTH_TIMEOUT_S):
                async for batch in generate(gen):
                    if any(reason == "error" for _token, reason in batch):
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
            f"refserver:token_usage {engine.token_usage:.6f}",
            "# HELP refserver:decode_steps_total Decode steps run.",
            "# TYPE refserver:decode_steps_total counter",
            f"refserver:decode_steps_total {s.decode_steps}",
            "# HELP refserver:decode_seconds_total Wall time of the scheduler's decode work (launch, wait, hand-out).",
            "# TYPE refserver:decode_seconds_total counter",
            f"refserver:decode_seconds_total {s.decode_seconds:.6f}",
            "# HELP refserver:decode_wait_seconds_total Of that, time spent waiting for the device (what the host's "
            "work did not cover).",
            "# TYPE refserver:decode_wait_seconds_total counter",
            f"refserver:decode_wait_seconds_total {s.decode_wait_seconds:.6f}",
            "# HELP refserver:indexer_logits_total Indexer logits decode computed (aware: the rows' lengths; naive: "
            "the context length, every row).",
            "# TYPE refserver:indexer_logits_total counter",
            f"refserver:indexer_logits_total {s.index_logits}",
        ]
        return PlainTextResponse("\n".join(lines) + "\n", media_type="text/plain; version=0.0.4")

    return app
