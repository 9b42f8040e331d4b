"""ChunkStream.deltas: the pieces a chat draws hold everything that arrived before them."""

from __future__ import annotations

import asyncio
import threading
import time

from localllm.backends.base import Chunk
from localllm.engine.request import END, Started
from localllm.engine.stream import ChunkStream


async def test_a_piece_holds_every_chunk_that_arrived_before_it() -> None:
    stream = ChunkStream(asyncio.get_running_loop(), threading.Event())
    stream.feed(Started(model="m", prompt_tokens=3))
    drawn = [float("-inf")]

    def due_in() -> float:  # a reader that draws at most every 0.2 s
        return max(0.0, drawn[0] + 0.2 - time.monotonic())

    pieces: list[tuple[str, bool]] = []
    stream.feed(Chunk("a", (1,)))
    async for delta in stream.deltas(due_in):
        drawn[0] = time.monotonic()
        pieces.append((delta.text, delta.final is not None))
        if len(pieces) == 1:
            # while the reader waits for its next piece, three tokens arrive from the worker
            def three() -> None:
                for t in "bcd":
                    stream.feed(Chunk(t, (2,)))

            worker = threading.Timer(0.05, three)
            worker.start()
        elif len(pieces) == 2:
            stream.feed(Chunk("e", (5,), finish_reason="stop"))
            stream.feed(END)
    # the second piece is not one interval behind: all three tokens are in it
    assert pieces == [("a", False), ("bcd", False), ("e", True)]


async def test_text_before_an_end_without_a_final_chunk_is_not_lost() -> None:
    stream = ChunkStream(asyncio.get_running_loop(), threading.Event())
    stream.feed(Started(model="m", prompt_tokens=3))
    for t in "xyz":
        stream.feed(Chunk(t, (1,)))
    stream.feed(END)
    pieces = [d.text async for d in stream.deltas(lambda: 30.0)]
    assert "".join(pieces) == "xyz"


async def test_a_quiet_reader_hears_that_the_answer_is_still_coming() -> None:
    stream = ChunkStream(asyncio.get_running_loop(), threading.Event())
    stream.feed(Started(model="m", prompt_tokens=3))
    go = threading.Event()

    def worker() -> None:  # a prompt being read until the reader has heard twice
        go.wait(10)
        stream.feed(Chunk("a", (1,)))
        stream.feed(Chunk("b", (2,), finish_reason="stop"))
        stream.feed(END)

    threading.Thread(target=worker).start()
    seen: list[str] = []
    async for delta in stream.deltas(lambda: 0.0, quiet_s=0.05):
        seen.append(delta.text)
        if seen.count("") == 2:
            go.set()
    first = next(i for i, text in enumerate(seen) if text)
    assert seen[:2] == ["", ""] and "" not in seen[first:] and "".join(seen) == "ab"


async def test_a_quiet_reader_is_still_woken_by_each_token() -> None:
    stream = ChunkStream(asyncio.get_running_loop(), threading.Event())
    stream.feed(Started(model="m", prompt_tokens=3))
    threading.Timer(0.05, lambda: stream.feed(Chunk("a", (1,)))).start()

    async def first() -> str:
        async for delta in stream.deltas(lambda: 0.0, quiet_s=60.0):
            return delta.text
        return ""

    # a reader that slept until its next beat would not see the token within the guard
    assert await asyncio.wait_for(first(), timeout=20) == "a"
