"""The bridge from the engine's worker thread to an event loop: a request's stream of
chunks, read with `async for`, or as typed deltas (engine/output.py) at the reader's own
pace with `deltas`, or whole with `collect`."""

from __future__ import annotations

import asyncio
import queue
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

from localllm.backends.base import Chunk, TokenLogprob, ToolCall
from localllm.engine.output import Delta, OutputProcessor
from localllm.engine.request import END, Started

_TIMEOUT = object()
# unread chunks with no reader waiting: the reader has fallen behind (its client is not
# taking the frames it was sent); the request is paused until it catches up
BEHIND_CHUNKS = 64


def chunks_of(
    items: queue.Queue[Any], *, idle: Callable[[], None] | None = None
) -> Iterator[Chunk]:
    """A request's chunks from the queue its items go to, for synchronous readers: until
    END, raising the request's error. With `idle`, it is called every 0.2 s that no item
    comes (to pass on a cancel, say)."""
    while True:
        try:
            item = items.get(timeout=0.2 if idle is not None else None)
        except queue.Empty:
            if idle is not None:
                idle()
            continue
        if item is END:
            return
        if isinstance(item, BaseException):
            raise item
        if isinstance(item, Chunk):
            yield item


class ChunkStream:
    """Async iterator over a request's chunks; `started()` waits until the prompt is accepted.

    Chunks cross from the worker thread without waking the event loop for each
    token when the reader says it will not look before a deadline (`next(timeout)`):
    then only the deadline, or a final chunk, an error or the end, wakes it. A chat
    that redraws five times a second costs the loop five wake-ups a second, not
    one per token; on a machine whose cores all decode, that time is the model's.

    A reader that stops taking chunks (a streaming client that does not read its
    socket: the frames block in the server's send buffers) is `behind` once
    BEHIND_CHUNKS wait for it with no read pending; the scheduler then stops decoding
    it (engine/sequence.py), so the chunks held here stay bounded.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, job_cancel: threading.Event) -> None:
        self._items: deque[Any] = deque()
        self._loop = loop
        self._cancel = job_cancel
        self._waiter: asyncio.Future[None] | None = None
        self._eager = True  # wake the reader for every item
        self.info: Started | None = None
        self.output: OutputProcessor | None = None  # made from `info`
        self._done = False
        self.on_cancel: Callable[[], None] | None = None  # told once, on cancel()
        self._behind_since: float | None = None  # written on the worker thread only
        self.client_behind_since: float | None = None  # written on the event loop only

    def behind(self) -> float | None:  # called on the worker thread
        """Seconds since the reader fell behind; None while it keeps up. A reader waiting
        for its next item (a paced or collecting one sleeping to its deadline) is not
        behind, however many items wait; a client that holds more than the server allows
        unread in its own socket (`client_behind_since`, server/unread.py) is, from the
        moment it first did."""
        now = time.monotonic()
        client = self.client_behind_since
        waiter = self._waiter  # one already woken has not come back for its items yet
        if len(self._items) < BEHIND_CHUNKS or (waiter is not None and not waiter.done()):
            self._behind_since = None
            return None if client is None else now - client
        if self._behind_since is None:
            self._behind_since = now
        return now - min(self._behind_since, client if client is not None else now)

    def feed(self, item: Any) -> None:  # called on the worker thread
        self._items.append(item)
        routine = isinstance(item, Chunk) and item.finish_reason is None
        if self._eager or not routine:
            self._loop.call_soon_threadsafe(self._wake)

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def _take(self, timeout: float | None, eager: bool = False) -> Any:
        """The next item; `_TIMEOUT` if `timeout` seconds pass first. Every chunk wakes
        the reader when there is no timeout or when it is `eager`."""
        if not self._items:
            # Say whether a routine chunk should wake us, then look again: the worker
            # appends before it reads the flag, so one of the two sees the other.
            self._eager = timeout is None or eager
            if not self._items:
                self._waiter = self._loop.create_future()
                timer = None if timeout is None else self._loop.call_later(timeout, self._wake)
                try:
                    await self._waiter
                finally:
                    self._waiter = None
                    self._eager = True
                    if timer is not None:
                        timer.cancel()
            self._eager = True
            if not self._items:
                return _TIMEOUT
        item = self._items.popleft()
        if isinstance(item, BaseException):
            self._done = True
            raise item
        return item

    async def started(self) -> Started:
        """Wait for the worker to accept the request; raise its error if it fails first."""
        if self.info is None:
            item = await self._take(None)
            if not isinstance(item, Started):
                raise RuntimeError("worker protocol: expected Started first")
            self.info = item
            self.output = OutputProcessor(item)
        return self.info

    def __aiter__(self) -> AsyncIterator[Chunk]:
        return self

    async def __anext__(self) -> Chunk:
        chunk = await self.next()
        assert chunk is not None
        return chunk

    async def next(self, timeout: float | None = None, eager: bool = False) -> Chunk | None:
        """The next chunk; None if `timeout` seconds pass first; StopAsyncIteration at the end.

        With a timeout, chunks that arrive before it do not wake the reader (see above),
        unless it is `eager`.
        """
        if self._done:
            raise StopAsyncIteration
        await self.started()
        item = await self._take(timeout, eager)
        if item is _TIMEOUT:
            return None
        if item is END:
            self._done = True
            raise StopAsyncIteration
        return item

    async def deltas(
        self, due_in: Callable[[], float], quiet_s: float | None = None
    ) -> AsyncIterator[Delta]:
        """The answer as typed deltas, at the reader's pace (as `batches` paces text): a
        delta comes when `due_in()` reaches 0 and something is there to say, the last one
        with the final chunk. Text held back (a think tag or a tool call in the making)
        waits in the processor, not in the delta. With `quiet_s`, an empty delta comes
        whenever that long passes with nothing to say (a long prompt being read), so the
        caller can show the client the answer is still coming."""
        await self.started()
        output = self.output
        assert output is not None
        pending = Delta()
        said = time.monotonic()
        while True:
            if not pending.empty and not self._items and due_in() == 0.0:
                yield pending
                pending, said = Delta(), time.monotonic()
            due = due_in()
            if quiet_s is not None and not due and time.monotonic() - said >= quiet_s:
                yield Delta()  # nothing for quiet_s seconds
                said = time.monotonic()
            try:
                if due or quiet_s is None:
                    chunk = await self.next(due or None)
                else:  # woken by every chunk, and after quiet_s at the latest
                    chunk = await self.next(max(said + quiet_s - time.monotonic(), 0.0), True)
            except StopAsyncIteration:
                if not pending.empty:
                    yield pending
                return
            except Exception:
                if not pending.empty:
                    yield pending  # what arrived before the failure
                raise
            if chunk is None:
                continue
            pending = pending + output.chunk(chunk)
            if pending.final is not None:
                yield pending
                pending, said = Delta(), time.monotonic()

    async def collect(self, wake_s: float) -> Delta:
        """The whole answer as one delta. Tokens do not wake this reader one by one (it
        asks with a `wake_s` timeout, so only the final chunk, an error or the end does)."""
        await self.started()
        output = self.output
        assert output is not None
        texts: list[str] = []
        thoughts: list[str] = []
        scores: list[TokenLogprob] = []
        calls: list[ToolCall] = []
        final: Chunk | None = None
        while True:
            try:
                chunk = await self.next(wake_s)
            except StopAsyncIteration:
                break
            if chunk is None:
                continue
            delta = output.chunk(chunk)
            texts.append(delta.text)
            thoughts.append(delta.reasoning)
            scores += delta.logprobs
            calls += delta.tool_calls
            final = delta.final or final
        text, thought = "".join(texts), "".join(thoughts)
        return Delta(text, thought, tuple(scores), tuple(calls), final)

    def cancel(self) -> None:
        self._cancel.set()
        hook, self.on_cancel = self.on_cancel, None
        if hook is not None:
            hook()

    async def aclose(self) -> None:
        self.cancel()
