"""Requests for a remote engine's models (the rules of `model: "auto"`: engine/routing.py).

A model named REMOTE/ID (REMOTE registered with `localllm remote add`) is answered by
that engine: the request is sent as an OpenAI chat or completion request, its stream
is turned into the engine's chunks as each event arrives (no re-buffering), and the
final chunk carries the usage the engine reports (counted here when it reports none).
Routes, the chat and the accounting see the same stream as for a local model.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Protocol

from localllm import jsontext
from localllm.backends.base import Chunk, GenerationStats, ToolCall
from localllm.backends.remote import RemoteModel, Upstream
from localllm.backends.tools import new_call_id
from localllm.config import Settings
from localllm.engine.remote_wire import body_of
from localllm.engine.request import END, Request, Started
from localllm.engine.stream import ChunkStream, chunks_of
from localllm.errors import LocalLLMError, RemoteRejected, RemoteUnavailable


class Host(Protocol):
    """What a remote request needs of the engine that fronts it (engine/engine.py)."""

    def submit_local(
        self, request: Request, emit: Callable[[Any], None], cancel: threading.Event | None = None
    ) -> None: ...

    async def finished_remote(
        self, request: Request, model: str, final: Chunk, seconds: float
    ) -> None: ...

    def cancelled_remote(self) -> None: ...

    def hold_remote(self, request: Request) -> tuple[Request, Callable[[], None], int | None]:
        """The request admitted against its API key's quota: with max_tokens cut to what
        is left, the call that gives the hold back (once), and the cut limit (None: not
        cut); QuotaExceeded when its prompt does not fit."""
        ...


log = logging.getLogger(__name__)


class Remotes:
    """The registered engines, by name."""

    def __init__(self, settings: Settings, env: Mapping[str, str] | None = None) -> None:
        self.upstreams = {r.name: Upstream(r, env) for r in settings.remotes}

    def find(self, model: str | None) -> tuple[Upstream, str] | None:
        """The engine and its model id for a name REMOTE/ID; None for any other name."""
        if not model or "/" not in model:
            return None
        name, _, model_id = model.partition("/")
        upstream = self.upstreams.get(name)
        return (upstream, model_id) if upstream is not None and model_id else None

    async def models(self) -> list[RemoteModel]:
        """Every remote model, each engine asked at once (a down engine lists its
        configured models only)."""
        lists = await asyncio.gather(*(u.models() for u in self.upstreams.values()))
        return [m for models in lists for m in models]

    def models_sync(self) -> list[RemoteModel]:
        return asyncio.run(self.models()) if self.upstreams else []

    def status(self) -> list[dict[str, Any]]:
        return [u.status() for u in self.upstreams.values()]


EVENT_COST = 64  # characters an event counts for beside its text: empty deltas are bounded
MAX_CALLS = 128  # tool calls in one answer


def _shape(engine: str, ok: bool, field: str, value: Any) -> None:
    """RemoteRejected (a 502 naming the field) for an event the engine got wrong."""
    if not ok:
        raise RemoteRejected(engine, 502, f"it sent {field} = {json.dumps(value)[:80]}")


def _count(engine: str, usage: dict[str, Any], field: str) -> int | None:
    """A usage count: absent, or a whole number of at least 0 (a 502 naming it else)."""
    value = usage.get(field)
    if value is None:
        return None
    ok = isinstance(value, int) and not isinstance(value, bool) and value >= 0
    _shape(engine, ok, f"usage.{field}", value)
    return int(value)


class _Reply:
    """What the engine's events add up to: the text, the reasoning, the calls, the usage.
    An engine that parses reasoning (vLLM's and SGLang's reasoning parsers) and tool calls
    sends them apart from the text; they stay apart (engine/output.py passes them on).
    An event of the wrong shape (a choice that is not an object, an index or a count that
    is not a whole number of at least 0) is a 502 naming the field."""

    def __init__(self, engine: str) -> None:
        self.engine = engine
        self.calls: dict[int, dict[str, str]] = {}
        self.finish: str | None = None
        self.usage: dict[str, Any] | None = None
        self.pieces = 0  # content deltas: one token each on vLLM, SGLang and llama-server
        self.first: float | None = None
        self.size = 0  # characters taken: text, reasoning, calls, EVENT_COST an event

    def delta_of(self, event: dict[str, Any]) -> tuple[str, str]:
        """The event's new (text, reasoning); calls and usage are noted."""
        if event.get("usage") is not None:
            self._usage(event["usage"])
        choices = event.get("choices") or []
        _shape(self.engine, isinstance(choices, list), "choices", choices)
        text = thought = ""
        self.size += EVENT_COST
        for choice in choices:
            _shape(self.engine, isinstance(choice, dict), "choices[]", choice)
            index = choice.get("index", 0)  # one answer is asked for (n = 1)
            _shape(self.engine, index == 0 and index is not False, "choices[].index", index)
            if choice.get("finish_reason"):
                self.finish = str(choice["finish_reason"])
            delta = choice.get("delta") or {}
            _shape(self.engine, isinstance(delta, dict), "choices[].delta", delta)
            piece = delta.get("content") if "delta" in choice else choice.get("text")
            thought += _text(self.engine, delta, "reasoning_content") or _text(
                self.engine, delta, "reasoning"
            )
            _shape(self.engine, isinstance(piece, (str, type(None))), "content", piece)
            text += piece or ""
            calls = delta.get("tool_calls") or []
            _shape(self.engine, isinstance(calls, list), "delta.tool_calls", calls)
            for call in calls:
                self._call(call)
        if text or thought:
            self.pieces += 1
            if self.first is None:
                self.first = time.monotonic()
        self.size += len(text) + len(thought)
        return text, thought

    def _usage(self, usage: Any) -> None:
        _shape(self.engine, isinstance(usage, dict), "usage", usage)
        for field in ("prompt_tokens", "completion_tokens"):
            _count(self.engine, usage, field)
        details = usage.get("prompt_tokens_details") or {}
        _shape(self.engine, isinstance(details, dict), "usage.prompt_tokens_details", details)
        _count(self.engine, details, "cached_tokens")
        self.usage = usage

    def _call(self, call: Any) -> None:
        _shape(self.engine, isinstance(call, dict), "delta.tool_calls[]", call)
        index = call.get("index", 0)
        ok = isinstance(index, int) and not isinstance(index, bool) and 0 <= index < MAX_CALLS
        _shape(self.engine, ok, "delta.tool_calls[].index", index)
        into = self.calls.setdefault(index, {"id": "", "name": "", "args": ""})
        into["id"] = into["id"] or _text(self.engine, call, "id")
        function = call.get("function") or {}
        _shape(self.engine, isinstance(function, dict), "delta.tool_calls[].function", function)
        name, args = _text(self.engine, function, "name"), _text(self.engine, function, "arguments")
        into["name"] += name
        into["args"] += args
        self.size += len(name) + len(args)

    def tool_calls(self, engine: str) -> tuple[ToolCall, ...]:
        """The calls the engine made, whole; RemoteRejected for one whose arguments are
        not a JSON object (nothing is passed on altered)."""
        out = []
        for _, call in sorted(self.calls.items()):
            args = call["args"] or "{}"
            try:
                parsed = jsontext.loads(args)
            except ValueError:
                parsed = None
            if not isinstance(parsed, dict):
                raise RemoteRejected(
                    engine,
                    502,
                    f"it sent a call of {call['name']!r} whose arguments are not a JSON "
                    f"object: {args[:200]!r}",
                )
            arguments = json.dumps(parsed, ensure_ascii=False)
            out.append(ToolCall(call["id"] or new_call_id(), call["name"], arguments))
        return tuple(out)


def _text(engine: str, where: dict[str, Any], field: str) -> str:
    """A text field of an event: absent or a string (a 502 naming it else)."""
    value = where.get(field)
    _shape(engine, isinstance(value, (str, type(None))), field, value)
    return value or ""


COUNT_ROUTES = ("/tokenize", "/extras/tokenize/count")


async def _prompt_count(up: Upstream, model_id: str, body: dict[str, Any]) -> int:
    """The prompt's tokens when the engine reports no usage, counted by its own
    tokenizer: vLLM's and SGLang's /tokenize (the chat template included), else
    llama-cpp-python's /extras/tokenize/count (the messages' text alone: the template's
    few tokens are not counted); 0 when the engine has neither. The route that answers
    is remembered."""
    if "messages" in body:
        text = "\n".join(str(m.get("content") or "") for m in body["messages"])
        asks = [{"model": model_id, "messages": body["messages"]}, {"input": text}]
    else:
        asks = [{"model": model_id, "prompt": body["prompt"]}, {"input": body["prompt"]}]
    for route, ask in zip(COUNT_ROUTES, asks, strict=True):
        if up.count_route not in (None, route):
            continue
        data = await up.post(route, ask)
        if data is None:
            continue
        up.count_route = route
        count = data.get("count")
        if isinstance(count, int) and count >= 0:
            return count
        tokens = data.get("tokens")
        return len(tokens) if isinstance(tokens, list) else 0
    up.count_route = ""
    return 0


MAX_REMOTE_CHARS, MAX_REMOTE_S = 8 * 1024 * 1024, 3600.0  # an answer's bounds, any request


async def answer(
    engine: Host, request: Request, up: Upstream, model_id: str, feed: Callable[[Any], None]
) -> None:
    """Run one request on a remote engine, feeding Started, chunks and END (or the
    error) to `feed`; the local fallback answers when the engine cannot and has one.
    The request is held against its key's quota meanwhile, as a local one is."""
    request, release, capped = engine.hold_remote(request)
    try:
        await _answer(engine, request, up, model_id, feed, release, capped)
    finally:
        release()


async def _answer(
    engine: Host,
    request: Request,
    up: Upstream,
    model_id: str,
    feed: Callable[[Any], None],
    release: Callable[[], None],
    capped: int | None,
) -> None:
    name = request.model or f"{up.name}/{model_id}"
    begun = time.monotonic()
    path, body = body_of(request, model_id)
    reply = _Reply(up.name)
    started = False
    events = up.stream(path, body)
    limit = request.params.max_tokens
    try:
        async for event in events:
            text, thought = reply.delta_of(event)
            # an engine that ignores max_tokens is cut (its request closed) at the piece
            # past the limit; one that keeps it goes on to its usage, after the last piece
            if limit is not None and reply.pieces > limit:
                reply.finish = reply.finish or "length"
                break
            if not started:
                feed(Started(name, 0, backend="remote", quota_max_tokens=capped))
                started = True
            if text or thought:
                feed(Chunk(text, (), reasoning=thought))
            if reply.size > MAX_REMOTE_CHARS or time.monotonic() - begun > MAX_REMOTE_S:
                reply.finish = reply.finish or "length"
                break
    except RemoteUnavailable as exc:
        if started or not up.remote.fallback:
            raise
        log.warning("%s; the fallback %s answers", exc.message, up.remote.fallback)
        release()  # the local model's request holds its own
        await _fallback(engine, request, up.remote.fallback, name, exc.reason, feed)
        return
    finally:
        await events.aclose()
    if reply.finish is None:  # llama-cpp-python, for one, closes a refused stream silently
        raise RemoteRejected(
            up.name,
            502,
            "it closed the stream without finishing the answer (no finish_reason); "
            "its log says why",
        )
    if not started:
        feed(Started(name, 0, backend="remote", quota_max_tokens=capped))
    usage = reply.usage or {}
    prompt = usage.get("prompt_tokens")
    if prompt is None:
        # counted once the answer is whole, not beside it: llama-cpp-python's server
        # ends a stream when another request arrives
        prompt = await _prompt_count(up, model_id, body)
    fed = reply.pieces if limit is None else min(reply.pieces, limit)
    generated = usage.get("completion_tokens")
    generated = fed if generated is None else generated
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
    ended = time.monotonic()
    first = reply.first or ended
    tps = (generated - 1) / (ended - first) if generated > 1 and ended > first else 0.0
    stats = GenerationStats(int(prompt), int(cached), int(generated), first - begun, tps)
    final = Chunk(
        "",
        (),
        finish_reason="length" if reply.finish == "length" else "stop",
        stats=stats,
        tool_calls=reply.tool_calls(up.name),
    )
    await engine.finished_remote(request, name, final, ended - begun)
    feed(final)


async def _fallback(
    engine: Host,
    request: Request,
    fallback: str,
    asked: str,
    reason: str,
    feed: Callable[[Any], None],
) -> None:
    """The request answered by the local fallback model, its Started saying so."""
    local = dataclasses.replace(request, model=fallback)
    done = asyncio.get_running_loop().create_future()

    def relay(item: Any) -> None:  # on the worker thread
        if isinstance(item, Started):
            item = dataclasses.replace(item, fallback_from=asked, note=reason)
        if item is END or isinstance(item, BaseException):
            done.get_loop().call_soon_threadsafe(_settle, done, item)
            return
        feed(item)

    engine.submit_local(local, relay)
    item = await done
    if isinstance(item, BaseException):
        raise item


def _settle(done: asyncio.Future[Any], item: Any) -> None:
    if not done.done():
        done.set_result(item)


def submit(engine: Host, request: Request, up: Upstream, model_id: str) -> ChunkStream:
    """The remote request as a stream read on this event loop; cancelling the stream
    cancels the task, which closes the engine's connection."""
    loop = asyncio.get_running_loop()
    stream = ChunkStream(loop, threading.Event())
    task = loop.create_task(_pump(engine, request, up, model_id, stream.feed))

    def cancel() -> None:
        loop.call_soon_threadsafe(task.cancel)

    stream.on_cancel = cancel
    return stream


async def _pump(
    engine: Host, request: Request, up: Upstream, model_id: str, feed: Callable[[Any], None]
) -> None:
    try:
        await answer(engine, request, up, model_id, feed)
    except asyncio.CancelledError:
        engine.cancelled_remote()
        feed(END)
        return
    except LocalLLMError as exc:
        feed(exc)
        return
    except Exception as exc:  # a bug: the client hears it, the server keeps serving
        log.exception("a remote request failed")
        feed(LocalLLMError(f"internal error: {exc}"))
        return
    feed(END)


def generate(
    engine: Host, request: Request, up: Upstream, model_id: str, cancel: threading.Event
) -> Iterator[Chunk]:
    """Synchronous twin for callers without an event loop (the CLI's `run`)."""
    import queue

    out: queue.Queue[Any] = queue.Queue()
    loop = asyncio.new_event_loop()
    task_box: list[asyncio.Task[None]] = []

    def run() -> None:
        task = loop.create_task(_pump(engine, request, up, model_id, out.put))
        task_box.append(task)
        loop.run_until_complete(task)
        loop.close()

    thread = threading.Thread(target=run, name="localllm-remote", daemon=True)
    thread.start()

    def stop() -> None:
        if task_box:
            with contextlib.suppress(RuntimeError):  # the loop closed: the task has ended
                loop.call_soon_threadsafe(task_box[0].cancel)

    try:
        yield from chunks_of(out, idle=lambda: stop() if cancel.is_set() else None)
    finally:
        stop()
