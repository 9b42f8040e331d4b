"""/v1/chat/completions, /v1/completions, /v1/models and /health."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, StreamingResponse

from localllm.backends.base import Chunk
from localllm.config import Settings
from localllm.engine.worker import ChunkStream, Engine
from localllm.engine.worker import Request as EngineRequest
from localllm.server import protocol as wire
from localllm.server.sse import sse_frames

router = APIRouter()
DISCONNECT_POLL_S = 0.2


def _engine(request: Request) -> Engine:
    engine: Engine = request.app.state.engine
    return engine


async def _collect(stream: ChunkStream, request: Request) -> tuple[str, Chunk]:
    """Gather a whole answer; cancel the generation if the client goes away meanwhile."""

    async def watch() -> None:
        while True:
            await asyncio.sleep(DISCONNECT_POLL_S)
            if await request.is_disconnected():
                stream.cancel()
                return

    watcher = asyncio.create_task(watch())
    parts: list[str] = []
    final: Chunk | None = None
    try:
        async for chunk in stream:
            parts.append(chunk.text)
            if chunk.finish_reason is not None:
                final = chunk
    finally:
        watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watcher
        stream.cancel()
    assert final is not None, "a stream always ends with a final chunk"
    return "".join(parts), final


def _interval(request: Request) -> float:
    settings: Settings = request.app.state.settings
    return settings.stream_interval_ms / 1000.0


def _usage(final: Chunk, prompt_tokens: int) -> dict:
    generated = final.stats.generated_tokens if final.stats else 0
    return wire.usage(final.stats, prompt_tokens, generated)


def _sse(frames: object) -> StreamingResponse:
    headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
    return StreamingResponse(frames, media_type="text/event-stream", headers=headers)  # type: ignore[arg-type]


@router.post("/v1/chat/completions", response_model=None)
async def chat_completions(
    body: wire.ChatCompletionRequest, request: Request
) -> JSONResponse | StreamingResponse:
    engine = _engine(request)
    stream = engine.submit(
        EngineRequest(
            body.sampling(), messages=[m.to_message() for m in body.messages], model=body.model
        )
    )
    try:
        started = await stream.started()
    except BaseException:
        stream.cancel()
        raise
    rid, created, model = wire.new_id("chatcmpl"), wire.now(), started.model
    if not body.stream:
        text, final = await _collect(stream, request)
        use = _usage(final, started.prompt_tokens)
        return JSONResponse(
            wire.chat_completion(rid, created, model, text, final.finish_reason, use)
        )

    include_usage = bool(body.stream_options and body.stream_options.include_usage)
    first = True

    def on_text(text: str) -> dict:
        nonlocal first
        delta = {"role": "assistant", "content": text} if first else {"content": text}
        first = False
        return wire.chat_chunk(rid, created, model, delta)

    def on_final(final: Chunk, text: str) -> list[dict]:
        out = []
        if text or first:
            out.append(on_text(text))
        out.append(wire.chat_chunk(rid, created, model, {}, final.finish_reason))
        if include_usage:
            use = _usage(final, started.prompt_tokens)
            out.append(wire.chat_chunk(rid, created, model, {}, use=use, empty_choices=True))
        return out

    return _sse(sse_frames(stream, on_text, on_final, interval_s=_interval(request)))


@router.post("/v1/completions", response_model=None)
async def completions(
    body: wire.CompletionRequest, request: Request
) -> JSONResponse | StreamingResponse:
    engine = _engine(request)
    prompt = body.prompt
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], int):
        req = EngineRequest(
            body.sampling(), prompt_tokens=[int(t) for t in prompt], model=body.model
        )
    else:
        text = prompt[0] if isinstance(prompt, list) else prompt
        req = EngineRequest(body.sampling(), prompt=str(text), suffix=body.suffix, model=body.model)
    stream = engine.submit(req)
    try:
        started = await stream.started()
    except BaseException:
        stream.cancel()
        raise
    rid, created, model = wire.new_id("cmpl"), wire.now(), started.model
    if not body.stream:
        text, final = await _collect(stream, request)
        use = _usage(final, started.prompt_tokens)
        return JSONResponse(wire.completion(rid, created, model, text, final.finish_reason, use))

    include_usage = bool(body.stream_options and body.stream_options.include_usage)
    on_text: Callable[[str], dict] = lambda text: wire.completion(  # noqa: E731
        rid, created, model, text, None, None
    )

    def on_final(final: Chunk, text: str) -> list[dict]:
        out = [wire.completion(rid, created, model, text, final.finish_reason, None)]
        if include_usage:
            use = _usage(final, started.prompt_tokens)
            out.append(wire.completion(rid, created, model, "", None, use, empty_choices=True))
        return out

    return _sse(sse_frames(stream, on_text, on_final, interval_s=_interval(request)))


@router.get("/v1/models")
async def list_models(request: Request) -> JSONResponse:
    engine = _engine(request)
    names = engine.store.names()
    loaded = engine.model_ref
    if loaded is not None and loaded.name not in names:
        names.insert(0, loaded.name)
    return JSONResponse(wire.model_list(names, wire.now()))


@router.get("/health")
async def health(request: Request) -> JSONResponse:
    engine = _engine(request)
    ref = engine.model_ref
    body = {
        "status": "ok" if engine.state == "ready" else engine.state,
        "model": ref.name if ref else None,
        "queued": engine.outstanding,
        "totals": dict(engine.totals),
    }
    if engine.last_error:
        body["error"] = engine.last_error
    return JSONResponse(body, status_code=200 if engine.state == "ready" else 503)
