"""LoRA adapters in the engine's control flow, on the scripted model (backends/fake.py
records the adapters each step applies): requests that want different adapters never
share a step, each set takes its turn while they run, a KV state is reused only under
the adapters it was computed with, and ids that are not loaded are refused by name.
What adapters do to a real model's output is tested on the starter
(tests/server/test_lora.py)."""

from __future__ import annotations

import dataclasses
import itertools
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from localllm.backends.base import Message, ModelRef, SamplingParams
from localllm.backends.fake import FakeBackend, FakeModel, Gate, Script, write_fake_model
from localllm.config import Settings
from localllm.engine.engine import Engine
from localllm.engine.request import Request
from localllm.errors import InvalidRequest


def ask(text: str, lora: tuple[tuple[int, float], ...] | None = None) -> Request:
    return Request(SamplingParams.asked(), messages=[Message("user", text)], lora=lora)


@pytest.fixture
def adapters(tmp_path: Path) -> tuple[str, str]:
    a, b = tmp_path / "style.gguf", tmp_path / "code.gguf"
    a.write_bytes(b"adapter a")  # the scripted model reads no weights
    b.write_bytes(b"adapter b")
    return f"{a}:0.5", str(b)


def engine_with(
    settings: Settings, ref: ModelRef, loras: tuple[str, ...], script: Script, parallel: int
) -> Engine:
    settings = dataclasses.replace(settings, model=str(ref.path), lora=loras, parallel=parallel)
    engine = Engine(settings, backends=[FakeBackend(script)])
    engine.load(str(ref.path))
    return engine


@pytest.fixture
def gate() -> Iterator[Gate]:
    gate = Gate()
    yield gate
    gate.open()


def test_requests_with_different_adapters_take_turns_never_sharing_a_step(
    settings: Settings, tmp_path: Path, adapters: tuple[str, str], gate: Gate
):
    ref = write_fake_model(tmp_path / "fake.gguf")
    engine = engine_with(settings, ref, adapters, Script(reply="abcdefgh", gate=gate), 4)
    try:
        model = engine.with_model(None, lambda m: m)
        assert isinstance(model, FakeModel)
        assert [(a.path.endswith("style.gguf"), a.scale) for a in model.adapters] == [
            (True, 0.5),
            (False, 1.0),
        ]
        asks = {
            "global": ask("one"),  # no `lora`: the global scales (0 at 0.5, 1 at 1.0)
            "code": ask("two", ((1, 1.0),)),  # adapter 1 only
            "base": ask("three", ((0, 0.0),)),  # every adapter off
            "global again": ask("four", ((1, 1.0), (0, 0.5))),  # the same set as "global"
        }
        out: dict[str, str] = {}

        def run(name: str) -> None:
            out[name] = "".join(c.text for c in engine.generate(asks[name]))

        threads = [threading.Thread(target=run, args=(n,)) for n in asks]
        for t in threads:
            t.start()
        assert gate.held()  # the first request's first step waits: the others queue
        # the worker takes the others in between steps, and their prompts are read on
        # tokenizer threads: a step at a time, each once no prompt is being read, until
        # all four run (else "global" could end before "global again" was read and the
        # two would never meet in a step)
        (res,) = engine.residency.resident.values()
        passed, deadline = 0, time.monotonic() + 60
        while engine.activity()["active"] < len(asks):
            assert time.monotonic() < deadline, engine.activity()
            handed_in = engine.activity()["queued"] - len(res.scheduler.waiting)
            if res.tokenizing and not handed_in:
                time.sleep(0.01)  # a prompt is being read, and the worker has nothing new
                continue
            gate.allow(1)
            passed += 1
            assert gate.held(after=passed)
        assert passed < 8  # "global" has not ended meanwhile
        gate.open()
        for t in threads:
            t.join(60)
        assert out == dict.fromkeys(asks, "abcdefgh")
        owner: dict[int, tuple[tuple[int, float], ...]] = {}
        for scales, seqs in model.steps:
            for seq in seqs:
                assert owner.setdefault(seq, scales) == scales, model.steps
        both = ((0, 0.5), (1, 1.0))
        assert sorted(owner.values()) == sorted([both, both, ((1, 1.0),), ()])
        together = [seqs for scales, seqs in model.steps if scales == both]
        assert max(len(seqs) for seqs in together) == 2  # one set's requests share steps
        order = [scales for scales, _ in model.steps]
        switches = sum(a != b for a, b in itertools.pairwise(order))
        assert switches >= 6  # turns, step by step: not one set's answers after another's
    finally:
        gate.open()
        engine.close()


def test_a_kv_state_is_reused_only_under_its_own_adapters(
    settings: Settings, tmp_path: Path, adapters: tuple[str, str]
):
    ref = write_fake_model(tmp_path / "fake.gguf")
    engine = engine_with(settings, ref, adapters, Script(reply="ok"), 1)
    prompt = "a prompt long enough to be worth keeping " * 4

    def cached(lora: tuple[tuple[int, float], ...] | None) -> int:
        final = list(engine.generate(ask(prompt, lora)))[-1]
        assert final.stats is not None
        return final.stats.cached_tokens

    try:
        assert cached(((1, 1.0),)) == 0  # cold
        assert cached(((0, 0.0),)) == 0  # the same tokens, but read by the base model
        assert cached(((1, 1.0),)) > 0  # its own state, parked when the base one came
        assert cached(((1, 0.5),)) == 0  # another scale is another state
        assert cached(((0, 0.0),)) > 0
    finally:
        engine.close()


def test_adapter_ids_that_are_not_loaded_are_refused_by_name(
    settings: Settings, tmp_path: Path, adapters: tuple[str, str]
):
    ref = write_fake_model(tmp_path / "fake.gguf")
    engine = engine_with(settings, ref, adapters, Script(reply="ok"), 1)
    try:
        with pytest.raises(InvalidRequest, match="id 2 is not loaded: its adapters are ids 0 to 1"):
            list(engine.generate(ask("x", ((2, 1.0),))))
        with pytest.raises(InvalidRequest, match="id 1 is named twice"):
            list(engine.generate(ask("x", ((1, 1.0), (1, 0.5)))))
    finally:
        engine.close()
    plain = engine_with(settings, ref, (), Script(reply="ok"), 1)
    try:
        with pytest.raises(InvalidRequest, match=r"loaded without any \(start it with --lora"):
            list(plain.generate(ask("x", ((0, 1.0),))))
    finally:
        plain.close()
