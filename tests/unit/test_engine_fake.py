"""The engine's control flow on the scripted model (backends/fake.py): name resolution on
the worker, the status snapshot, failures at a given token, cancellation, the queue bound,
the backends an engine is given and their memory profiles. No model, no process: these
run in `make test-fast`. What tokens and text a model gives is tested on the starter."""

from __future__ import annotations

import asyncio
import dataclasses
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from localllm.backends.base import MemoryProfile, Message, ModelRef, SamplingParams
from localllm.backends.fake import FakeBackend, FakeModel, Gate, Script, write_fake_model
from localllm.backends.llamacpp import LlamaCppBackend
from localllm.backends.mlx import MlxBackend
from localllm.config import Settings
from localllm.engine.client import EngineClient
from localllm.engine.engine import Engine
from localllm.engine.request import Request
from localllm.errors import BackendUnavailable, LocalLLMError, ModelNotFound, ServerBusy


def ask(text: str = "hello", **params: object) -> Request:
    return Request(SamplingParams.asked(**params), messages=[Message("user", text)])


@pytest.fixture
def fake_ref(tmp_path: Path) -> ModelRef:
    return write_fake_model(tmp_path / "fake.gguf")


def scripted(settings: Settings, ref: ModelRef, script: Script) -> Engine:
    engine = Engine(settings, backends=[FakeBackend(script)])
    engine.load(ref)
    return engine


@pytest.fixture
def gate() -> Iterator[Gate]:
    gate = Gate()
    yield gate
    gate.open()  # before the engine closes: its worker may wait at it


@pytest.fixture
def held(settings: Settings, fake_ref: ModelRef, gate: Gate) -> Iterator[Engine]:
    """An engine whose model waits at `gate` before every step."""
    engine = scripted(settings, fake_ref, Script(reply="abcdef", gate=gate))
    yield engine
    gate.open()
    engine.close()


def text_of(engine: EngineClient, request: Request) -> tuple[str, str | None]:
    chunks = list(engine.generate(request))
    return "".join(c.text for c in chunks), chunks[-1].finish_reason


def test_the_scripted_model_answers_through_the_scheduler(settings: Settings, fake_ref: ModelRef):
    engine = scripted(settings, fake_ref, Script(reply=lambda prompt: prompt.upper()[:9]))
    try:
        assert text_of(engine, ask("quiet")) == ("<USER>QUI", "stop")
        assert text_of(engine, ask("quiet", max_tokens=4)) == ("<USE", "length")
        model = engine.status().loaded[0]
        assert (model.backend, model.requests) == ("fake", 2)
    finally:
        engine.close()


async def test_a_bad_name_is_the_streams_first_error(settings: Settings, fake_ref: ModelRef):
    """Names are resolved on the worker: submit() returns at once, and the stream's
    first item is the error that names the models there are."""
    engine = scripted(settings, fake_ref, Script())
    try:
        stream = engine.submit(dataclasses.replace(ask(), model="no-such-model"))
        with pytest.raises(ModelNotFound) as err:
            await stream.started()
        assert "no-such-model" in err.value.message
        with pytest.raises(ModelNotFound):
            next(iter(engine.generate(dataclasses.replace(ask(), model="no-such-model"))))
        assert text_of(engine, ask())[1] == "stop"  # the worker goes on
    finally:
        engine.close()


def test_status_is_a_frozen_snapshot_published_by_the_worker(held: Engine, gate: Gate):
    before = held.status()
    assert before.state == "ready" and before.model_ref is not None
    assert before.model_ref.name == "fake" and before.loaded[0].active == 0
    with pytest.raises(dataclasses.FrozenInstanceError):
        before.state = "idle"  # type: ignore[misc]
    with pytest.raises(TypeError):
        before.totals["requests"] = 5  # type: ignore[index]

    out: list[str] = []
    reader = threading.Thread(target=lambda: out.append(text_of(held, ask())[0]))
    reader.start()
    assert gate.held(after=0)  # the first step is inside the model: not published yet
    waiting = held.status()
    assert (waiting.loaded[0].waiting, waiting.loaded[0].active, waiting.queued) == (1, 0, 1)
    gate.allow(1)
    assert gate.held(after=1)  # that step is done and published; the next one waits
    during = held.status()
    assert (during.loaded[0].waiting, during.loaded[0].active, during.queued) == (0, 1, 1)
    assert waiting.loaded[0].active == 0  # an earlier snapshot never changes
    gate.open()
    reader.join()
    after = held.status()
    assert out == ["abcdef"]
    assert after.totals["requests"] == 1 and after.totals["generated_tokens"] == 6
    assert after.queued == 0 and after.loaded[0].active == 0


def test_a_failure_at_token_n_ends_that_request_and_the_worker_serves_on(
    settings: Settings, fake_ref: ModelRef
):
    engine = scripted(settings, fake_ref, Script(reply="abcdef", fail_at=4))
    got: list[str] = []
    try:
        with pytest.raises(LocalLLMError) as err:
            for chunk in engine.generate(ask()):
                got.append(chunk.text)
        assert got == ["a", "b", "c"]
        assert "scripted failure at token 4" in err.value.message
        assert engine.status().state == "ready"
        assert text_of(engine, ask(max_tokens=2)) == ("ab", "length")
    finally:
        engine.close()


async def test_cancelling_a_held_request_ends_it_cancelled(held: Engine, gate: Gate):
    stream = held.submit(ask())
    gate.allow(2)
    assert await asyncio.to_thread(gate.held, 2)  # its prompt read, two tokens sent
    stream.cancel()  # while the model waits to take its next step
    gate.open()
    chunks = [c async for c in stream]
    assert chunks[-1].finish_reason == "cancelled"
    assert held.status().totals["cancelled"] == 1


def test_the_queue_bound_refuses_with_both_numbers(
    settings: Settings, fake_ref: ModelRef, gate: Gate
):
    bounded = dataclasses.replace(settings, max_queue=2, parallel=1)
    engine = scripted(bounded, fake_ref, Script(gate=gate))
    try:
        first, second = iter(engine.generate(ask())), iter(engine.generate(ask()))
        threads = [threading.Thread(target=list, args=(g,)) for g in (first, second)]
        for t in threads:
            t.start()
        assert gate.held(after=0)  # the first runs (its first step waits); the second queues
        with pytest.raises(ServerBusy) as err:
            next(iter(engine.generate(ask())))
        assert "2 requests are queued (limit 2)" in err.value.message
        gate.open()
        for t in threads:
            t.join()
        assert engine.status().totals["requests"] == 2
    finally:
        gate.open()
        engine.close()


def test_an_engine_loads_only_with_the_backends_it_is_given(settings: Settings, tmp_path: Path):
    engine = Engine(settings, backends=[FakeBackend()])
    folder = tmp_path / "mlx-model"
    folder.mkdir()
    try:
        with pytest.raises(BackendUnavailable) as err:
            engine.load(ModelRef("an-mlx-model", folder, "mlx", "path"))
        assert "none of this engine's backends (fake) loads an-mlx-model" in err.value.message
        assert engine.status().state == "error"
    finally:
        engine.close()


def test_the_memory_profile_sizes_the_kv_cache(settings: Settings, fake_ref: ModelRef):
    """The engine sizes a load's KV by its backend's profile: f32 KV is twice f16's."""

    class F32(FakeBackend):
        def memory_profile(self, ref: ModelRef, n_ctx: int | None) -> MemoryProfile:
            return MemoryProfile("f32", gpu_offload=False)

    rows = []
    for backend in (FakeBackend(), F32()):
        engine = Engine(dataclasses.replace(settings, n_ctx=1024), backends=[backend])
        try:
            engine.load(fake_ref)
            rows.append(engine.status().loaded[0])
            assert isinstance(backend.loaded[0], FakeModel)
        finally:
            engine.close()
    assert rows[0].kv_bytes > 0 and rows[1].kv_bytes == 2 * rows[0].kv_bytes


def test_each_backend_says_how_it_holds_a_model(fake_ref: ModelRef):
    """llama.cpp keeps f16 KV; MLX on a CPU computes in f32 (on Apple Silicon, f16)."""
    assert LlamaCppBackend().memory_profile(fake_ref, None).kv_dtype == "f16"
    mlx = MlxBackend().memory_profile(fake_ref, None)
    assert mlx.kv_dtype == ("f16" if mlx_on_apple() else "f32") and not mlx.gpu_offload


def mlx_on_apple() -> bool:
    from localllm.backends import apple_silicon

    return apple_silicon()


def test_observers_hear_each_request_until_they_stop(settings: Settings, fake_ref: ModelRef):
    engine = scripted(settings, fake_ref, Script(reply="xy"))
    heard: list[tuple[str, int]] = []
    try:
        stop = engine.observe(
            lambda req, model, final, s: heard.append((model, final.stats.generated_tokens))  # type: ignore[union-attr]
        )
        text_of(engine, ask())
        stop()
        text_of(engine, ask())
        assert heard == [("fake", 2)]
    finally:
        engine.close()
