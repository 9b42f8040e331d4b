"""A stream whose reader stops reading, on the scripted model (no process, no weights):
it is paused out of the batch, and ended after its stall bound whether or not another
request waits, or at once when a priority request needs its sequence (the real-server
test is tests/server/test_slow_clients.py)."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable

import pytest

from localllm.backends.base import Message, SamplingParams
from localllm.backends.fake import FakeBackend, Script, write_fake_model
from localllm.config import Settings
from localllm.engine.engine import Engine
from localllm.engine.request import Request
from localllm.errors import ReaderStalled

# each step takes 2 ms, as a real model's takes some: at zero delay the worker can write
# all of an answer before the event loop has run the wake-up of the reader's first read,
# and a reader whose wake-up is still pending counts as one that keeps up
SCRIPT = Script(reply="abcdefgh" * 100, delay_s=0.002)


def _ask(max_tokens: int) -> Request:
    return Request(SamplingParams(temperature=0.0, max_tokens=max_tokens), model="scripted",
                   messages=[Message("user", "Go on.")])


async def _until(check: Callable[[], object], what: str) -> None:
    for _ in range(2000):
        if check():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"never: {what}")


def test_a_reader_that_stops_is_paused_then_ended_after_its_bound(settings: Settings):
    write_fake_model(settings.models_dir / "scripted.gguf")
    chosen = dataclasses.replace(settings, model="scripted", parallel=1, stall_timeout_s=0.2)
    engine = Engine(chosen, backends=[FakeBackend(SCRIPT)])

    def rows() -> list[dict]:
        return list(engine.status().activity.get("requests", []))

    async def scenario() -> None:
        idle = engine.submit(_ask(600))  # read once, then never again
        await idle.started()
        await _until(lambda: [r["state"] for r in rows()] == ["paused"], "paused")
        held = rows()[0]["generated"]
        assert 64 <= held < 600
        # nobody waits for its sequence, and it is ended all the same once past its bound
        await _until(lambda: not rows(), "ended")
        got = []
        with pytest.raises(ReaderStalled) as err:
            async for chunk in idle:
                got.append(chunk.text)
        assert len(got) == held  # what it had been given, then the error
        assert "stall_timeout_s = 0.2" in err.value.message
        assert "waited" not in err.value.message

        after = await engine.submit(_ask(3)).collect(1.0)
        assert after.final is not None and after.final.finish_reason == "length"

    try:
        asyncio.run(scenario())
    finally:
        engine.close()


def test_a_priority_request_takes_the_sequence_of_a_reader_that_fell_behind(
    settings: Settings,
):
    write_fake_model(settings.models_dir / "scripted.gguf")
    chosen = dataclasses.replace(settings, model="scripted", parallel=1, stall_timeout_s=60)
    engine = Engine(chosen, backends=[FakeBackend(SCRIPT)])

    async def scenario() -> None:
        idle = engine.submit(_ask(600))
        await idle.started()
        await _until(lambda: [r["state"] for r in engine.status().activity["requests"]]
                     == ["paused"], "paused")
        ordinary = engine.submit(_ask(3))  # waits: a paused reader keeps its sequence
        first = engine.submit(dataclasses.replace(_ask(3), priority="high"))
        whole = await first.collect(1.0)
        assert whole.final is not None and whole.final.finish_reason == "length"
        with pytest.raises(ReaderStalled) as err:
            async for _ in idle:
                pass
        assert "a priority request needed its sequence" in err.value.message
        assert (await ordinary.collect(1.0)).final is not None

    try:
        asyncio.run(scenario())
    finally:
        engine.close()


def test_a_paused_reader_that_reads_again_goes_on_to_its_end(settings: Settings):
    write_fake_model(settings.models_dir / "scripted.gguf")
    chosen = dataclasses.replace(settings, model="scripted", parallel=1, stall_timeout_s=5)
    engine = Engine(chosen, backends=[FakeBackend(SCRIPT)])

    async def scenario() -> None:
        slow = engine.submit(_ask(300))
        await slow.started()
        await _until(lambda: [r["state"] for r in engine.status().activity["requests"]]
                     == ["paused"], "paused")
        await asyncio.sleep(0.3)  # paused a while, within its bound
        whole = await slow.collect(1.0)
        assert whole.final is not None and whole.final.finish_reason == "length"
        assert whole.final.stats is not None and whole.final.stats.generated_tokens == 300

    try:
        asyncio.run(scenario())
    finally:
        engine.close()
