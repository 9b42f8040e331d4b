"""Streams open at once share one frame rate, and a stream that ends gives its share back
however it ends (its answer done, an error, the client gone)."""

from __future__ import annotations

import asyncio
import threading

from localllm.backends.base import Chunk
from localllm.engine.request import END, Started
from localllm.engine.stream import ChunkStream
from localllm.server.framing import Pace, Streams, paced


def test_each_of_n_open_streams_frames_every_n_intervals() -> None:
    streams = Streams()
    pace = Pace(0.02, streams)
    assert pace.interval() == 0.02  # none open yet (a stream about to start): its own rate
    streams.open = 1
    assert pace.interval() == 0.02
    streams.open = 4
    assert abs(pace.interval() - 0.08) < 1e-12


def _stream(
    loop: asyncio.AbstractEventLoop, *texts: str, cancel: threading.Event | None = None
) -> ChunkStream:
    stream = ChunkStream(loop, cancel or threading.Event())
    stream.feed(Started(model="m", prompt_tokens=3))
    for i, text in enumerate(texts):
        stream.feed(Chunk(text, (i,)))
    return stream


def _text_frames(delta: object) -> list[bytes]:
    text = getattr(delta, "text", "")
    return [text.encode()] if text else []


async def test_open_streams_are_counted_until_each_ends_however_it_ends() -> None:
    loop = asyncio.get_running_loop()
    streams = Streams()
    pace = Pace(0.001, streams)

    done = _stream(loop, "a")
    left = threading.Event()
    gone = _stream(loop, "b", cancel=left)
    failing = _stream(loop, "c")
    frames = {
        name: paced(s, _text_frames, pace=pace, on_error=lambda exc: b"error", tail=(b"end",))
        for name, s in (("done", done), ("gone", gone), ("failing", failing))
    }
    assert streams.open == 0  # a body nobody reads yet is not framing

    assert await anext(frames["done"]) == b"a"
    assert streams.open == 1
    assert await anext(frames["gone"]) == b"b"
    assert await anext(frames["failing"]) == b"c"
    assert streams.open == 3
    assert pace.interval() == 0.003

    # one answer ends: its last text, the final chunk, the tail
    done.feed(Chunk("z", (9,), finish_reason="stop"))
    done.feed(END)
    rest = [frame async for frame in frames["done"]]
    assert rest == [b"z", b"end"]
    assert streams.open == 2

    # one fails after its first frame: the error frame, then the tail
    failing.feed(RuntimeError("the backend fell over"))
    rest = [frame async for frame in frames["failing"]]
    assert rest == [b"error", b"end"]
    assert streams.open == 1

    # the client of the last one leaves (the server closes its body mid-answer)
    await frames["gone"].aclose()
    assert streams.open == 0
    assert left.is_set()  # and its generation is cancelled


async def test_a_stream_frames_at_the_shared_rate_while_another_is_open() -> None:
    """The clock is the test's: 70 ms after a stream's first frame its next one is due
    alone (every 50 ms) but not while a second stream shares the rate (every 100 ms); it
    goes out once the other ends."""
    loop = asyncio.get_running_loop()
    streams = Streams()
    pace = Pace(0.05, streams)
    now = [100.0]
    mine, other = _stream(loop, "a"), _stream(loop, "x")
    frames = paced(mine, _text_frames, pace=pace, on_error=lambda exc: b"error",
                   clock=lambda: now[0])
    others = paced(other, _text_frames, pace=pace, on_error=lambda exc: b"error")
    assert await anext(frames) == b"a"  # the first piece at once
    assert await anext(others) == b"x"
    mine.feed(Chunk("b", (1,)))
    waiting = asyncio.create_task(anext(frames))
    await asyncio.sleep(0.05)  # the reader notes when "a" went out (100.0 by the test's clock)
    now[0] += 0.07
    await asyncio.sleep(0.2)
    assert not waiting.done()  # due at 100.1 by the test's clock, which says 100.07
    await others.aclose()  # the other stream ends: one stream's rate again
    assert await asyncio.wait_for(waiting, 5) == b"b"
    await frames.aclose()
