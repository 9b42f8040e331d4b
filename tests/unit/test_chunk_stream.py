"""ChunkStream.batches: the pieces a chat draws hold everything that arrived before them."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from localllm.backends.base import Chunk
from localllm.engine.stream import END, ChunkStream, Started


async def test_a_piece_holds_every_chunk_that_arrived_before_it() -> None:
    stream = ChunkStream(asyncio.get_running_loop(), threading.Event())
    stream._feed(Started(model="m", prompt_tokens=3))
    drawn = [float("-inf")]

    def due_in() -> float:  # a reader that draws at most every 0.2 s
        return max(0.0, drawn[0] + 0.2 - time.monotonic())

    pieces: list[tuple[str, bool]] = []
    stream._feed(Chunk("a", (1,)))
    async for text, last in stream.batches(due_in):
        drawn[0] = time.monotonic()
        pieces.append((text, last is not None))
        if len(pieces) == 1:
            # while the reader waits for its next piece, three tokens arrive from the worker
            worker = threading.Timer(0.05, lambda: [stream._feed(Chunk(t, (2,))) for t in "bcd"])
            worker.start()
        elif len(pieces) == 2:
            stream._feed(Chunk("e", (5,), finish_reason="stop"))
            stream._feed(END)
    # the second piece is not one interval behind: all three tokens are in it
    assert pieces == [("a", False), ("bcd", False), ("e", True)]


async def test_text_before_an_end_without_a_final_chunk_is_not_lost() -> None:
    stream = ChunkStream(asyncio.get_running_loop(), threading.Event())
    stream._feed(Started(model="m", prompt_tokens=3))
    for t in "xyz":
        stream._feed(Chunk(t, (1,)))
    stream._feed(END)
    pieces = [text async for text, _ in stream.batches(lambda: 30.0)]
    assert "".join(pieces) == "xyz"


def test_the_redraw_pacer_remembers_what_a_redraw_costs_across_answers() -> None:
    from localllm.tui.pacing import RedrawPacer

    pacer = RedrawPacer(budget=0.02, min_interval=0.1, max_interval=0.75)
    pacer.start()
    assert pacer.wait() == 0.0  # an answer's first piece is drawn at once
    pacer.drawn(0.01)  # a redraw that cost the UI thread 10 ms
    assert pacer.interval == pytest.approx(0.5)  # 10 ms is 2% of 0.5 s
    assert pacer.wait() > 0.4
    pacer.drawn(0.1)
    assert pacer.interval == 0.75  # at most
    pacer.start()  # the next answer
    assert pacer.wait() == 0.0
    pacer.drawn(None)  # a piece taken while nothing is shown: the spacing holds
    assert pacer.interval == 0.75 and pacer.wait() > 0.5  # not back to every 0.1 s


def test_the_redraw_pacer_plans_for_its_dear_redraws_not_an_average() -> None:
    """A cheap redraw (a repaint) after a dear one (a layout) must not halve the spacing:
    the next redraw may be a dear one again; cheap ones bring it down step by step."""
    from localllm.tui.pacing import RedrawPacer

    pacer = RedrawPacer(budget=0.01, min_interval=0.1, max_interval=10.0)
    pacer.drawn(0.02)
    assert pacer.interval == pytest.approx(2.0)
    pacer.drawn(0.002)
    assert pacer.interval == pytest.approx(0.75 * 2.0 + 0.25 * 0.2)
    pacer.drawn(0.04)  # a dearer one raises it at once
    assert pacer.interval == pytest.approx(4.0)
    for _ in range(20):
        pacer.drawn(0.0005)
    assert pacer.interval == 0.1  # cheap redraws, every 0.1 s
