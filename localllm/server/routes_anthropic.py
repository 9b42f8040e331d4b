"""The Anthropic Messages API (`POST /v1/messages`, `/v1/messages/count_tokens`), so that
Claude Code and other Anthropic-SDK tools run on a local model.

Content blocks map onto the engine's messages: text; `tool_use` blocks become an
assistant's tool calls and `tool_result` blocks the tool's answers, rendered by the
model's template or the generic format (backends/tools.py) as for the OpenAI routes.
Streams are Anthropic's named events: message_start, content_block_start / _delta /
_stop per block, message_delta with the stop reason and usage, message_stop.
`cache_control` marks are accepted: the prompt cache keeps every prefix anyway.
Errors come as `{"type": "error", "error": {"type", "message"}}` (server/errors.py).
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any, Literal

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import Field

from localllm.backends.base import Chunk, Message, SamplingParams, ToolCall
from localllm.backends.tools import ReplyReader, ToolChoice, ToolSpec
from localllm.config import Settings
from localllm.engine.client import EngineClient
from localllm.engine.stream import ChunkStream
from localllm.engine.worker import Request as EngineRequest
from localllm.errors import InvalidRequest
from localllm.server import protocol as wire
from localllm.server.errors import stream_error
from localllm.server.routes_openai import _collect, _who, start

router = APIRouter()


class CacheControl(wire._Wire):
    type: Literal["ephemeral"]
    ttl: str | None = None


class TextBlock(wire._Wire):
    type: Literal["text"]
    text: wire.Text
    cache_control: CacheControl | None = None
    citations: list[Any] | None = None


class ImageBlock(wire._Wire):
    type: Literal["image", "document"]
    source: dict[str, Any]
    cache_control: CacheControl | None = None


class ToolUseBlock(wire._Wire):
    type: Literal["tool_use"]
    id: wire.Text
    name: wire.Text
    input: dict[str, Any]
    cache_control: CacheControl | None = None


class ToolResultBlock(wire._Wire):
    type: Literal["tool_result"]
    tool_use_id: wire.Text
    content: wire.Text | list[TextBlock | ImageBlock] = ""
    is_error: bool | None = None
    cache_control: CacheControl | None = None

    def text(self) -> str:
        if isinstance(self.content, str):
            body = self.content
        else:
            body = "".join(_text_of(b) for b in self.content)
        return f"Error: {body}" if self.is_error else body


Block = TextBlock | ImageBlock | ToolUseBlock | ToolResultBlock


def _text_of(block: Block) -> str:
    if isinstance(block, ImageBlock):
        raise InvalidRequest(
            "This model has no vision support: it cannot read image or document blocks.",
            param="messages",
            code="vision_not_supported",
        )
    return block.text if isinstance(block, TextBlock) else ""


class AnthropicMessage(wire._Wire):
    role: Literal["user", "assistant"]
    content: wire.Text | list[Block]

    def to_messages(self) -> list[Message]:
        if isinstance(self.content, str):
            return [Message(self.role, self.content)]
        out: list[Message] = []
        text: list[str] = []
        calls: list[ToolCall] = []
        for block in self.content:
            if isinstance(block, ToolResultBlock):
                out.append(Message("tool", block.text(), tool_call_id=block.tool_use_id))
            elif isinstance(block, ToolUseBlock):
                arguments = json.dumps(block.input, ensure_ascii=False)
                calls.append(ToolCall(block.id, block.name, arguments))
            else:
                text.append(_text_of(block))
        if text or calls or not out:
            out.append(Message(self.role, "".join(text), tool_calls=tuple(calls)))
        return out


class AnthropicTool(wire._Wire):
    name: str = Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")
    description: wire.Text | None = None
    input_schema: dict[str, Any]
    cache_control: CacheControl | None = None
    type: Literal["custom"] | None = None


class AnthropicToolChoice(wire._Wire):
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool | None = None


class Metadata(wire._Wire):
    user_id: str | None = None


class _Prompt(wire._Wire):
    model: wire.Name
    messages: list[AnthropicMessage] = Field(min_length=1)
    system: wire.Text | list[TextBlock] | None = None
    tools: list[AnthropicTool] | None = None
    tool_choice: AnthropicToolChoice | None = None

    def engine_messages(self) -> list[Message]:
        out: list[Message] = []
        if self.system:
            system = self.system
            text = system if isinstance(system, str) else "".join(b.text for b in system)
            out.append(Message("system", text))
        for m in self.messages:
            out += m.to_messages()
        return out

    def tool_spec(self) -> ToolSpec | None:
        choice = self.tool_choice or AnthropicToolChoice(type="auto")
        parallel = not choice.disable_parallel_tool_use
        if choice.type == "tool":
            picked = ToolChoice("function", choice.name, parallel)
        else:
            mode = {"auto": "auto", "any": "required", "none": "none"}[choice.type]
            picked = ToolChoice(mode, None, parallel)  # type: ignore[arg-type]
        functions = [
            {"name": t.name, "parameters": t.input_schema}
            | ({"description": t.description} if t.description else {})
            for t in self.tools or ()
        ]
        return wire.tool_spec(functions, picked)


class MessagesBody(_Prompt):
    max_tokens: int = Field(ge=1)
    stop_sequences: list[wire.Text] | None = Field(default=None, max_length=wire.MAX_STOP_STRINGS)
    stream: bool = False
    temperature: float | None = Field(default=None, ge=0.0, le=1.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    top_k: int | None = Field(default=None, ge=0)
    metadata: Metadata | None = None  # the caller's user id: not used

    def sampling(self) -> SamplingParams:
        return SamplingParams.asked(
            temperature=self.temperature,
            top_p=self.top_p,
            top_k=self.top_k,
            max_tokens=self.max_tokens,
            stop=tuple(s for s in self.stop_sequences or () if s) or None,
        )


class CountBody(_Prompt):
    pass


def _stop_reason(final: Chunk, calls: list[ToolCall]) -> str:
    if calls:
        return "tool_use"
    return "max_tokens" if final.finish_reason == "length" else "end_turn"


def _usage(final: Chunk, output_tokens: int | None = None) -> dict[str, int]:
    stats = final.stats
    prompt = stats.prompt_tokens if stats else 0
    cached = stats.cached_tokens if stats else 0
    return {
        "input_tokens": prompt - cached,
        "cache_read_input_tokens": cached,
        "cache_creation_input_tokens": 0,
        "output_tokens": output_tokens if output_tokens is not None else _generated(final),
    }


def _generated(final: Chunk) -> int:
    return final.stats.generated_tokens if final.stats else 0


def _tool_use(call: ToolCall) -> dict[str, Any]:
    return {
        "type": "tool_use",
        "id": call.id,
        "name": call.name,
        "input": json.loads(call.arguments),
    }


def _event(name: str, body: dict[str, Any]) -> bytes:
    data = json.dumps(body, ensure_ascii=False)
    return f"event: {name}\ndata: {data}\n\n".encode()


@router.post("/v1/messages", response_model=None)
async def messages(body: MessagesBody, request: Request) -> JSONResponse | StreamingResponse:
    settings: Settings = request.app.state.settings
    req = EngineRequest(
        body.sampling(),
        messages=body.engine_messages(),
        model=body.model,
        context_policy=settings.context_policy,
        tools=body.tool_spec(),
        **_who(request),
    )
    stream, started, reader = await start(request, req)
    message_id = f"msg_{uuid.uuid4().hex[:24]}"
    if not body.stream:
        text, _, final = await _collect(stream, request)
        calls: list[ToolCall] = []
        if reader is not None:
            reader.feed(text)
            parsed = reader.close()
            text, calls = parsed.content, parsed.calls
        content = ([{"type": "text", "text": text}] if text or not calls else []) + [
            _tool_use(c) for c in calls
        ]
        return JSONResponse(
            {
                "id": message_id,
                "type": "message",
                "role": "assistant",
                "model": started.model,
                "content": content,
                "stop_reason": _stop_reason(final, calls),
                "stop_sequence": None,
                "usage": _usage(final),
            }
        )
    head: dict[str, Any] = {
        "id": message_id,
        "type": "message",
        "role": "assistant",
        "model": started.model,
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": {"input_tokens": started.prompt_tokens, "output_tokens": 0},
    }
    interval = settings.stream_interval_ms / 1000.0
    return StreamingResponse(
        _events(stream, reader, head, interval),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )


async def _events(
    stream: ChunkStream, reader: ReplyReader | None, head: dict[str, Any], interval_s: float
) -> AsyncIterator[bytes]:
    """A text block opened with the first text; tool_use blocks after it, each whole."""
    last = float("-inf")
    index = 0
    text_open = False

    def due_in() -> float:
        return max(0.0, last + interval_s - time.monotonic())

    yield _event("message_start", {"type": "message_start", "message": head})
    try:
        async for piece, _, final in stream.pieces(due_in):
            calls: list[ToolCall] = []
            if reader is not None:
                piece = reader.feed(piece)
                if final is not None:
                    rest = reader.close()
                    piece, calls = piece + rest.content, rest.calls
            if piece:
                if not text_open:
                    text_open = True
                    block = {"type": "text", "text": ""}
                    yield _event(
                        "content_block_start",
                        {"type": "content_block_start", "index": index, "content_block": block},
                    )
                delta = {"type": "text_delta", "text": piece}
                yield _event(
                    "content_block_delta",
                    {"type": "content_block_delta", "index": index, "delta": delta},
                )
                last = time.monotonic()
            if final is None:
                continue
            if text_open:
                yield _event("content_block_stop", {"type": "content_block_stop", "index": index})
                index += 1
            for call in calls:
                start = {**_tool_use(call), "input": {}}
                yield _event(
                    "content_block_start",
                    {"type": "content_block_start", "index": index, "content_block": start},
                )
                delta = {"type": "input_json_delta", "partial_json": call.arguments}
                yield _event(
                    "content_block_delta",
                    {"type": "content_block_delta", "index": index, "delta": delta},
                )
                yield _event("content_block_stop", {"type": "content_block_stop", "index": index})
                index += 1
            end = {"stop_reason": _stop_reason(final, calls), "stop_sequence": None}
            yield _event(
                "message_delta",
                {"type": "message_delta", "delta": end, "usage": _usage(final)},
            )
            yield _event("message_stop", {"type": "message_stop"})
    except Exception as exc:  # after message_start: Anthropic's error event ends it
        yield _event("error", stream_error(exc, "/v1/messages"))
    finally:
        stream.cancel()


@router.post("/v1/messages/count_tokens")
async def count_tokens(body: CountBody, request: Request) -> JSONResponse:
    engine: EngineClient = request.app.state.engine
    req = EngineRequest(
        SamplingParams(),
        messages=body.engine_messages(),
        model=body.model,
        tools=body.tool_spec(),
        **_who(request),
    )
    tokens = await asyncio.to_thread(engine.prompt_tokens, req)
    return JSONResponse({"input_tokens": len(tokens)})
