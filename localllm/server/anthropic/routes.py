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
import uuid
from collections.abc import Iterator
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, StreamingResponse

from localllm.backends.base import Chunk, Message, SamplingParams, ToolCall
from localllm.engine.output import Delta
from localllm.engine.request import Request as EngineRequest
from localllm.engine.request import Started
from localllm.engine.stream import ChunkStream
from localllm.server.anthropic.schemas import CountBody, MessagesBody
from localllm.server.errors import stream_error
from localllm.server.framing import paced, sse_event, streaming
from localllm.server.media import off_loop, prefetch
from localllm.server.serving import (
    collect,
    engine_of,
    pace,
    settings_of,
    start,
    start_streamed,
    who,
)

router = APIRouter()


def _stop(delta: Delta) -> tuple[str, str | None]:
    """stop_reason and stop_sequence of an answer's last delta."""
    final = delta.final
    assert final is not None
    if final.finish_reason == "length":
        return "max_tokens", None  # the calls it finished before the limit still come
    if delta.tool_calls:
        return "tool_use", None
    if final.stop_sequence is not None:
        return "stop_sequence", final.stop_sequence
    return "end_turn", None


def _usage(final: Chunk) -> dict[str, int]:
    stats = final.stats
    prompt = stats.prompt_tokens if stats else 0
    cached = stats.cached_tokens if stats else 0
    return {
        "input_tokens": prompt - cached,
        "cache_read_input_tokens": cached,
        "cache_creation_input_tokens": 0,
        "output_tokens": stats.generated_tokens if stats else 0,
    }


def _tool_use(call: ToolCall) -> dict[str, Any]:
    return {
        "type": "tool_use",
        "id": call.id,
        "name": call.name,
        "input": json.loads(call.arguments),
    }


def _thinking(text: str) -> dict[str, Any]:
    # a local model's reasoning carries no signature: clients send the block back as is
    return {"type": "thinking", "thinking": text, "signature": ""}


async def _messages(request: Request, body: MessagesBody | CountBody) -> list[Message]:
    """The body's messages, its pictures fetched (when allowed) and decoded off the loop."""
    fetched = await prefetch(request, body.image_urls())
    return await off_loop(lambda: body.engine_messages(fetched), request, body.model)


@router.post("/v1/messages", response_model=None)
async def messages(body: MessagesBody, request: Request) -> JSONResponse | StreamingResponse:
    req = EngineRequest(
        body.sampling(),
        messages=await _messages(request, body),
        model=body.model,
        context_policy=settings_of(request).context_policy,
        tools=await off_loop(body.tool_spec),
        template_vars=body.template_vars(),
        **who(request),
    )
    message_id = f"msg_{uuid.uuid4().hex[:24]}"
    if not body.stream:
        stream, started = await start(request, req)
        answer = await collect(stream, request)
        assert answer.final is not None
        content: list[dict[str, Any]] = []
        if answer.reasoning:
            content.append(_thinking(answer.reasoning.strip()))
        if answer.text or not (answer.tool_calls or answer.reasoning):
            content.append({"type": "text", "text": answer.text})
        content += [_tool_use(c) for c in answer.tool_calls]
        reason, sequence = _stop(answer)
        return JSONResponse(
            {
                "id": message_id,
                "type": "message",
                "role": "assistant",
                "model": started.model,
                "content": content,
                "stop_reason": reason,
                "stop_sequence": sequence,
                "usage": _usage(answer.final),
            }
        )
    ping = sse_event("ping", {"type": "ping"})  # as Anthropic's API sends while it works

    def streamed(stream: ChunkStream, started: Started) -> StreamingResponse:
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
        frames = paced(
            stream,
            _Blocks().encode,
            pace=pace(request),
            on_error=failed,
            head=(sse_event("message_start", {"type": "message_start", "message": head}),),
            keep_alive=ping,
        )
        return streaming(frames)

    def failed(exc: Exception) -> bytes:
        return sse_event("error", stream_error(exc, "/v1/messages"))

    return await start_streamed(request, req, streamed, keep_alive=ping, on_error=failed)


class _Blocks:
    """An answer's content blocks as Anthropic streams them: a thinking block while the
    model reasons, a text block for the answer, then each tool_use block whole."""

    def __init__(self) -> None:
        self.index = 0
        self.open: str | None = None  # "thinking" | "text": the block being streamed

    def _switch(self, kind: str | None) -> Iterator[bytes]:
        if self.open == kind:
            return
        if self.open is not None:
            yield _block_event("content_block_stop", self.index)
            self.index += 1
        self.open = kind
        if kind == "thinking":
            yield _block_event("content_block_start", self.index, content_block=_thinking(""))
        elif kind == "text":
            block = {"type": "text", "text": ""}
            yield _block_event("content_block_start", self.index, content_block=block)

    def encode(self, delta: Delta) -> list[bytes]:
        out: list[bytes] = []
        if delta.reasoning:
            out += self._switch("thinking")
            step = {"type": "thinking_delta", "thinking": delta.reasoning}
            out.append(_block_event("content_block_delta", self.index, delta=step))
        if delta.text:
            out += self._switch("text")
            step = {"type": "text_delta", "text": delta.text}
            out.append(_block_event("content_block_delta", self.index, delta=step))
        if delta.final is None:
            return out
        if self.open == "thinking":  # signature_delta: clients expect one before the stop
            step = {"type": "signature_delta", "signature": ""}
            out.append(_block_event("content_block_delta", self.index, delta=step))
        out += self._switch(None)
        for call in delta.tool_calls:
            start = {**_tool_use(call), "input": {}}
            out.append(_block_event("content_block_start", self.index, content_block=start))
            step = {"type": "input_json_delta", "partial_json": call.arguments}
            out.append(_block_event("content_block_delta", self.index, delta=step))
            out.append(_block_event("content_block_stop", self.index))
            self.index += 1
        reason, sequence = _stop(delta)
        end = {"stop_reason": reason, "stop_sequence": sequence}
        use = _usage(delta.final)
        out.append(
            sse_event("message_delta", {"type": "message_delta", "delta": end, "usage": use})
        )
        out.append(sse_event("message_stop", {"type": "message_stop"}))
        return out


def _block_event(name: str, index: int, **fields: Any) -> bytes:
    return sse_event(name, {"type": name, "index": index, **fields})


@router.post("/v1/messages/count_tokens")
async def count_tokens(body: CountBody, request: Request) -> JSONResponse:
    engine = engine_of(request)
    req = EngineRequest(
        SamplingParams(),
        messages=await _messages(request, body),
        model=body.model,
        tools=await off_loop(body.tool_spec),
        template_vars=body.template_vars(),
        **who(request),
    )
    tokens = await asyncio.to_thread(engine.prompt_tokens, req)
    return JSONResponse({"input_tokens": len(tokens)})
