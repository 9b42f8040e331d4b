"""The engine's prompt cache on the real starter model (llama.cpp): several conversations
warm at once, a RAM budget, the disk tier across restarts, and exact output throughout.
The backend half (save/restore gives a cold run's tokens) is in the contract suite."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from localllm.backends import get_backend
from localllm.backends.base import (
    CPU_F16,
    Chunk,
    LoadedModel,
    MemoryProfile,
    Message,
    ModelRef,
    SamplingParams,
)
from localllm.config import Settings
from localllm.engine.engine import Engine
from localllm.engine.load_plan import kv_type_refused
from localllm.engine.request import Request
from localllm.errors import ContextOverflow
from tests.conftest import THREADS, loads_model
from tests.gguf_fixtures import tiny_bert

GREEDY = SamplingParams(temperature=0.0, max_tokens=8)
TOPICS = ("rivers", "mountains", "deserts", "forests")


def system(topic: str) -> str:
    return f"You are an expert on {topic}. Answer in one short sentence. " * 8


def conversation(topic: str, turns: int) -> list[Message]:
    msgs = [Message("system", system(topic))]
    for i in range(turns):
        msgs.append(Message("user", f"Tell me fact number {i + 1} about {topic}."))
        if i < turns - 1:
            msgs.append(Message("assistant", f"Fact {i + 1}: {topic} are remarkable."))
    return msgs


def ask(engine: Engine, messages: list[Message]) -> tuple[list[int], Chunk]:
    chunks = list(engine.generate(Request(GREEDY, messages=messages)))
    return [t for c in chunks for t in c.tokens], chunks[-1]


def make(tmp_path: Path, **kw: object) -> Engine:
    # deterministic, one sequence: each conversation parks the one before, and every
    # answer must be exactly a cold run's
    values: dict = {"n_threads": THREADS, "n_ctx": 1024, "data_dir": tmp_path / "data",
                    "cache_dir": tmp_path / "cache", "prompt_cache_ram_mb": 512,
                    "prompt_cache_disk_mb": 0, "deterministic": True, "parallel": 1}
    values.update(kw)
    return Engine(Settings(**values))


@pytest.fixture(scope="module")
@loads_model
def cold(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Engine]:
    """Answers with no cache: nothing is kept, and an unrelated prompt runs before each."""
    engine = make(tmp_path_factory.mktemp("cold"), prompt_cache_ram_mb=0)
    yield engine
    engine.close()


def cold_answer(cold: Engine, messages: list[Message]) -> list[int]:
    ask(cold, [Message("user", "Zebra crossing")])
    tokens, final = ask(cold, messages)
    assert final.stats is not None and final.stats.cached_tokens == 0
    return tokens


def length_of(messages: list[Message]) -> Callable[[LoadedModel], int]:
    """How many tokens a chat renders to on a model (for Engine.with_model)."""
    return lambda model: len(model.render_chat(messages))


def detok(tokens: list[int]) -> Callable[[LoadedModel], str]:
    return lambda model: model.detokenize(tokens)


def test_four_interleaved_conversations_all_hit(tmp_path: Path, cold: Engine):
    engine = make(tmp_path)
    try:
        for topic in TOPICS:  # first turns, round robin: each parks the one before
            ask(engine, conversation(topic, 1))
        for topic in TOPICS:
            msgs = conversation(topic, 2)
            tokens, final = ask(engine, msgs)
            assert final.stats is not None
            first_turn = engine.with_model(None, length_of(conversation(topic, 1)))
            assert final.stats.cached_tokens >= (first_turn - 1) // 64 * 64 > 0, topic
            assert tokens == cold_answer(cold, msgs), topic
        stats = engine.cache.stats()
        assert stats["ram_entries"] >= 3 and stats["restored"] >= 3
        assert stats["hits"] == 4 and stats["requests"] == 8
    finally:
        engine.close()


@pytest.mark.model
def test_interleaved_conversations_each_keep_a_sequence(tmp_path: Path):
    """Four conversations taking turns on four sequences: each turn goes back to the
    sequence holding its conversation, so nothing is parked or restored, and each turn
    reads only its new tokens (a sequence holding another conversation that shares only
    the template's first tokens is not taken over while an empty one waits)."""
    engine = make(tmp_path, deterministic=False, parallel=4)
    try:
        history = {topic: [Message("system", system(topic))] for topic in TOPICS}
        last_prompt = dict.fromkeys(TOPICS, 0)  # each conversation's previous prompt, in tokens
        for turn in range(3):
            for topic, msgs in history.items():
                msgs.append(Message("user", f"Tell me fact number {turn + 1} about {topic}."))
                tokens, final = ask(engine, msgs)
                assert final.stats is not None
                assert final.stats.cached_tokens >= last_prompt[topic], (topic, turn)
                last_prompt[topic] = final.stats.prompt_tokens
                msgs.append(Message("assistant", engine.with_model(None, detok(tokens))))
        stats = engine.cache.stats()
        assert stats["requests"] == 12
        assert stats["restored"] == 0 and stats["ram_entries"] == 0, stats
    finally:
        engine.close()


def test_a_tiny_budget_evicts_and_answers_stay_exact(tmp_path: Path, cold: Engine):
    engine = make(tmp_path, prompt_cache_ram_mb=1)  # below one conversation's state
    try:
        for topic in TOPICS[:2]:
            ask(engine, conversation(topic, 1))
        msgs = conversation(TOPICS[0], 2)
        tokens, final = ask(engine, msgs)
        assert final.stats is not None and final.stats.cached_tokens == 0  # it was evicted
        assert tokens == cold_answer(cold, msgs)
        stats = engine.cache.stats()
        assert stats["evicted"] >= 1 and stats["ram_entries"] == 0
    finally:
        engine.close()


def disk_files(tmp_path: Path) -> list[Path]:
    return sorted((tmp_path / "cache" / "kv").rglob("*.kv"))


def test_restart_finds_the_conversation_on_disk(tmp_path: Path, cold: Engine):
    first = make(tmp_path, prompt_cache_disk_mb=256)
    ask(first, conversation("rivers", 1))
    first.close()  # shutdown parks the live state on disk
    assert len(disk_files(tmp_path)) == 1
    again = make(tmp_path, prompt_cache_disk_mb=256)
    try:
        msgs = conversation("rivers", 2)
        tokens, final = ask(again, msgs)
        assert final.stats is not None and final.stats.cached_tokens > 0
        assert tokens == cold_answer(cold, msgs)
        stats = again.cache.stats()
        assert stats["restored"] == 1 and stats["disk_entries"] >= 1
    finally:
        again.close()


@pytest.mark.model  # an Engine on the starter, with no fixture to say so
def test_a_request_does_not_wait_for_the_state_it_parks_to_reach_disk(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """The disk write of a parked conversation happens on the cache's writer thread: the
    next conversation is answered while that write is still held back, and shutdown
    waits for it, so a restart finds the state."""
    import threading

    from localllm.engine import kv_disk

    gate, writing = threading.Event(), threading.Event()
    real = kv_disk._write_files

    def held(job: object, settle: object) -> bool:
        writing.set()
        gate.wait(120)
        return real(job, settle)  # type: ignore[arg-type]

    monkeypatch.setattr(kv_disk, "_write_files", held)
    engine = make(tmp_path, prompt_cache_disk_mb=256)
    try:
        ask(engine, conversation("rivers", 1))
        tokens, final = ask(engine, conversation("deserts", 1))  # parks "rivers"
        assert writing.wait(60) and final.finish_reason == "length" and len(tokens) == 8
        assert not gate.is_set() and disk_files(tmp_path) == []  # answered, nothing written
        assert engine.cache.stats()["disk_entries"] == 0
    finally:
        gate.set()
        engine.close()
    assert len(disk_files(tmp_path)) == 2  # both conversations, whole, with their sidecars
    assert len(list((tmp_path / "cache" / "kv").rglob("*.json"))) == 2


def test_a_corrupt_disk_entry_is_dropped_and_the_answer_is_cold(
    tmp_path: Path, cold: Engine, caplog: pytest.LogCaptureFixture
):
    first = make(tmp_path, prompt_cache_disk_mb=256)
    ask(first, conversation("deserts", 1))
    first.close()
    (entry,) = disk_files(tmp_path)
    data = bytearray(entry.read_bytes())
    data[len(data) // 2] ^= 0xFF  # one flipped byte in the middle of the KV data
    entry.write_bytes(bytes(data))
    again = make(tmp_path, prompt_cache_disk_mb=256)
    try:
        msgs = conversation("deserts", 2)
        with caplog.at_level(logging.WARNING, logger="localllm.engine.prompt_cache"):
            tokens, final = ask(again, msgs)
        assert "dropping corrupt prompt-cache entry" in caplog.text
        assert final.stats is not None and final.stats.cached_tokens == 0
        assert tokens == cold_answer(cold, msgs)
        assert not entry.exists()
    finally:
        again.close()


@pytest.mark.model
def test_a_rerun_from_ram_or_disk_answers_the_same(tmp_path: Path):
    """Not deterministic: a state parked in RAM keeps the logits its prompt's last token
    gave, so the same request, asked again after its state was parked, reads nothing; the
    batch that read that token is saved with the state on disk too, so after a restart it
    reads that batch again; both answer the same. A state on disk is read back only when
    it gives at least DISK_MIN_REUSE tokens."""
    first = make(tmp_path, prompt_cache_disk_mb=256, deterministic=False)
    msgs = conversation("rivers", 2)

    def restored_answer(engine: Engine, n_cached: int) -> list[int]:
        """The rivers answer, from a state restored (the only restore), which it found
        `n_cached` of its prompt's tokens in."""
        tokens, final = ask(engine, msgs)
        assert engine.cache.stats()["restored"] == 1
        assert final.stats is not None and final.stats.cached_tokens == n_cached
        return tokens

    try:
        ask(first, conversation("rivers", 1))
        tokens, final = ask(first, msgs)
        assert final.stats is not None
        n_cached = final.stats.cached_tokens  # where its last (and only) batch began
        assert 0 < n_cached < final.stats.prompt_tokens - 1
        ask(first, conversation("deserts", 1))  # parks the rivers state
        assert restored_answer(first, final.stats.prompt_tokens) == tokens  # from RAM
    finally:
        first.close()
    again = make(tmp_path, prompt_cache_disk_mb=256, deterministic=False)
    try:
        # a few template tokens in common with the state on disk: not worth reading it back
        _, hello = ask(again, [Message("user", "Hello.")])
        assert hello.stats is not None and hello.stats.cached_tokens == 0
        assert again.cache.stats()["restored"] == 0
        assert restored_answer(again, n_cached) == tokens  # from disk, after a restart
    finally:
        again.close()


@pytest.mark.model
def test_another_context_size_does_not_reuse_a_state(tmp_path: Path):
    first = make(tmp_path, prompt_cache_disk_mb=256)
    ask(first, conversation("forests", 1))
    first.close()
    other = make(tmp_path, prompt_cache_disk_mb=256, n_ctx=512)
    try:
        _, final = ask(other, conversation("forests", 2))
        assert final.stats is not None and final.stats.cached_tokens == 0
        assert other.cache.stats()["disk_entries"] == 0  # another key: the entry is not seen
    finally:
        other.close()
    # each context size keeps its own states, in its own folder
    assert len({f.parent for f in disk_files(tmp_path)}) == 2


@pytest.mark.model
def test_truncate_oldest_keeps_the_system_prompt_and_newest_turns(tmp_path: Path):
    engine = make(tmp_path, n_ctx=256)
    try:
        long_chat = conversation("rivers", 6)  # about 400 tokens
        with pytest.raises(ContextOverflow):
            list(engine.generate(Request(GREEDY, messages=long_chat)))
        stream = list(engine.generate(Request(GREEDY, messages=long_chat,
                                              context_policy="truncate-oldest")))
        final = stream[-1]
        assert final.stats is not None and final.stats.prompt_tokens < 256
        assert final.finish_reason in ("length", "stop")
    finally:
        engine.close()


@pytest.mark.skipif(not get_backend("mlx").available(), reason="the mlx extra is not installed")
def test_restart_on_mlx_reads_the_state_back_from_disk(tmp_path: Path):
    short = [Message("system", "You are an expert on rivers. Answer briefly. " * 8),
             Message("user", "Name a river.")]
    first = make(tmp_path, backend="mlx", n_ctx=256, prompt_cache_disk_mb=256)
    text = "".join(c.text for c in first.generate(Request(GREEDY, messages=short)))
    first.close()
    assert len(disk_files(tmp_path)) == 1
    again = make(tmp_path, backend="mlx", n_ctx=256, prompt_cache_disk_mb=256)
    try:
        follow = [*short, Message("assistant", text), Message("user", "Another one?")]
        _, final = ask(again, follow)
        assert final.stats is not None and final.stats.cached_tokens >= 64
        assert again.cache.stats()["restored"] == 1
    finally:
        again.close()


@pytest.mark.model
def test_a_quantized_kv_cache_keeps_its_own_states(tmp_path: Path):
    """kv_cache_type q8_0: the KV is about half of f16's (ggml keeps 32 values in 34 bytes),
    /health says so, and a state saved at f16 is never restored into it (another key,
    another folder), while its own states come back after a restart."""
    f16 = make(tmp_path, prompt_cache_disk_mb=256)
    ask(f16, conversation("rivers", 1))
    (f16_row,) = f16.status().resident()
    f16.close()
    q8 = make(tmp_path, prompt_cache_disk_mb=256, kv_cache_type="q8_0")
    try:
        tokens, final = ask(q8, conversation("rivers", 2))
        assert tokens and final.stats is not None and final.stats.cached_tokens == 0
        assert q8.cache.stats()["disk_entries"] == 0  # the f16 entry is not seen
        (row,) = q8.status().resident()
        assert f16_row["kv_type"] == "f16" and row["kv_type"] == "q8_0"
        assert row["kv_bytes"] == pytest.approx(f16_row["kv_bytes"] * 34 / 64, rel=0.01)
    finally:
        q8.close()
    again = make(tmp_path, prompt_cache_disk_mb=256, kv_cache_type="q8_0")
    try:
        tokens_again, final = ask(again, conversation("rivers", 2))
        assert final.stats is not None and final.stats.cached_tokens > 0
        assert tokens_again == tokens  # deterministic: the restored state answers the same
    finally:
        again.close()
    assert len({f.parent for f in disk_files(tmp_path)}) == 2


@pytest.mark.model
def test_a_model_whose_heads_do_not_fit_the_blocks_keeps_f16(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
):
    """llama.cpp refuses a q8_0 cache for heads that are not whole 32-value blocks (tiny
    BERT's are 16 wide): such a model loads with an f16 cache, and the log says why; a
    backend that keeps its own KV (MLX) is named as such."""
    store = tmp_path / "data" / "models"
    store.mkdir(parents=True)
    tiny_bert(store / "tiny-bert.gguf")
    with caplog.at_level(logging.WARNING, logger="localllm.engine.load_plan"):
        engine = make(tmp_path, model="tiny-bert", kv_cache_type="q8_0")
        try:
            assert engine.with_model(None, lambda m: m.info.extra["kv_type"]) == "f16"
            (row,) = engine.status().resident()
            assert row["kv_type"] == "f16"
        finally:
            engine.close()
    assert "tiny-bert keeps an f16 KV cache" in caplog.text
    assert "blocks of 32 values, and its attention heads are 16 wide" in caplog.text
    mlx_like = MemoryProfile("f32", gpu_offload=False, quantized_kv=False)
    ref = ModelRef(name="tiny-bert", path=store / "tiny-bert.gguf", format="gguf", source="store")
    assert "does not apply kv_cache_type q4_0" in (kv_type_refused(ref, "q4_0", mlx_like) or "")
    assert kv_type_refused(ref, "q4_0", CPU_F16) is not None
