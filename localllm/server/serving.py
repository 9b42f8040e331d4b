"""What every API's routes share: start a request, collect a whole answer, cancel when the
client leaves, and say who is asking."""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import Request

from localllm.config import Settings
from localllm.engine.client import EngineClient
from localllm.engine.output import Delta
from localllm.engine.request import Request as EngineRequest
from localllm.engine.request import Started
from localllm.engine.stream import ChunkStream

IDLE_WAKE_S = 30.0  # a non-streaming reader only needs waking for the final chunk


def engine_of(request: Request) -> EngineClient:
    engine: EngineClient = request.app.state.engine
    return engine


def settings_of(request: Request) -> Settings:
    settings: Settings = request.app.state.settings
    return settings


def interval(request: Request) -> float:
    """Seconds between two frames of a stream (`stream_interval_ms`)."""
    return settings_of(request).stream_interval_ms / 1000.0


async def cancel_on_disconnect(stream: ChunkStream, request: Request) -> None:
    """Cancel the generation when the client goes away (so a request that waits in the
    queue is dropped before its prompt is read)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass
    stream.cancel()


def who(request: Request) -> dict[str, Any]:
    """The engine request's fields that say who asked (from the guard) and what it may name."""
    state = request.scope.get("state", {})
    return {
        "client": state.get("client", "anonymous"),
        "request_id": state.get("request_id"),
        "allow_paths": settings_of(request).allow_model_paths,
    }


async def start(request: Request, req: EngineRequest) -> tuple[ChunkStream, Started]:
    """Submit a request and wait until its prompt is accepted (errors before the first
    token keep their status; a client that leaves meanwhile cancels it)."""
    stream = engine_of(request).submit(req)
    watcher = asyncio.create_task(cancel_on_disconnect(stream, request))
    try:
        started = await stream.started()
    except BaseException:
        stream.cancel()
        raise
    finally:
        watcher.cancel()
    return stream, started


async def collect(stream: ChunkStream, request: Request) -> Delta:
    """A whole answer as one delta; the generation is cancelled if the client goes away
    meanwhile (a second task waits for its disconnect message)."""
    watcher = asyncio.create_task(cancel_on_disconnect(stream, request))
    try:
        whole = await stream.collect(IDLE_WAKE_S)
    finally:
        watcher.cancel()
        stream.cancel()
    assert whole.final is not None, "a stream always ends with a final chunk"
    return whole


async def embed(
    request: Request,
    model: str | None,
    inputs: list[str | list[int]],
    pooling: str | None,
    keep_alive: float | None = None,
) -> tuple[list[list[float]], int, str]:
    """The inputs' vectors, their token count and the model's name (OpenAI's and Ollama's
    embedding routes)."""
    engine, settings = engine_of(request), settings_of(request)

    def work(loaded: Any) -> tuple[list[list[float]], int, str]:
        vectors, tokens = loaded.embed(inputs, pooling=pooling)
        return vectors, tokens, loaded.info.id

    result: tuple[list[list[float]], int, str] = await asyncio.to_thread(
        engine.with_model,
        model,
        work,
        allow_paths=settings.allow_model_paths,
        keep_alive=keep_alive,
    )
    return result
