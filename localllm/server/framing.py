"""The one paced loop that turns a request's deltas into a streamed body: server-sent
events (OpenAI, Anthropic) or newline-delimited JSON (Ollama).

The first piece goes out at once; after that, at most one frame every `interval_s`
(deltas that arrive meanwhile share a frame). Each frame costs the client a JSON parse
and the server a write, and on a machine whose cores all decode, that work comes out of
the model's time; a frame every 20 ms is still smooth to a reader. Streams open at the
same time share that rate (`Pace`): with n of them, each frames at most every n
intervals, so concurrent clients cost the model no more frames than one does. A failure
after the first frame ends the body with the API's own error frame. While nothing is
said for KEEP_ALIVE_S (a long prompt being read on a CPU takes minutes), a keep-alive
frame goes out where the API has one: Node's HTTP client, which Claude Code and other
agents use, drops a body that sends nothing for 300 s, and then sends the whole request
again.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Iterable
from dataclasses import dataclass
from typing import Any

from fastapi.responses import StreamingResponse

from localllm.engine.output import Delta
from localllm.engine.stream import ChunkStream
from localllm.server.unread import LOOK_S, Unread

_dumps = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode

SSE_DONE = b"data: [DONE]\n\n"
KEEP_ALIVE_S = 10.0
SSE_COMMENT = b": keep-alive\n\n"  # a comment line: every SSE reader skips it


def sse(payload: dict[str, Any]) -> bytes:
    """`data: {...}` and a blank line."""
    return b"data: " + _dumps(payload).encode("utf-8") + b"\n\n"


def sse_event(name: str, payload: dict[str, Any]) -> bytes:
    """A named server-sent event (Anthropic's)."""
    return f"event: {name}\ndata: {_dumps(payload)}\n\n".encode()


def ndjson(payload: dict[str, Any]) -> bytes:
    return _dumps(payload).encode("utf-8") + b"\n"


@dataclass(slots=True)
class Streams:
    """How many paced streams one server has open (all its APIs together)."""

    open: int = 0


@dataclass(frozen=True, slots=True)
class Pace:
    """How often a stream may frame: every `interval_s` while it is the only one open,
    every n intervals while n are (what that saves four streams: docs/benchmarks-log.md,
    "Every figure paired, and streams that share one frame rate"). `unread`: the local
    client's socket, looked at while the stream is open (server/unread.py)."""

    interval_s: float
    streams: Streams
    unread: Unread | None = None

    def interval(self) -> float:
        return self.interval_s * max(1, self.streams.open)


async def paced(
    stream: ChunkStream,
    encode: Callable[[Delta], Iterable[bytes]],
    *,
    pace: Pace,
    on_error: Callable[[Exception], bytes],
    head: Iterable[bytes] = (),
    tail: Iterable[bytes] = (),
    keep_alive: bytes | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> AsyncGenerator[bytes, None]:
    """`head`, then the frames `encode` makes of each delta, then `tail` (also after an
    error frame). An `encode` that has nothing to say for a delta returns no frames.
    `keep_alive` goes out after each KEEP_ALIVE_S with nothing to say. The stream counts
    as open in `pace` from the end of `head` until its last delta is out."""
    last_sent = float("-inf")

    def due_in() -> float:
        return max(0.0, last_sent + pace.interval() - clock())

    for frame in head:
        yield frame
    pace.streams.open += 1
    watch = asyncio.create_task(_watch(stream, pace.unread)) if pace.unread else None
    try:
        quiet_s = KEEP_ALIVE_S if keep_alive is not None else None
        async for delta in stream.deltas(due_in, quiet_s):
            if keep_alive is not None and delta.empty and delta.final is None:
                yield keep_alive
                continue
            for frame in encode(delta):
                yield frame
            last_sent = clock()
    except Exception as exc:  # after the first frame: an error frame, then the end
        yield on_error(exc)
    finally:
        pace.streams.open -= 1
        if watch is not None:
            watch.cancel()
        stream.cancel()
    for frame in tail:
        yield frame


async def _watch(stream: ChunkStream, unread: Unread) -> None:
    """Tell the stream, every LOOK_S, since when its client has held too much unread."""
    while True:
        stream.client_behind_since = unread.look()
        await asyncio.sleep(LOOK_S)


def streaming(
    frames: AsyncIterator[bytes], media_type: str = "text/event-stream"
) -> StreamingResponse:
    headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
    return StreamingResponse(frames, media_type=media_type, headers=headers)
