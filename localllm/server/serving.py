"""What every API's routes share: start a request, collect a whole answer, cancel when the
client leaves, and say who is asking."""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from fastapi import Request
from fastapi.responses import StreamingResponse

from localllm.config import Settings
from localllm.engine.client import EngineClient
from localllm.engine.output import Delta
from localllm.engine.request import Request as EngineRequest
from localllm.engine.request import Started
from localllm.engine.stream import ChunkStream
from localllm.errors import BadModelOutput, ClientLeft
from localllm.server import framing
from localllm.server.unread import Unread

log = logging.getLogger(__name__)

IDLE_WAKE_S = 30.0  # a non-streaming reader only needs waking for the final chunk


def engine_of(request: Request) -> EngineClient:
    engine: EngineClient = request.app.state.engine
    return engine


def settings_of(request: Request) -> Settings:
    settings: Settings = request.app.state.settings
    return settings


def pace(request: Request) -> framing.Pace:
    """How often a stream of this request may frame (`stream_interval_ms`, shared by the
    server's open streams)."""
    streams: framing.Streams = request.app.state.streams
    unread = Unread.of(request.scope.get("client"), request.scope.get("server"))
    return framing.Pace(settings_of(request).stream_interval_ms / 1000.0, streams, unread)


async def on_disconnect(request: Request, then: Callable[[], None]) -> None:
    """`then()` when the client goes away."""
    while (await request.receive())["type"] != "http.disconnect":
        pass
    then()


async def cancel_on_disconnect(stream: ChunkStream, request: Request) -> None:
    """Cancel the generation when the client goes away (so a request that waits in the
    queue is dropped before its prompt is read)."""
    await on_disconnect(request, stream.cancel)


def admin_of(request: Request) -> tuple[bool, str]:
    """Whether the request's key may change the server for every client, and its name
    (set by the guard: server/guard.py)."""
    state = request.scope.get("state", {})
    return bool(state.get("admin", False)), str(state.get("client", "anonymous"))


def who(request: Request) -> dict[str, Any]:
    """The engine request's fields that say who asked (from the guard) and what it may name."""
    state = request.scope.get("state", {})
    return {
        "client": state.get("client", "anonymous"),
        "request_id": state.get("request_id"),
        "allow_paths": settings_of(request).allow_model_paths,
    }


async def _accepted(
    request: Request, req: EngineRequest, within: float | None
) -> tuple[ChunkStream, asyncio.Future[Started]]:
    """Submit a request and wait at most `within` seconds (None: as long as it takes) for
    its prompt to be accepted: the stream, and its start (done, or still to come). An error
    meanwhile is raised (it keeps its status); a client that leaves meanwhile cancels it."""
    stream = engine_of(request).submit(req)
    waiting = asyncio.ensure_future(stream.started())
    watcher = asyncio.create_task(cancel_on_disconnect(stream, request))
    try:
        await asyncio.wait({waiting}, timeout=within)
        if waiting.done():
            waiting.result()
    except BaseException:
        waiting.cancel()
        stream.cancel()
        raise
    finally:
        watcher.cancel()
    return stream, waiting


async def start(request: Request, req: EngineRequest) -> tuple[ChunkStream, Started]:
    """Submit a request and wait until its prompt is accepted (errors before the first
    token keep their status; a client that leaves meanwhile cancels it)."""
    stream, waiting = await _accepted(request, req, None)
    return stream, waiting.result()


async def start_streamed(
    request: Request,
    req: EngineRequest,
    answer: Callable[[ChunkStream, Started], StreamingResponse],
    *,
    keep_alive: bytes,
    on_error: Callable[[Exception], bytes],
) -> StreamingResponse:
    """A streamed answer's response, made by `answer` once the prompt is accepted. An error
    within KEEP_ALIVE_S keeps its status, as with `start`; a prompt that takes longer to
    read (minutes on a CPU) gets the response's headers then and `keep_alive` frames until
    it is accepted, so that a client with a header or idle timeout (Node's: 300 s) does
    not give up and send it again; an error after that is `on_error`'s frame."""
    stream, waiting = await _accepted(request, req, framing.KEEP_ALIVE_S)
    if waiting.done():
        try:
            return answer(stream, waiting.result())
        except BaseException:
            stream.cancel()
            raise

    async def later() -> AsyncIterator[bytes]:
        try:
            while not waiting.done():
                await asyncio.wait({waiting}, timeout=framing.KEEP_ALIVE_S)
                if not waiting.done():
                    yield keep_alive
            try:
                response = answer(stream, waiting.result())
            except Exception as exc:
                yield on_error(exc)
                return
            async for frame in response.body_iterator:
                assert isinstance(frame, bytes), "the routes' frames are bytes"
                yield frame
        finally:
            waiting.cancel()
            stream.cancel()

    return framing.streaming(later())


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
    embedding routes), computed in pieces (`in_pieces`)."""

    def work(loaded: Any, piece: list[Any], first: int) -> tuple[list[Any], int]:
        got: tuple[list[Any], int] = loaded.embed(piece, pooling=pooling, first=first)
        return got

    def count(loaded: Any, item: Any) -> int:
        return len(loaded.tokenize(item)) if isinstance(item, str) else len(item)

    return await in_pieces(
        request,
        model,
        inputs,
        work,
        size=_chars,
        what="embeddings",
        keep_alive=keep_alive,
        count=count,
    )


async def rerank(
    request: Request, model: str | None, query: str, documents: list[str], cut: str | None
) -> tuple[list[float], int, str]:
    """Each document's relevance score, in the documents' order, the tokens read and the
    model's name (the rerank routes), computed in pieces (`in_pieces`)."""

    def work(loaded: Any, piece: list[Any], first: int) -> tuple[list[Any], int]:
        got: tuple[list[Any], int] = loaded.rerank(query, piece, first=first, cut=cut)
        return got

    def size(doc: Any) -> int:
        return len(query) + len(doc)

    def count(loaded: Any, doc: Any) -> int:
        return len(loaded.tokenize(query)) + len(loaded.tokenize(doc))

    return await in_pieces(
        request, model, documents, work, size=size, what="reranking", count=count
    )


async def in_pieces(
    request: Request,
    model: str | None,
    items: list[Any],
    work: Callable[[Any, list[Any], int], tuple[list[Any], int]],
    *,
    size: Callable[[Any], int],
    what: str,
    keep_alive: float | None = None,
    count: Callable[[Any, Any], int] | None = None,
) -> tuple[list[Any], int, str]:
    """work(the loaded model, a piece of the items, the index of its first) over all the
    items: the results in order, the tokens read and the model's name.

    Each piece (`_piece`, by `size` in characters) is a call of its own on the engine's
    worker, so requests decoding meanwhile get their steps between two pieces instead of
    waiting for all of it (`_share`); when the client leaves, the pieces not yet begun are
    not computed."""
    engine, settings = engine_of(request), settings_of(request)
    accounting = getattr(request.app.state, "accounting", None)
    client = who(request)["client"]
    left = asyncio.Event()
    watcher = asyncio.create_task(on_disconnect(request, left.set))
    results: list[Any] = []
    tokens, name, done = 0, model or "", 0
    started = time.monotonic()
    try:
        # held against the key's tokens for the day: each piece counted before it is read
        limited = accounting is not None and accounting.limited(client)
        while done < len(items):
            piece = _piece(items, done, EMBED_PIECE, size)
            began = time.monotonic()

            def call(
                loaded: Any, piece: list[Any] = piece, first: int = done, read: int = tokens
            ) -> Any:
                if limited and accounting is not None and count is not None:
                    ahead = sum(count(loaded, item) for item in piece)
                    accounting.check_tokens(client, read + ahead, what)
                got, n = work(loaded, piece, first)
                _finite(got, loaded.info.id, what, first)
                return got, n, loaded.info.id

            got, n, name = await asyncio.to_thread(
                engine.with_model,
                model,
                call,
                allow_paths=settings.allow_model_paths,
                keep_alive=keep_alive,
            )
            results += got
            tokens += n
            done += len(piece)
            if left.is_set() and done < len(items):
                log.info("%s: the client left after %d of %d inputs", what, done, len(items))
                raise ClientLeft(done, len(items))
            if done < len(items):
                await _share(engine, time.monotonic() - began)
    finally:
        watcher.cancel()
        if accounting is not None and tokens:  # counted as completions are, read or not
            accounting.record(client, tokens, 0, 0, time.monotonic() - started)
    return results, tokens, name


# characters of input per piece of embedding work (an input is never split): about a
# prompt chunk of tokens, and while other requests run as long again is left to them
# (_share). It is also what a request that comes meanwhile waits at most, so it is the same
# when nothing else runs (2,048 there kept a request 20 s behind a job on a loaded machine;
# and larger pieces were no faster: 64 inputs of 1 KB on the starter took 157 s in one call
# and 118-125 s in pieces of 1 to 8)
EMBED_PIECE = 512
EMBED_YIELD_MAX_S = 5.0
EMBED_YIELD_LOOK_S = 0.02


def _busy(engine: EngineClient) -> bool:
    """Whether other requests run or wait (counted now, not at the last step)."""
    status = engine.status()
    return bool(status.activity.get("active") or status.queued)


async def _share(engine: EngineClient, spent: float) -> None:
    """After a piece that took `spent` seconds: while others run, leave the worker to them
    for as long again (at most EMBED_YIELD_MAX_S), so that a stream beside a long embedding
    job decodes at about half its speed rather than a token per piece."""
    deadline = time.monotonic() + min(spent, EMBED_YIELD_MAX_S)
    while _busy(engine) and time.monotonic() < deadline:
        await asyncio.sleep(EMBED_YIELD_LOOK_S)


def _finite(results: list[Any], model: str, what: str, first: int) -> None:
    """BadModelOutput when a score or a vector holds NaN or infinity (JSON has neither)."""

    def finite(value: Any) -> bool:  # a score, a vector, or a vector per token
        if isinstance(value, (list, tuple)):
            return all(finite(v) for v in value)
        return math.isfinite(value)

    for i, value in enumerate(results):
        if not finite(value):
            raise BadModelOutput(model, what, first + i)


def _chars(item: str | list[int]) -> int:
    """An embedding input's size in characters (a token id counts as four)."""
    return len(item) * (1 if isinstance(item, str) else 4)


def _piece(items: list[Any], start: int, chars: int, size: Callable[[Any], int]) -> list[Any]:
    """Items from `start` up to about `chars` characters, at least one."""
    end, used = start, 0
    while end < len(items):
        n = size(items[end])
        if end > start and used + n > chars:
            break
        used += n
        end += 1
    return items[start:end]
