"""Several models resident: on-demand loads beside the default, keep-alive, limits, fit."""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from localllm.backends.base import Message, ModelRef, SamplingParams
from localllm.config import Settings
from localllm.engine.engine import Engine
from localllm.engine.request import Request
from localllm.errors import ModelTooLarge
from localllm.models.store import ModelStore
from tests.conftest import loads_model
from tests.hubserver import wait_for


@pytest.fixture
@loads_model
def twin_store(store: ModelStore, starter_ref: ModelRef) -> ModelStore:
    """The store with a second model, `twin` (the starter's file under another name)."""
    store.models_dir.mkdir(parents=True, exist_ok=True)
    (store.models_dir / "twin.gguf").symlink_to(starter_ref.path)
    return store


def make(settings: Settings, store: ModelStore, **changes: object) -> Engine:
    return Engine(dataclasses.replace(settings, n_ctx=1024, **changes), store)  # type: ignore[arg-type]


@pytest.fixture
@loads_model
def engine(settings: Settings, twin_store: ModelStore) -> Iterator[Engine]:
    eng = make(settings, twin_store)
    yield eng
    eng.close()


def ask(model: str | None = None, text: str = "Hi", **extra: object) -> Request:
    params = SamplingParams(temperature=0.0, max_tokens=2)
    return Request(params, messages=[Message("user", text)], model=model, **extra)  # type: ignore[arg-type]


def names(engine: Engine) -> list[str]:
    return [row["model"] for row in engine.resident()]


def test_a_named_model_loads_beside_the_default(engine: Engine) -> None:
    engine.load("starter")
    list(engine.generate(ask("twin")))
    assert names(engine) == ["starter", "twin"]  # default first
    rows = {row["model"]: row for row in engine.resident()}
    assert rows["starter"]["default"] and rows["starter"]["expires_in_s"] is None
    assert not rows["twin"]["default"] and 0 < rows["twin"]["expires_in_s"] <= 300
    assert rows["twin"]["memory_bytes"] > rows["twin"]["n_ctx"] * 20_000  # weights + KV
    ref = engine.status().model_ref
    assert ref is not None and ref.name == "starter"
    list(engine.generate(ask()))  # no model named: the default answers, nothing reloads
    list(engine.generate(ask("twin")))
    assert engine.totals["loads"] == 2 and engine.totals["unloads"] == 0


def test_switching_back_keeps_each_models_live_cache(engine: Engine) -> None:
    long = "Tell me about the sea. " * 20
    engine.load("starter")
    list(engine.generate(ask(text=long)))
    list(engine.generate(ask("twin", text="Something else entirely")))
    restored = engine.cache.restored
    *_, final = engine.generate(ask(text=long))
    assert final.stats is not None and final.stats.cached_tokens >= 128
    assert engine.cache.restored == restored  # the starter's own live state, not a restore


def test_idle_on_demand_model_unloads_after_keep_alive(
    settings: Settings, twin_store: ModelStore
) -> None:
    engine = make(settings, twin_store, keep_alive_s=1)
    try:
        engine.load("starter")
        list(engine.generate(ask("twin")))
        assert names(engine) == ["starter", "twin"]
        assert wait_for(lambda: names(engine) == ["starter"], 15), engine.resident()
        assert engine.totals["unloads"] == 1  # the default never expires
    finally:
        engine.close()


def test_keep_alive_per_request(engine: Engine) -> None:
    engine.load("starter")
    list(engine.generate(ask("twin", keep_alive=0.0)))
    assert wait_for(lambda: names(engine) == ["starter"], 10)
    list(engine.generate(ask("twin", keep_alive=-1.0)))  # forever
    row = engine.resident()[1]
    assert row["model"] == "twin" and row["expires_in_s"] is None


def test_max_loaded_models_unloads_the_least_recently_used(
    settings: Settings, twin_store: ModelStore, starter_ref: ModelRef
) -> None:
    (twin_store.models_dir / "third.gguf").symlink_to(starter_ref.path)
    engine = make(settings, twin_store, max_loaded_models=2)
    try:
        engine.load("starter")
        list(engine.generate(ask("twin")))
        list(engine.generate(ask()))  # starter used last: twin is now the oldest
        list(engine.generate(ask("third")))
        assert names(engine) == ["starter", "third"]
        assert engine.totals["loads"] == 3 and engine.totals["unloads"] == 1
    finally:
        engine.close()


def test_memory_budget_makes_room_then_refuses(settings: Settings, twin_store: ModelStore) -> None:
    # one starter load at n_ctx 1024 is estimated at ~185 MiB: two do not fit in 300 MiB
    engine = make(settings, twin_store, memory_budget_mb=300)
    try:
        engine.load("starter")
        list(engine.generate(ask("twin")))
        assert names(engine) == ["twin"]  # the default made room
        list(engine.generate(ask()))  # the default comes back (and twin goes)
        assert names(engine) == ["starter"]
    finally:
        engine.close()
    small = make(settings, twin_store, memory_budget_mb=150)
    try:
        with pytest.raises(ModelTooLarge) as err:
            small.load("starter")
        msg = err.value.message
        assert "150.0 MiB" in msg and "weights 93.8 MiB" in msg and "--force" in msg
        assert small.resident() == []
    finally:
        small.close()
    forced = make(settings, twin_store, memory_budget_mb=150, force_load=True)
    try:
        assert forced.load("starter").id == "starter"
    finally:
        forced.close()


def test_concurrent_first_requests_load_once(engine: Engine) -> None:
    engine.load("starter")
    results: list[int] = []

    def one() -> None:
        results.append(sum(len(c.tokens) for c in engine.generate(ask("twin"))))

    threads = [threading.Thread(target=one) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert results == [2, 2, 2]
    assert engine.totals["loads"] == 2  # starter, then twin once


def test_smaller_context_suggestion(settings: Settings, twin_store: ModelStore) -> None:
    engine = make(settings, twin_store, memory_budget_mb=200)
    try:
        with pytest.raises(ModelTooLarge, match=r"--ctx \d+ needs"):
            engine.load("starter", n_ctx=8192)
    finally:
        engine.close()


def test_shutdown_unloads_everything(
    settings: Settings, twin_store: ModelStore, tmp_path: Path
) -> None:
    engine = make(settings, twin_store)
    engine.load("starter")
    list(engine.generate(ask("twin", text="A question worth keeping " * 10)))
    engine.close()
    assert engine.resident() == [] and engine.totals["unloads"] == 2
    assert list((settings.cache_dir / "kv").rglob("*.kv"))  # live states went to disk


def test_a_configured_draft_model_counts_in_the_fit(
    settings: Settings, twin_store: ModelStore
) -> None:
    """A draft model loads beside its target at the same context, so the estimate holds
    both: the starter alone fits in 340 MiB, with `twin` as its draft it does not, and the
    refusal says so. Loading the draft model itself does not count it twice."""
    engine = make(settings, twin_store, memory_budget_mb=340, draft_model="twin")
    try:
        with pytest.raises(ModelTooLarge) as err:
            engine.load("starter")
        msg = err.value.message
        assert "+ draft twin " in msg and "340.0 MiB" in msg
        # 2 x (weights + buffers) leave 15 MiB: 256 tokens of KV for the two of them
        assert "--ctx 256 " in err.value.hint
        assert engine.load("twin").id == "twin"
    finally:
        engine.close()
    off = make(settings, twin_store, memory_budget_mb=340, draft_model="twin", speculate="off")
    try:
        assert off.load("starter").id == "starter"  # no drafting: no draft model beside it
    finally:
        off.close()
