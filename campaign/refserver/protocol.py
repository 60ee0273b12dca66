"""The OpenAI wire format the server speaks: request bodies it acts on, error bodies, usage and log-probabilities."""

from __future__ import annotations

from typing import Any

from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field

from campaign.refserver.request import Request as GenRequest
from campaign.refserver.request import TokenLogprob
from campaign.refserver.tokenizer import EOS, decode_ids, token_text

#: Most alternatives a request may ask log-probabilities for (OpenAI's chat limit).
MAX_TOP_LOGPROBS = 20


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
    """OpenAI's ``stream_options``, with vLLM's and SGLang's ``continuous_usage_stats`` (usage in every chunk)."""

    include_usage: bool = False
    continuous_usage_stats: bool = False


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
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0, le=MAX_TOP_LOGPROBS)
    chat_template_kwargs: dict[str, Any] | None = None


class CompletionRequest(BaseModel):
    """The fields of a (legacy) completion request this server acts on; others are accepted and ignored."""

    model_config = ConfigDict(extra="allow")
    model: str | None = None
    prompt: str | list[str]
    #: OpenAI's default for completions is 16 tokens.
    max_tokens: int | None = Field(default=16, ge=1)
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int = Field(default=1, ge=1, le=1)
    ignore_eos: bool = False
    logprobs: int | None = Field(default=None, ge=0, le=MAX_TOP_LOGPROBS)
    echo: bool = False


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


def usage_of(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def _entry(token: int, logprob: float) -> dict[str, Any]:
    text = token_text(token)
    return {"token": text, "logprob": logprob, "bytes": list(text.encode())}


def chat_logprob(token: int, lp: TokenLogprob) -> dict[str, Any]:
    """One entry of a chat completion's ``logprobs.content``, in OpenAI's format."""
    return {**_entry(token, lp.logprob), "top_logprobs": [_entry(t, v) for t, v in lp.top]}


def completion_logprobs(tokens: list[int], lps: list[TokenLogprob], offset: int = 0) -> dict[str, Any]:
    """A completion's ``logprobs`` object in OpenAI's legacy format: parallel lists, offsets into the text."""
    offsets = []
    for token in tokens:
        offsets.append(offset)
        offset += len(decode_ids([token]))
    return {
        "tokens": [token_text(t) for t in tokens],
        "token_logprobs": [lp.logprob for lp in lps],
        "top_logprobs": [{token_text(t): v for t, v in lp.top} for lp in lps],
        "text_offset": offsets,
    }


def visible(gen: GenRequest) -> tuple[list[int], list[TokenLogprob]]:
    """The generated tokens that make the text (EOS left out) and their log-probabilities (empty if not asked)."""
    keep = [i for i, t in enumerate(gen.output) if t != EOS]
    lps = [gen.token_logprobs[i] for i in keep] if gen.logprobs is not None else []
    return [gen.output[i] for i in keep], lps
