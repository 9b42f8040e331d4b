"""/v1/chat/completions, /v1/completions, /v1/models and /health."""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, StreamingResponse

from localllm.backends import reasoning
from localllm.backends.base import Chunk, TokenLogprob, ToolCall
from localllm.backends.tools import ReplyReader, ToolFormat
from localllm.config import Settings
from localllm.engine.client import EngineClient
from localllm.engine.stream import ChunkStream, Started
from localllm.engine.worker import Request as EngineRequest
from localllm.errors import LocalLLMError
from localllm.server import protocol as wire
from localllm.server.model_facts import capabilities, meta_of
from localllm.server.sse import sse_frames

router = APIRouter()
IDLE_WAKE_S = 30.0  # a non-streaming reader only needs waking for the final chunk


def _engine(request: Request) -> EngineClient:
    engine: EngineClient = request.app.state.engine
    return engine


async def _cancel_on_disconnect(stream: ChunkStream, request: Request) -> None:
    """Cancel the generation when the client goes away (so a request that waits in the
    queue is dropped before its prompt is read)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass
    stream.cancel()


def _who(request: Request) -> dict[str, Any]:
    """The engine request's fields that say who asked (from the guard) and what it may name."""
    settings: Settings = request.app.state.settings
    state = request.scope.get("state", {})
    return {
        "client": state.get("client", "anonymous"),
        "request_id": state.get("request_id"),
        "allow_paths": settings.allow_model_paths,
    }


async def _collect(stream: ChunkStream, request: Request) -> tuple[str, list[TokenLogprob], Chunk]:
    """Gather a whole answer; cancel the generation if the client goes away meanwhile.

    Tokens do not wake this reader one by one (it asks for the next chunk with a
    long timeout, so only the final chunk wakes it); a second task waits for the
    client's disconnect message and cancels the generation.
    """

    watcher = asyncio.create_task(_cancel_on_disconnect(stream, request))
    parts: list[str] = []
    scores: list[TokenLogprob] = []
    final: Chunk | None = None
    try:
        while True:
            try:
                chunk = await stream.next(IDLE_WAKE_S)
            except StopAsyncIteration:
                break
            if chunk is not None:
                parts.append(chunk.text)
                scores += chunk.logprobs
                if chunk.finish_reason is not None:
                    final = chunk
    finally:
        watcher.cancel()
        stream.cancel()
    assert final is not None, "a stream always ends with a final chunk"
    return "".join(parts), scores, final


def _interval(request: Request) -> float:
    settings: Settings = request.app.state.settings
    return settings.stream_interval_ms / 1000.0


def _sse(frames: object) -> StreamingResponse:
    headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
    return StreamingResponse(frames, media_type="text/event-stream", headers=headers)  # type: ignore[arg-type]


async def start(
    request: Request, req: EngineRequest
) -> tuple[ChunkStream, Started, ReplyReader | None]:
    """Submit a request and wait until its prompt is accepted (errors before the first
    token keep their status; a client that leaves meanwhile cancels it). With tools, the
    reader for the reply's calls in the model's format."""
    stream = _engine(request).submit(req)
    watcher = asyncio.create_task(_cancel_on_disconnect(stream, request))
    try:
        started = await stream.started()
    except BaseException:
        stream.cancel()
        raise
    finally:
        watcher.cancel()
    reader = None
    if req.tools is not None and started.tool_format is not None:
        fmt: ToolFormat = started.tool_format  # type: ignore[assignment]
        reader = ReplyReader(fmt, req.tools.names())
    return stream, started, reader


async def _respond(
    request: Request, body: wire.SamplingFields, req: EngineRequest, kind: type[wire.Shapes]
) -> JSONResponse | StreamingResponse:
    """Run a request; answer with one JSON body or an SSE stream in `kind`'s wire shape."""
    stream, started, reader = await start(request, req)
    shapes = kind(started.model, started.prompt_tokens, logprobs=req.params.logprobs is not None)
    if started.dropped_messages:
        shapes.truncated = {
            "dropped_messages": started.dropped_messages,
            "prompt_tokens_before": started.prompt_tokens_before,
        }
    if started.fallback_from is not None:
        shapes.fallback = fallback_field(started)
    thinking = started.reasoning if kind is wire.ChatShapes else None
    if not body.stream:
        text, scores, final = await _collect(stream, request)
        thought, text = reasoning.split(text, thinking) if thinking else ("", text)
        if reader is None:
            return JSONResponse(shapes.full(text, final, scores, reasoning=thought))
        reader.feed(text)
        parsed = reader.close()
        return JSONResponse(
            shapes.full(parsed.content, final, scores, parsed.calls, reasoning=thought)
        )
    include_usage = bool(body.stream_options and body.stream_options.include_usage)
    splitter = reasoning.ReasoningSplitter(thinking) if thinking else None

    def piece(text: str, scores: list[TokenLogprob]) -> dict | None:
        thought = ""
        if splitter is not None:
            thought, text = splitter.feed(text)
        if reader is not None:
            text = reader.feed(text)
        if (reader is not None or splitter is not None) and not (text or thought or scores):
            return None
        return shapes.delta(text, scores, reasoning=thought)

    def closing(final: Chunk, text: str, scores: list[TokenLogprob]) -> list[dict]:
        calls: list[ToolCall] = []
        thought = ""
        if splitter is not None:
            thought, text = splitter.feed(text)
            more_thought, more_text = splitter.close()
            thought, text = thought + more_thought, text + more_text
        if reader is not None:
            text = reader.feed(text)
            rest = reader.close()
            text, calls = text + rest.content, rest.calls
        return shapes.closing(
            final, text, scores, calls, include_usage=include_usage, reasoning=thought
        )

    return _sse(sse_frames(stream, piece, closing, interval_s=_interval(request)))


@router.post("/v1/chat/completions", response_model=None)
async def chat_completions(
    body: wire.ChatCompletionRequest, request: Request
) -> JSONResponse | StreamingResponse:
    messages = [m.to_message() for m in body.messages]
    policy = request.app.state.settings.context_policy
    req = EngineRequest(
        body.sampling(),
        messages=messages,
        model=body.model,
        context_policy=policy,
        tools=body.tool_spec(),
        template_vars=body.chat_template_kwargs,
        response_format=body.wire_response_format(),
        **body.extensions(),
        **_who(request),
    )
    return await _respond(request, body, req, wire.ChatShapes)


@router.post("/v1/completions", response_model=None)
async def completions(
    body: wire.CompletionRequest, request: Request
) -> JSONResponse | StreamingResponse:
    prompt = body.prompt
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], int):
        tokens = [int(t) for t in prompt]
        req = EngineRequest(
            body.sampling(),
            prompt_tokens=tokens,
            model=body.model,
            **body.extensions(),
            **_who(request),
        )
    else:
        text = prompt[0] if isinstance(prompt, list) else prompt
        req = EngineRequest(
            body.sampling(),
            prompt=str(text),
            suffix=body.suffix,
            model=body.model,
            **body.extensions(),
            **_who(request),
        )
    return await _respond(request, body, req, wire.TextShapes)


@router.get("/v1/models")
async def list_models(request: Request) -> JSONResponse:
    """Local models, with extension fields: `context_length` (the trained context, which a
    longer prompt may use when memory allows), `loaded_context_length` (what it is loaded
    with now, or null) and `capabilities`."""
    engine = _engine(request)
    body = await asyncio.to_thread(_model_rows, engine)
    for m in await engine.remotes.models():
        body["data"].append(
            {
                "id": m.name,
                "object": "model",
                "created": body["data"][0]["created"] if body["data"] else wire.now(),
                "owned_by": f"remote:{m.remote}",
                "context_length": m.n_ctx,
                "loaded_context_length": m.n_ctx,
                "capabilities": ["completion", "tools"],
            }
        )
    return JSONResponse(body)


def fallback_field(started: Started) -> dict[str, str | None]:
    """The extension field of an answer the local fallback gave for a remote model."""
    return {"requested": started.fallback_from, "model": started.model, "reason": started.note}


def _model_rows(engine: EngineClient) -> dict[str, Any]:
    loaded = {row["model"]: row for row in engine.status().resident() if not row["draft_for"]}
    created = wire.now()
    rows: list[dict[str, Any]] = []
    seen = set()
    for ref in engine.models():
        if ref.name in seen:
            continue
        seen.add(ref.name)
        row = {"id": ref.name, "object": "model", "created": created, "owned_by": "local"}
        try:
            meta = meta_of(ref)
        except (LocalLLMError, OSError):
            rows.append(row)
            continue
        now = loaded.get(ref.name)
        row["context_length"] = meta.n_ctx_train
        row["loaded_context_length"] = now["n_ctx"] if now else None
        row["capabilities"] = capabilities(meta, ref.format)
        rows.append(row)
    for name, now in loaded.items():  # a model loaded by path is listed too
        if name not in seen:
            rows.insert(
                0,
                {
                    "id": name,
                    "object": "model",
                    "created": created,
                    "owned_by": "local",
                    "loaded_context_length": now["n_ctx"],
                },
            )
    return {"object": "list", "data": rows}


@router.get("/health")
async def health(request: Request) -> JSONResponse:
    engine = _engine(request)
    status = engine.status()
    ref = status.model_ref
    body = {
        "status": "ok" if status.state == "ready" else status.state,
        "model": ref.name if ref else None,
        "queued": status.queued,
        "activity": dict(status.activity),
        "totals": dict(status.totals),
        "prompt_cache": dict(status.prompt_cache),
        "models": status.resident(),
        "remotes": engine.remotes.status(),
    }
    if status.dead is not None:
        body["error"] = f"the engine stopped: {status.dead}; restart localllm"
    elif status.last_error and status.state == "ready":
        body["last_load_error"] = status.last_error  # another model failed; this one serves
    elif status.last_error:
        body["error"] = status.last_error
    return JSONResponse(body, status_code=200 if status.state == "ready" else 503)
