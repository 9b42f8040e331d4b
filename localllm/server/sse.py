"""Server-sent events: `data: {...}\\n\\n` frames ending in `data: [DONE]`."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Callable

from localllm.backends.base import Chunk, TokenLogprob
from localllm.engine.stream import ChunkStream
from localllm.server.errors import stream_error

_dumps = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode

DONE = b"data: [DONE]\n\n"


def frame(payload: dict) -> bytes:
    return b"data: " + _dumps(payload).encode("utf-8") + b"\n\n"


async def sse_frames(
    stream: ChunkStream,
    on_text: Callable[[str, list[TokenLogprob]], dict | None],
    on_final: Callable[[Chunk, str, list[TokenLogprob]], list[dict]],
    *,
    interval_s: float,
) -> AsyncIterator[bytes]:
    """Frames for a stream (`on_text` may hold a piece back by answering None).

    The first text goes out at once; after that, text is sent at most every
    `interval_s` (tokens that arrive meanwhile share a frame). Each frame costs the
    client a JSON parse, and on a machine whose cores all decode, that work comes
    out of the model's time; a frame every 20 ms is still smooth to a reader.
    """
    last_sent = float("-inf")

    def due_in() -> float:
        return max(0.0, last_sent + interval_s - time.monotonic())

    try:
        async for text, scores, final in stream.pieces(due_in):
            if final is None:
                payload = on_text(text, scores)
                if payload is not None:
                    yield frame(payload)
                last_sent = time.monotonic()
            else:
                for payload in on_final(final, text, scores):
                    yield frame(payload)
    except Exception as exc:  # after the first frame: an error frame, then the end
        yield frame(stream_error(exc))
    finally:
        stream.cancel()
    yield DONE
