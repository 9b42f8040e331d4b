"""The engine worker on the real starter model (plus one scripted fake for a mid-stream crash)."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from localllm.backends.base import Message, ModelRef, SamplingParams
from localllm.config import Settings
from localllm.engine import residency as residency_mod
from localllm.engine.engine import Engine
from localllm.engine.request import Request
from localllm.errors import ContextOverflow, LocalLLMError, ModelNotFound, ServerBusy
from localllm.models.store import ModelStore
from tests.conftest import loads_model


@pytest.fixture
@loads_model
def engine(settings: Settings, store: ModelStore) -> Iterator[Engine]:
    eng = Engine(settings, store)
    yield eng
    eng.close()


def ask(text: str, **params: object) -> Request:
    return Request(SamplingParams(temperature=0.0, **params), messages=[Message("user", text)])  # type: ignore[arg-type]


def test_generate_streams_and_counts(engine: Engine):
    chunks = list(engine.generate(ask("Hi", max_tokens=5)))
    assert chunks[-1].finish_reason == "length"
    assert sum(len(c.tokens) for c in chunks) == 5
    assert engine.totals["generated_tokens"] == 5 and engine.totals["requests"] == 1
    ref = engine.status().model_ref
    assert ref is not None and ref.name == "starter"


async def test_submit_async_started_then_chunks(engine: Engine):
    stream = engine.submit(ask("Hi", max_tokens=4))
    started = await stream.started()
    assert started.model == "starter" and started.prompt_tokens > 5
    chunks = [c async for c in stream]
    assert [c.finish_reason for c in chunks].count("length") == 1
    assert sum(len(c.tokens) for c in chunks) == 4


async def test_closing_a_stream_cancels_generation(engine: Engine):
    stream = engine.submit(ask("Write a very long essay about the history of ships.",
                               max_tokens=500))
    got = 0
    async for c in stream:
        got += len(c.tokens)
        if got >= 3:
            break
    await stream.aclose()
    for _ in range(200):
        if engine.status().queued == 0:
            break
        await asyncio.sleep(0.05)
    assert engine.status().queued == 0
    assert engine.totals["cancelled"] == 1
    # it ended before its limit (how soon is not a token count: see test_engine_fake.py)
    assert engine.totals["generated_tokens"] < 500


def test_queue_bound_gives_server_busy(tmp_path: Path, store: ModelStore):
    eng = Engine(Settings(n_threads=2, max_queue=1, data_dir=tmp_path), store)
    try:
        running = eng.generate(ask("Write a long poem.", max_tokens=300))
        next(running)  # the worker is now busy with it
        with pytest.raises(ServerBusy) as err:
            next(eng.generate(ask("Hi", max_tokens=2)))
        assert err.value.limit == 1 and "limit 1" in err.value.message
        running.close()  # cancels
    finally:
        eng.close()


def test_errors_reach_the_caller_typed(engine: Engine):
    with pytest.raises(ModelNotFound, match="Local models: starter"):
        next(engine.generate(Request(SamplingParams(), prompt="x", model="no-such-model")))
    long = "word " * 9000  # longer than the starter's trained context of 8192
    with pytest.raises(ContextOverflow) as err:
        next(engine.generate(ask(long)))
    assert err.value.n_ctx == 8192 and err.value.prompt_tokens > 8192


class _Crashy:
    """The real model, but its third batched step fails in the native code (after the prompt,
    read in one step, and one decode step: two tokens out): the case a real model can't
    stage."""

    def __init__(self, real: Any) -> None:
        self._real = real
        self.info = real.info
        self.steps = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)

    def exact_batches(self) -> bool:
        return False  # a scripted model verifies no drafts

    def step(self, work: Any) -> None:
        self.steps += 1
        if self.steps == 3:
            raise RuntimeError("native failure")
        self._real.step(work)

    def close(self) -> None:
        self._real.close()


def wrap_loaded_models(monkeypatch: pytest.MonkeyPatch, wrapper: Callable[[Any], Any]) -> None:
    """Every model the engine loads from now on is handed out as `wrapper(real model)`."""
    real_prepare = residency_mod.prepare

    class Wrap:
        def __init__(self, real: Any) -> None:
            self.real = real

        def load(self, ref: ModelRef, options: object) -> Any:
            return wrapper(self.real.load(ref, options))

    def prepare(*args: Any, **kwargs: Any) -> tuple[Wrap, ModelRef]:
        backend, ref = real_prepare(*args, **kwargs)
        return Wrap(backend), ref

    monkeypatch.setattr(residency_mod, "prepare", prepare)


def test_error_mid_stream_is_typed_and_worker_survives(engine: Engine,
                                                       monkeypatch: pytest.MonkeyPatch):
    wrap_loaded_models(monkeypatch, _Crashy)
    got = []
    with pytest.raises(LocalLLMError, match="internal error: native failure"):
        for c in engine.generate(ask("Count to ten.", max_tokens=5)):
            got.append(c.tokens)
    assert len(got) == 2 and all(len(t) == 1 for t in got)
    assert engine.status().queued == 0
    chunks = list(engine.generate(ask("Hi", max_tokens=1)))  # the worker is alive and answers
    assert chunks[-1].finish_reason is not None and chunks[-1].stats is not None


def test_no_cycle_collection_while_the_model_decodes(engine: Engine,
                                                     monkeypatch: pytest.MonkeyPatch):
    """A collection holds the GIL for as long as it walks the heap, stopping the decode
    in between tokens: the worker pauses automatic collection for a request and resumes
    it after, also when the stream fails."""
    import gc

    enabled: list[bool] = []
    fail = [False]

    class Watched:
        def __init__(self, real: Any) -> None:
            self.real = real
            self.info = real.info

        def __getattr__(self, name: str) -> Any:
            return getattr(self.real, name)

        def step(self, work: Any) -> None:
            enabled.append(gc.isenabled())  # on the worker thread, each batched step
            if fail[0] and len(enabled) > 2:
                raise RuntimeError("native failure")
            self.real.step(work)

    wrap_loaded_models(monkeypatch, Watched)
    assert gc.isenabled()
    chunks = list(engine.generate(ask("Count to ten.", max_tokens=12)))
    assert chunks[-1].finish_reason is not None
    assert len(enabled) >= len(chunks) - 1 and not any(enabled)
    assert gc.isenabled()  # collected again once the answer is done

    fail[0] = True
    with pytest.raises(LocalLLMError, match="native failure"):
        list(engine.generate(ask("Hi", max_tokens=5)))
    assert gc.isenabled()


class _Crash(BaseException):
    """What no handler in the worker catches (a stand-in for a bug that escapes it)."""


async def test_a_dead_worker_never_looks_healthy(settings, store, monkeypatch):
    """If the worker thread ever dies, /health says so (503), the request in hand and the
    next ones get an error at once instead of hanging."""
    import httpx

    from localllm.engine.accounting import Accounting
    from localllm.server.app import create_app

    engine = Engine(settings, store)
    accounting = Accounting.for_settings(settings)
    try:
        engine.load("starter")
        app = create_app(settings, engine, accounting)
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as client:
            assert (await client.get("/health")).json()["status"] == "ok"

            def crash(job):
                raise _Crash("injected")

            monkeypatch.setattr(engine.worker, "_accept", crash)
            body = {"prompt": "Hi", "max_tokens": 2}
            r = await client.post("/v1/completions", json=body)
            assert r.status_code == 500 and "the engine stopped" in r.json()["error"]["message"]
            engine.worker.thread.join(10)
            health = await client.get("/health")
            assert health.status_code == 503 and health.json()["status"] == "error"
            assert "injected" in health.json()["error"]
            r = await client.post("/v1/completions", json=body)
            assert r.status_code == 500 and "the engine stopped" in r.json()["error"]["message"]
    finally:
        engine.close()
        accounting.close()


def test_prompts_are_rendered_and_tokenized_off_the_worker(engine: Engine, monkeypatch):
    """A long or hostile prompt costs a tokenizer thread, not the thread that decodes."""
    import threading

    engine.load("starter")
    model = engine.residency.default.model  # type: ignore[union-attr]
    seen: list[str] = []
    real_render, real_tokenize = model.render_chat, model.tokenize

    def render_chat(messages: Any, variables: Any = None) -> Any:
        seen.append(threading.current_thread().name)
        return real_render(messages, variables)

    def tokenize(text: str, **kw: Any) -> Any:
        seen.append(threading.current_thread().name)
        return real_tokenize(text, **kw)

    monkeypatch.setattr(model, "render_chat", render_chat)
    monkeypatch.setattr(model, "tokenize", tokenize)
    chunks = list(engine.generate(ask("Hi", max_tokens=2)))
    chunks += list(engine.generate(Request(SamplingParams(temperature=0.0, max_tokens=2),
                                           prompt="Once upon a time")))
    assert chunks[-1].finish_reason is not None
    assert seen and all(name.startswith("localllm-tokenize") for name in seen), seen


def test_the_chat_template_is_compiled_at_load_not_by_the_first_request(engine: Engine):
    from localllm.backends import chat_template

    chat_template._compile.cache_clear()
    engine.load("starter")
    assert chat_template._compile.cache_info().misses == 1  # the load's trial render
    chunks = list(engine.generate(ask("Hi", max_tokens=2)))
    assert chunks[-1].finish_reason == "length"
    info = chat_template._compile.cache_info()
    assert info.misses == 1 and info.hits >= 1  # the request found it compiled


SYSTEM_FIRST = (
    "{% if messages[0].role != 'system' %}"
    "{{ raise_exception('the first message must be a system message') }}{% endif %}"
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


@pytest.mark.parametrize("template, warned", [
    (SYSTEM_FIRST, False),
    ("{{ raise_exception('this template renders nothing') }}", True),
], ids=["system-first", "always-fails"])
def test_a_template_that_wants_a_system_message_first_loads_without_a_warning(
    starter_ref: ModelRef, tmp_path: Path, caplog: pytest.LogCaptureFixture,
    template: str, warned: bool,
):
    """The load's trial render gives a template that insists on a system message one; a
    template that fails either way is logged once (and left for the first request)."""
    from localllm.backends.base import LoadOptions
    from localllm.backends.llamacpp import LlamaCppBackend
    from localllm.engine import prompt
    from tests.gguf_fixtures import copy_with_metadata

    path = copy_with_metadata(starter_ref.path, tmp_path / "strict.gguf",
                              {"tokenizer.chat_template": template})
    ref = dataclasses.replace(starter_ref, path=path)
    model = LlamaCppBackend().load(ref, LoadOptions(n_threads=2, n_ctx=256))
    try:
        with caplog.at_level("WARNING", logger="localllm.engine.prompt"):
            prompt.warm(model)
        failed = [r for r in caplog.records if "failed a trial render" in r.getMessage()]
        assert len(failed) == (1 if warned else 0)
    finally:
        model.close()


def test_the_context_grows_for_a_longer_prompt_or_num_ctx(engine: Engine):
    """Loaded with less than its trained context, an idle model is reloaded with a context
    that holds a longer prompt (a power of two), or what a request asks for (min_ctx)."""
    engine.load("starter", n_ctx=1024)
    assert engine.resident()[0]["n_ctx"] == 1024
    prompt = "word " * 1500
    chunks = list(engine.generate(Request(SamplingParams(temperature=0.0, max_tokens=2),
                                          prompt=prompt)))
    assert chunks[-1].finish_reason is not None and chunks[-1].stats is not None
    assert chunks[-1].stats.prompt_tokens > 1024
    assert engine.resident()[0]["n_ctx"] == 2048
    list(engine.generate(Request(SamplingParams(temperature=0.0, max_tokens=1), prompt="Hi",
                                 min_ctx=4096)))
    assert engine.resident()[0]["n_ctx"] == 4096
    list(engine.generate(Request(SamplingParams(temperature=0.0, max_tokens=1), prompt="Hi",
                                 min_ctx=1 << 20)))  # capped at the trained context
    assert engine.resident()[0]["n_ctx"] == 8192


def test_a_context_the_user_set_is_kept(settings: Settings, store: ModelStore):
    eng = Engine(dataclasses.replace(settings, n_ctx=1024), store)
    try:
        with pytest.raises(ContextOverflow) as err:
            next(eng.generate(ask("word " * 1500)))
        assert err.value.n_ctx == 1024
    finally:
        eng.close()


def test_a_failed_reload_keeps_the_old_context(engine: Engine, monkeypatch: pytest.MonkeyPatch):
    """When the larger context cannot be loaded after all, the model comes back at the size
    it had: a longer prompt gets a 400 saying so, a num_ctx request is served as it is."""
    from localllm.errors import ModelLoadError

    engine.load("starter", n_ctx=1024)
    real = engine.residency._load_with_backend

    def refuse_big(ref: Any, options: Any) -> Any:
        if options.n_ctx and options.n_ctx > 1024:
            raise ModelLoadError(str(ref.path), "not enough memory after all")
        return real(ref, options)

    monkeypatch.setattr(engine.residency, "_load_with_backend", refuse_big)
    with pytest.raises(LocalLLMError, match="could not be reloaded with a 2048-token context"):
        next(engine.generate(Request(SamplingParams(max_tokens=2), prompt="word " * 1500)))
    assert engine.resident()[0]["n_ctx"] == 1024
    chunks = list(engine.generate(Request(SamplingParams(temperature=0.0, max_tokens=1),
                                          prompt="Hi", min_ctx=4096)))
    assert chunks[-1].finish_reason is not None
    assert engine.resident()[0]["n_ctx"] == 1024
