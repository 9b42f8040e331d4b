"""A stream whose reader stops reading, on the scripted model (no process, no weights):
it is paused out of the batch, then gives its sequence up to a request that waits
(the real-server test is tests/server/test_slow_clients.py)."""

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


def test_a_reader_that_stops_is_paused_then_gives_its_sequence_up(settings: Settings):
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
        await asyncio.sleep(0.3)  # longer than its stall bound, but nobody waits: it stays
        assert [(r["state"], r["generated"]) for r in rows()] == [("paused", held)]

        waiting = engine.submit(_ask(3))  # now one waits for the only sequence
        whole = await waiting.collect(1.0)
        assert whole.final is not None and whole.final.finish_reason == "length"

        got = []
        with pytest.raises(ReaderStalled) as err:
            async for chunk in idle:
                got.append(chunk.text)
        assert len(got) == held  # what it had been given, then the error
        assert "stall_timeout_s = 0.2" in err.value.message
        assert "1 other request(s) waited" in err.value.message

    try:
        asyncio.run(scenario())
    finally:
        engine.close()


def test_a_paused_reader_that_reads_again_goes_on_to_its_end(settings: Settings):
    write_fake_model(settings.models_dir / "scripted.gguf")
    chosen = dataclasses.replace(settings, model="scripted", parallel=1, stall_timeout_s=0.2)
    engine = Engine(chosen, backends=[FakeBackend(SCRIPT)])

    async def scenario() -> None:
        slow = engine.submit(_ask(300))
        await slow.started()
        await _until(lambda: [r["state"] for r in engine.status().activity["requests"]]
                     == ["paused"], "paused")
        await asyncio.sleep(0.3)  # past its bound, with nobody waiting: never cut
        whole = await slow.collect(1.0)
        assert whole.final is not None and whole.final.finish_reason == "length"
        assert whole.final.stats is not None and whole.final.stats.generated_tokens == 300

    try:
        asyncio.run(scenario())
    finally:
        engine.close()
