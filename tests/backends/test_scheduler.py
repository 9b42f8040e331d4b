"""Many requests at once on the real starter model (llama.cpp): continuous batching,
priority, cancellation, chunked prefill, shared prefixes, answers kept in the cache,
and the KV memory of N sequences against the fit estimate."""

from __future__ import annotations

import itertools
import logging
import re
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from localllm.backends.base import Chunk, LoadOptions, Message, ModelRef, SamplingParams, SeqWork
from localllm.backends.llamacpp import LlamaCppBackend
from localllm.config import Settings
from localllm.engine.engine import Engine
from localllm.engine.request import Request
from localllm.errors import InvalidRequest, ModelTooLarge
from localllm.models import fit
from tests.conftest import THREADS, loads_model

GREEDY = SamplingParams(temperature=0.0)
TOPICS = ("the sea", "a mountain village", "an old clockmaker", "a journey by train")


def story(topic: str) -> list[Message]:
    return [Message("user", f"Write a long story about {topic}.")]


def make(tmp_path: Path, **kw: object) -> Engine:
    values: dict = {"n_threads": THREADS, "n_ctx": 2048, "data_dir": tmp_path / "data",
                    "cache_dir": tmp_path / "cache", "prompt_cache_disk_mb": 0}
    values.update(kw)
    engine = Engine(Settings(**values))
    engine.load("starter")
    return engine


@pytest.fixture(scope="module")
@loads_model
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Engine]:
    eng = make(tmp_path_factory.mktemp("sched"))
    yield eng
    eng.close()


class Events:
    """Every chunk of several streams, numbered in the order they arrived."""

    def __init__(self) -> None:
        self.order = itertools.count()
        self.lock = threading.Lock()
        self.log: list[tuple[int, str, Chunk]] = []

    def run(self, engine: Engine, name: str, request: Request, **kw: object) -> None:
        for chunk in engine.generate(request, **kw):  # type: ignore[arg-type]
            with self.lock:
                self.log.append((next(self.order), name, chunk))

    def of(self, name: str) -> list[Chunk]:
        return [c for _, n, c in self.log if n == name]

    def first(self, name: str) -> int:
        return min(i for i, n, _ in self.log if n == name)

    def last(self, name: str) -> int:
        return max(i for i, n, _ in self.log if n == name)


def start(target: object, *args: object, **kw: object) -> threading.Thread:
    t = threading.Thread(target=target, args=args, kwargs=kw)  # type: ignore[arg-type]
    t.start()
    return t


def test_four_concurrent_requests_decode_together(engine: Engine):
    events = Events()
    params = SamplingParams(temperature=0.0, max_tokens=40)
    threads = [
        start(events.run, engine, t, Request(params, messages=story(t))) for t in TOPICS
    ]
    for t in threads:
        t.join()
    for topic in TOPICS:
        chunks = events.of(topic)
        final = chunks[-1]
        assert final.finish_reason == "length" and final.stats is not None
        assert final.stats.generated_tokens == 40 == sum(len(c.tokens) for c in chunks)
        text = "".join(c.text for c in chunks)
        assert len(text.split()) >= 15  # words, not an empty or single-token answer
    # they ran together: every stream had its first token before any of them ended
    assert max(events.first(t) for t in TOPICS) < min(events.last(t) for t in TOPICS)


def test_a_short_completion_overtakes_a_long_stream(engine: Engine):
    events = Events()
    long = Request(SamplingParams(temperature=0.0, max_tokens=160), messages=story(TOPICS[0]))
    chat = start(events.run, engine, "chat", long)
    while not events.of("chat"):
        time.sleep(0.005)
    quick = Request(SamplingParams(temperature=0.0, max_tokens=8), prompt="def add(a, b):")
    events.run(engine, "completion", quick)
    chat.join()
    assert events.last("completion") < events.last("chat")
    done = events.of("completion")[-1]
    assert done.stats is not None and done.stats.generated_tokens == 8
    final = events.of("chat")[-1]  # the long stream was slowed, not starved
    assert final.finish_reason == "length" and final.stats is not None
    assert final.stats.generated_tokens == 160


def test_cancelling_one_of_four_leaves_the_others_intact(engine: Engine):
    events = Events()
    cancel = threading.Event()
    params = SamplingParams(temperature=0.0, max_tokens=60)
    threads = []
    for topic in TOPICS:
        kw = {"cancel": cancel} if topic == TOPICS[0] else {}
        request = Request(params, messages=story(topic))
        threads.append(start(events.run, engine, topic, request, **kw))
    while len(events.of(TOPICS[0])) < 5:
        time.sleep(0.005)
    cancel.set()
    seen_three = False
    while any(t.is_alive() for t in threads[1:]):
        seen_three |= engine.activity()["active"] == 3
        time.sleep(0.005)
    for t in threads:
        t.join()
    assert events.of(TOPICS[0])[-1].finish_reason == "cancelled"
    assert seen_three  # its sequence was freed while the others still ran
    for topic in TOPICS[1:]:
        final = events.of(topic)[-1]
        assert final.finish_reason == "length" and final.stats is not None
        assert final.stats.generated_tokens == 60
    assert engine.activity()["active"] == 0


def test_a_long_prompt_is_read_in_chunks_while_a_stream_flows(engine: Engine):
    events = Events()
    chat = start(
        events.run,
        engine,
        "chat",
        Request(SamplingParams(temperature=0.0, max_tokens=120), messages=story(TOPICS[1])),
    )
    while not events.of("chat"):
        time.sleep(0.005)
    numbers = " ".join(f"item{i} weighs {i * 7 % 13} kg" for i in range(180))
    long = Request(SamplingParams(temperature=0.0, max_tokens=2), prompt=f"{numbers}. The heaviest")
    progress: list[tuple[int, int]] = []

    def watch() -> None:
        while not events.of("long"):
            for row in engine.activity()["requests"]:
                if row["state"] == "prefill" and row["prompt_tokens"] > 1000:
                    progress.append((row["prefilled"], row["prompt_tokens"]))
            time.sleep(0.002)

    watcher = start(watch)
    mark = len(events.log)
    events.run(engine, "long", long)
    watcher.join()
    chat.join()
    during = [n for i, n, _ in events.log[mark:] if n == "chat" and i < events.first("long")]
    assert len(during) >= 6  # the stream went on while the prompt was read
    assert any(0 < done < total for done, total in progress)  # visible, part-way


@pytest.mark.model
def test_shared_system_prompt_and_answers_come_from_the_cache(tmp_path: Path):
    engine = make(tmp_path)
    try:
        sys_prompt = "You are a careful assistant who answers in plain English. " * 12
        base = [Message("system", sys_prompt)]
        params = SamplingParams(temperature=0.0, max_tokens=48)
        first = list(engine.generate(Request(params, messages=[*base, Message("user", "Hi")])))
        other = list(
            engine.generate(Request(params, messages=[*base, Message("user", "What is rain?")]))
        )
        n_system = len(engine.residency.default.model.render_chat(base))  # type: ignore[union-attr]
        assert other[-1].stats is not None and other[-1].stats.cached_tokens >= n_system - 8
        # a follow-up reuses the previous answer too: almost all of its prompt is cached
        answer = "".join(c.text for c in first)
        turn = [*base, Message("user", "Hi"), Message("assistant", answer),
                Message("user", "And then?")]
        follow = list(engine.generate(Request(params, messages=turn)))
        stats = follow[-1].stats
        assert stats is not None and stats.cached_tokens >= 0.9 * stats.prompt_tokens
    finally:
        engine.close()


@pytest.mark.model
def test_a_running_prefix_is_copied_to_a_new_sequence(tmp_path: Path):
    engine = make(tmp_path)
    try:
        sys_prompt = "You answer questions about the weather in short sentences. " * 12
        base = [Message("system", sys_prompt)]
        events = Events()
        params = SamplingParams(temperature=0.0, max_tokens=80)
        rain = Request(params, messages=[*base, Message("user", "Rain?")])
        t = start(events.run, engine, "a", rain)
        while not events.of("a"):
            time.sleep(0.005)
        events.run(engine, "b", Request(params, messages=[*base, Message("user", "Snow?")]))
        t.join()
        assert events.last("b") < events.last("a")  # b ran while a was still decoding
        stats = events.of("b")[-1].stats
        assert stats is not None and stats.cached_tokens > 100
        assert engine.cache.stats()["shared"] >= 1
    finally:
        engine.close()


@pytest.mark.model
def test_kv_memory_of_n_sequences_stays_within_the_estimate(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
):
    caplog.set_level(logging.INFO, logger="localllm.llama_cpp")
    engine = make(tmp_path, parallel=3, n_ctx=1024)
    try:
        rows = engine.resident()
        assert rows[0]["parallel"] == 3
        sizes = [
            float(m.group(1))
            for m in re.finditer(r"llama_kv_cache: size =\s+([\d.]+) MiB", caplog.text)
        ]
        assert sizes, "llama.cpp did not report its KV cache"
        allocated = sizes[-1] * 1024 * 1024
        ref = engine.status().model_ref
        assert ref is not None
        estimate = fit.estimate(ref, 1024).with_seq(3)
        assert estimate.kv == rows[0]["kv_bytes"]
        assert 0.95 * estimate.kv <= allocated <= estimate.kv
    finally:
        engine.close()


def test_parallel_that_does_not_fit_is_refused_naming_what_fits(
    tmp_path: Path, starter_ref: ModelRef
):
    ref_est = fit.estimate(starter_ref, 4096)
    budget_mb = (ref_est.with_seq(2).total + ref_est.kv // 2) // (1024 * 1024)
    with pytest.raises(ModelTooLarge) as err:
        make(tmp_path, parallel=4, n_ctx=4096, memory_budget_mb=budget_mb)
    assert "--parallel 2" in err.value.message
    engine = make(tmp_path, n_ctx=4096, memory_budget_mb=budget_mb)  # unset: fewer
    try:
        assert engine.resident()[0]["parallel"] == 2
    finally:
        engine.close()


def test_deterministic_request_waits_and_runs_alone(engine: Engine):
    events = Events()
    params = SamplingParams(temperature=0.0, max_tokens=40)
    a = start(events.run, engine, "a", Request(params, messages=story(TOPICS[2])))
    while not events.of("a"):
        time.sleep(0.005)
    exact = Request(params, messages=story(TOPICS[3]), deterministic=True)
    b = start(events.run, engine, "b", exact)
    while engine.status().queued < 2:  # b is in the engine's queue before c is sent
        time.sleep(0.005)
    c = start(events.run, engine, "c", Request(params, messages=story(TOPICS[0])))
    for t in (a, b, c):
        t.join()
    # b started after a ended, and c (behind b) after b ended: b ran alone
    assert events.last("a") < events.first("b")
    assert events.last("b") < events.first("c")


def test_mlx_runs_two_requests_together(tmp_path: Path, starter_mlx_ref: ModelRef):
    engine = Engine(Settings(n_threads=THREADS, backend="mlx", n_ctx=256, parallel=2,
                             data_dir=tmp_path / "data", prompt_cache_disk_mb=0))
    try:
        engine.load(str(starter_mlx_ref.path))
        assert engine.resident()[0]["parallel"] == 2
        events = Events()
        params = SamplingParams(temperature=0.0, max_tokens=8)
        threads = [
            start(events.run, engine, t, Request(params, messages=story(t))) for t in TOPICS[:2]
        ]
        for t in threads:
            t.join()
        for topic in TOPICS[:2]:
            final = events.of(topic)[-1]
            assert final.stats is not None and final.stats.generated_tokens == 8
        assert max(events.first(t) for t in TOPICS[:2]) < min(events.last(t) for t in TOPICS[:2])
    finally:
        engine.close()


@pytest.mark.model
def test_the_deterministic_setting_runs_requests_one_at_a_time(tmp_path: Path):
    engine = make(tmp_path, deterministic=True)
    try:
        events = Events()
        params = SamplingParams(temperature=0.0, max_tokens=24)
        threads = [
            start(events.run, engine, t, Request(params, messages=story(t))) for t in TOPICS[:2]
        ]
        for t in threads:
            t.join()
        first, second = sorted(TOPICS[:2], key=events.first)
        assert events.last(first) < events.first(second)
        assert all(events.of(t)[-1].stats.generated_tokens == 24 for t in TOPICS[:2])  # type: ignore[union-attr]
    finally:
        engine.close()


def test_an_empty_prompt_is_refused_before_it_takes_a_sequence(engine: Engine):
    with pytest.raises(InvalidRequest, match=r"empty \(0 tokens\)"):
        list(engine.generate(Request(SamplingParams(max_tokens=4), prompt_tokens=[])))
    assert engine.activity()["active"] == 0
    chunks = list(engine.generate(Request(SamplingParams(max_tokens=3), prompt="Hi")))
    assert chunks[-1].stats is not None and chunks[-1].stats.generated_tokens == 3


@pytest.mark.model
def test_a_copied_prefix_reads_as_the_sequence_s_own(starter_ref: ModelRef):
    """seq_copy on llama.cpp (state calls, only the cells the source holds): the copy has
    the source's tokens, and the next tokens read on both give the same logits."""
    model = LlamaCppBackend().load(starter_ref, LoadOptions(n_threads=THREADS, n_ctx=512, n_seq=3))
    try:
        prompt = model.render_chat([Message("user", "Name three rivers of Europe.")])
        model.step([SeqWork(0, prompt, 1)])
        n = len(prompt) - 5
        assert model.seq_copy(0, 2, n) and model.seq_tokens(2) == prompt[:n]
        assert model.seq_tokens(0) == prompt  # the source keeps all of its state
        model.seq_keep(0, n)
        model.step([SeqWork(0, prompt[n:], 1), SeqWork(2, prompt[n:], 1)])
        assert (model.logits(0, 0) == model.logits(2, 0)).all()
        assert model.seq_copy(0, 1, 0) and model.seq_tokens(1) == []
    finally:
        model.close()


@pytest.mark.model
def test_kept_logits_draw_what_the_context_s_row_draws(starter_ref: ModelRef):
    """A rerun draws its first token from the logits kept with the KV (sample_row), not
    from the context's row: each sampler chain (greedy; seeded draws after top-k, top-p,
    min-p and penalties; a grammar's mask) picks the token it picks from the context's
    row, and a mask leaves the kept logits as they were."""
    model = LlamaCppBackend().load(starter_ref, LoadOptions(n_threads=THREADS, n_ctx=512, n_seq=1))
    chains = [
        SamplingParams(temperature=0.0),
        SamplingParams(temperature=0.9, top_k=40, top_p=0.9, min_p=0.02, seed=3),
        SamplingParams(temperature=1.5, seed=11, repeat_penalty=1.3, presence_penalty=0.5),
        SamplingParams(temperature=2.0, top_k=0, top_p=1.0, min_p=0.0, seed=5),
    ]

    def draw(params: SamplingParams, allowed: np.ndarray | None = None) -> int:
        sampler = model.new_sampler(params, prompt)
        try:
            return model.sample(sampler, 0, 0, allowed)
        finally:
            model.free_sampler(sampler)

    try:
        prompt = model.render_chat([Message("user", "Name three rivers of Europe.")])
        model.step([SeqWork(0, prompt, 1, last=True)])
        row = model.logits(0, 0)
        allowed = np.zeros(model.info.n_vocab, dtype=np.bool_)
        allowed[1000:1100] = True
        expected = [draw(p) for p in chains]
        assert len(set(expected)) > 1  # the chains differ, so the comparison means something
        masked = draw(chains[0], allowed)  # last: it masks the context's row in place
        assert 1000 <= masked < 1100
        assert model.seq_resume(0, prompt) and model.seq_tokens(0) == prompt
        assert np.array_equal(model.logits(0, 0), row)
        assert draw(chains[0], allowed) == masked
        assert [draw(p) for p in chains] == expected
        assert np.array_equal(model.logits(0, 0), row)
        assert not model.seq_resume(0, prompt[:-1])  # another prompt reads its own logits
    finally:
        model.close()
