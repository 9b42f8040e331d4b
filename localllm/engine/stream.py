"""The bridge from the engine's worker thread to an event loop: a request's stream of
chunks, read with `async for` (or at the reader's own pace with `batches`)."""

from __future__ import annotations

import asyncio
import queue
import threading
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from typing import Any

from localllm.backends.base import Chunk, TokenLogprob


@dataclass(frozen=True, slots=True)
class Started:
    """Sent once a request's prompt is rendered and fits: the stream will now produce chunks."""

    model: str
    prompt_tokens: int
    dropped_messages: int = 0  # by the truncate-oldest policy
    prompt_tokens_before: int = 0  # the prompt's length before those were dropped
    tool_format: str | None = None  # how the reply writes tool calls (backends/tools.py)
    backend: str | None = None  # "remote" for a remote engine's model (else not said)
    # how the reply may carry reasoning (backends/reasoning.py): "open", "tags" or None
    reasoning: str | None = None
    # a remote that could not answer, when its local fallback does instead, and why
    fallback_from: str | None = None
    note: str | None = None


END = object()  # the worker's last item for a request
_TIMEOUT = object()


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
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, job_cancel: threading.Event) -> None:
        self._items: deque[Any] = deque()
        self._loop = loop
        self._cancel = job_cancel
        self._waiter: asyncio.Future[None] | None = None
        self._eager = True  # wake the reader for every item
        self.info: Started | None = None
        self._done = False
        self.on_cancel: Callable[[], None] | None = None  # told once, on cancel()

    def feed(self, item: Any) -> None:  # called on the worker thread
        self._items.append(item)
        routine = isinstance(item, Chunk) and item.finish_reason is None
        if self._eager or not routine:
            self._loop.call_soon_threadsafe(self._wake)

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def _take(self, timeout: float | None) -> Any:
        """The next item; `_TIMEOUT` if `timeout` seconds pass first."""
        if not self._items:
            # Say whether a routine chunk should wake us, then look again: the worker
            # appends before it reads the flag, so one of the two sees the other.
            self._eager = timeout is None
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
        return self.info

    def __aiter__(self) -> AsyncIterator[Chunk]:
        return self

    async def __anext__(self) -> Chunk:
        chunk = await self.next()
        assert chunk is not None
        return chunk

    async def next(self, timeout: float | None = None) -> Chunk | None:
        """The next chunk; None if `timeout` seconds pass first; StopAsyncIteration at the end.

        With a timeout, chunks that arrive before it do not wake the reader (see above).
        """
        if self._done:
            raise StopAsyncIteration
        await self.started()
        item = await self._take(timeout)
        if item is _TIMEOUT:
            return None
        if item is END:
            self._done = True
            raise StopAsyncIteration
        return item

    async def batches(self, due_in: Callable[[], float]) -> AsyncIterator[tuple[str, Chunk | None]]:
        """The answer's text in pieces, for readers that draw it at their own pace.

        A piece comes when `due_in()` (seconds until the reader wants to draw again)
        reaches 0, the first one at once; the last comes with the final chunk. Tokens
        that arrive before a piece is due do not wake the reader, and a piece holds all
        that arrived before it (what waited in the queue is taken first, so the screen
        is never an interval behind the model).
        """
        async for text, _, final in self.pieces(due_in):
            yield text, final

    async def pieces(
        self, due_in: Callable[[], float]
    ) -> AsyncIterator[tuple[str, list[TokenLogprob], Chunk | None]]:
        """As `batches`, with the log probabilities of each piece's tokens (when asked)."""
        pending = ""
        scores: list[TokenLogprob] = []
        while True:
            if pending and not self._items and due_in() == 0.0:
                yield pending, scores, None
                pending, scores = "", []
            try:
                # before a piece is due, tokens need not wake us; after it, the next one does
                chunk = await self.next(due_in() or None)
            except StopAsyncIteration:
                if pending:
                    yield pending, scores, None
                return
            except Exception:
                if pending:
                    yield pending, scores, None  # what arrived before the failure
                raise
            if chunk is None:
                continue
            scores += chunk.logprobs
            if chunk.finish_reason is not None:
                yield pending + chunk.text, scores, chunk
                pending, scores = "", []
            else:
                pending += chunk.text

    def cancel(self) -> None:
        self._cancel.set()
        hook, self.on_cancel = self.on_cancel, None
        if hook is not None:
            hook()

    async def aclose(self) -> None:
        self.cancel()
