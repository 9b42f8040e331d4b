"""The backend contract, on the real starter model, for every available backend."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np
import pytest

from localllm.backends.base import (
    Chunk,
    LoadedModel,
    Message,
    ModelRef,
    SamplingParams,
    SeqWork,
)
from localllm.backends.common import ALIGN
from localllm.engine import single
from localllm.engine.scheduler import WHOLE_BELOW
from localllm.errors import ContextOverflow, InvalidRequest
from localllm.models.gguf import read_gguf
from tests.conftest import CONTRACT_CTX

GREEDY = SamplingParams(temperature=0.0, max_tokens=16)
# a run that only puts another prompt in the KV cache (what it answers is never read)
RESET = SamplingParams(temperature=0.0, max_tokens=1)
NEVER = lambda: False  # noqa: E731


def run(
    model: LoadedModel, prompt: list[int], params: SamplingParams, *, exact: bool = True
) -> list[Chunk]:
    return list(single.stream(model, prompt, params, should_stop=NEVER, exact=exact))


def chat(model: LoadedModel, text: str) -> list[int]:
    return model.render_chat([Message("user", text)])


def generated(chunks: list[Chunk]) -> list[int]:
    return [t for c in chunks for t in c.tokens]


def cached(chunks: list[Chunk]) -> int:
    """The prompt tokens a run found in the KV cache (its final chunk's figure)."""
    stats = chunks[-1].stats
    assert stats is not None
    return stats.cached_tokens


def test_tokenize_round_trip(loaded: LoadedModel):
    text = "Hello, world! Ünïcödé 🎉 and code: def f(x): return x"
    assert loaded.detokenize(loaded.tokenize(text)) == text


def test_special_tokens_parse_only_when_asked(loaded: LoadedModel):
    plain = loaded.tokenize("<|im_end|>")
    special = loaded.tokenize("<|im_end|>", special=True)
    assert len(special) == 1 and special[0] in loaded.info.eog_ids
    assert len(plain) > 1


def test_chat_template_from_gguf(loaded: LoadedModel):
    text = loaded.detokenize(chat(loaded, "Hi"))
    assert "<|im_start|>user\nHi<|im_end|>" in text
    assert text.endswith("<|im_start|>assistant\n")


def test_max_tokens_exactly_and_one_final_chunk(loaded: LoadedModel):
    chunks = run(loaded, chat(loaded, "Tell me a long story about a dragon."),
                 SamplingParams(temperature=0.0, max_tokens=7))
    finals = [c for c in chunks if c.finish_reason is not None]
    assert len(finals) == 1 and chunks[-1] is finals[0]
    assert finals[0].finish_reason == "length"
    assert len(generated(chunks)) == 7
    assert finals[0].stats is not None and finals[0].stats.generated_tokens == 7


SYSTEM = "You are a helpful assistant who knows history, geography and science well. " * 8
SHORT_SYSTEM = "You are a helpful assistant who knows history, geography and science well. " * 5


@pytest.mark.parametrize("question", ["Tell me about the history of Rome. " * 8,
                                      "Explain photosynthesis in detail."])
def test_cached_prefix_gives_exactly_the_cold_output(loaded: LoadedModel, question: str):
    mlx = loaded.info.backend == "mlx"
    prompt = loaded.render_chat([Message("system", SYSTEM), Message("user", question)])
    # MLX on this CPU decodes at a few tokens/s: 16 tokens compared there, 32 on llama.cpp
    params = SamplingParams(temperature=0.0, max_tokens=16 if mlx else 32)
    run(loaded, loaded.tokenize("Zebra crossing"), RESET)  # nothing of `prompt` is cached now
    cold = run(loaded, prompt, params)
    assert cold[-1].stats is not None and cold[-1].stats.cached_tokens == 0
    full_hit = run(loaded, prompt, params)  # the same prompt again
    other = loaded.render_chat([Message("system", SYSTEM), Message("user", "Hi there.")])
    run(loaded, other, RESET)  # shares only the system prompt
    partial_hit = run(loaded, prompt, params)
    assert generated(full_hit) == generated(cold)
    assert generated(partial_hit) == generated(cold)
    full, part = full_hit[-1].stats, partial_hit[-1].stats
    assert full is not None and part is not None
    assert full.cached_tokens == (len(prompt) - 1) // ALIGN * ALIGN  # whole blocks only
    assert 0 < part.cached_tokens < full.cached_tokens


def test_a_rerun_samples_from_the_first_run_s_logits_or_reads_its_last_batch_again(
    loaded: LoadedModel, monkeypatch: pytest.MonkeyPatch
):
    """Outside deterministic mode, a short new part of a prompt (a follow-up turn) is read
    in one step, its last token with it, and a long one leaves that token for a step of its
    own. The same prompt again, on the sequence that read it, reads nothing: its first
    token is drawn from the logits the first run drew from, kept with the KV, so a
    repeatable request answers the same and its log probabilities are the same numbers (a
    request sampled at random draws from them too); a state saved in RAM and restored keeps
    them. Without them (a state read back from disk), a repeatable rerun reads the first
    run's last batch again, for the same logits; a request sampled at random then keeps all
    but the prompt's last token."""
    steps: list[list[int]] = []
    finals: list[tuple[int, np.ndarray]] = []  # each prompt's last batch and its logits
    step = loaded.step
    # each prompt runs four times: 8 tokens compared on MLX (a few tokens/s here), 16 on llama
    tokens = 8 if loaded.info.backend == "mlx" else 16
    params = SamplingParams(temperature=0.0, max_tokens=tokens, logprobs=2)

    def spy(work: Sequence[SeqWork]) -> None:
        step(work)
        steps.append([len(w.tokens) for w in work])
        finals.extend((len(w.tokens), loaded.logits(w.seq, 0)) for w in work if w.final)

    monkeypatch.setattr(loaded, "step", spy)

    def restore(*, from_disk: bool) -> None:
        """Sequence 0's state saved and restored, as the prompt cache parks one."""
        snap = loaded.save_kv(0, exact=False)
        loaded.load_kv(dataclasses.replace(snap, kept=None) if from_disk else snap, 0)

    def first_logprobs(chunks: list[Chunk]) -> tuple[object, ...]:
        return next(c.logprobs for c in chunks if c.tokens)

    def twice(prompt: list[int]) -> tuple[int, int, int]:
        """Run `prompt` twice, then once more from a restored state: the first run's
        cached and new tokens, and its first step's."""
        steps.clear()
        finals.clear()
        first = run(loaded, prompt, params, exact=False)
        first_steps = list(steps)
        again = run(loaded, prompt, params, exact=False)
        assert generated(again) == generated(first)
        assert first_logprobs(again) == first_logprobs(first)
        assert cached(again) == len(prompt)
        assert all(n == [1] for n in steps[len(first_steps) :])  # each step one new token
        restore(from_disk=False)
        from_ram = run(loaded, prompt, params, exact=False)
        assert cached(from_ram) == len(prompt) and generated(from_ram) == generated(first)
        restore(from_disk=True)
        restored = run(loaded, prompt, params, exact=False)
        assert generated(restored) == generated(first)
        (n1, logits1), (n2, logits2) = finals
        assert n1 == n2 and np.array_equal(logits1, logits2)
        assert cached(restored) == len(prompt) - n1  # the same batch read again
        steps[:] = first_steps
        return cached(first), len(prompt) - cached(first), steps[0][0]

    question = [Message("user", "Name three colours.")]
    prompt = loaded.render_chat(question)
    _, n_new, first_step = twice(prompt)
    assert 1 < n_new < WHOLE_BELOW and first_step == n_new
    answer = loaded.detokenize(generated(run(loaded, prompt, GREEDY, exact=False)))
    follow = loaded.render_chat(
        [*question, Message("assistant", answer), Message("user", "And three animals?")]
    )
    n_cached, n_new, first_step = twice(follow)
    assert n_cached >= len(prompt) and first_step == n_new  # only what is new, in one step
    hot = SamplingParams(temperature=0.8, max_tokens=2)
    assert cached(run(loaded, follow, hot, exact=False)) == len(follow)  # kept logits
    restore(from_disk=True)
    assert cached(run(loaded, follow, hot, exact=False)) == len(follow) - 1
    long = chat(loaded, "Describe the sea and its tides in detail, please. " * 8)
    _, n_new, first_step = twice(long)
    assert n_new >= WHOLE_BELOW and first_step == n_new - 1 and finals[0][0] == 1


def test_seeded_sampling_repeats(loaded: LoadedModel):
    params = SamplingParams(temperature=1.0, seed=1234, max_tokens=12)
    prompt = chat(loaded, "Invent a word.")
    assert generated(run(loaded, prompt, params)) == generated(run(loaded, prompt, params))


def test_stop_string_never_appears(loaded: LoadedModel):
    prompt = chat(loaded, "Count from 1 to 10, separated by commas.")
    free = "".join(c.text for c in run(loaded, prompt, SamplingParams(temperature=0.0,
                                                                     max_tokens=30)))
    assert "4" in free, free
    stop = free[free.index("4") : free.index("4") + 2]  # e.g. "4," — may span tokens
    chunks = run(loaded, prompt, SamplingParams(temperature=0.0, max_tokens=30, stop=(stop,)))
    text = "".join(c.text for c in chunks)
    assert stop not in text
    assert text == free[: free.index(stop)]
    assert chunks[-1].finish_reason == "stop"


def test_non_ascii_output_is_valid_utf8(loaded: LoadedModel):
    bos = [loaded.info.bos_id] if loaded.info.add_bos and loaded.info.bos_id is not None else []
    prompt = bos + loaded.tokenize("Emoji party: 🎉🎉")
    chunks = run(loaded, prompt, SamplingParams(temperature=0.0, max_tokens=9))
    text = "".join(c.text for c in chunks)
    assert any(ord(ch) > 127 for ch in text), text
    assert "\ufffd" not in text
    for c in chunks:
        c.text.encode("utf-8")  # every chunk is whole characters


def test_cancel_between_tokens(loaded: LoadedModel):
    seen: list[int] = []

    def stop_after_three() -> bool:
        return len(seen) >= 3

    final = None
    for c in single.stream(loaded, chat(loaded, "Write a long essay about rivers."),
                           SamplingParams(temperature=0.0, max_tokens=200),
                           should_stop=stop_after_three):
        seen.extend(c.tokens)
        final = c
    assert final is not None and final.finish_reason == "cancelled"
    assert len(seen) == 3


def test_context_overflow_before_compute(loaded: LoadedModel):
    n_ctx = loaded.info.n_ctx
    prompt = loaded.tokenize("word " * (n_ctx + 10))
    assert len(prompt) > n_ctx
    with pytest.raises(ContextOverflow) as err:
        single.stream(loaded, prompt, GREEDY, should_stop=NEVER)  # raises before iteration starts
    assert err.value.prompt_tokens == len(prompt) and err.value.n_ctx == n_ctx
    assert str(n_ctx) in err.value.message and str(len(prompt)) in err.value.message


def test_generation_stops_at_end_of_context(loaded: LoadedModel):
    n_ctx = loaded.info.n_ctx
    base = chat(loaded, "Say anything.")
    filler = loaded.tokenize(" x" * (n_ctx - len(base) - 4))
    prompt = base[:-3] + filler + base[-3:]
    room = n_ctx - len(prompt)
    chunks = run(loaded, prompt, SamplingParams(temperature=0.0, max_tokens=100))
    assert len(generated(chunks)) <= room
    assert chunks[-1].finish_reason in ("length", "stop")


def test_model_info(loaded: LoadedModel, starter_ref: ModelRef):
    info = loaded.info
    assert info.n_ctx == CONTRACT_CTX[info.backend] and info.n_ctx_train == 8192
    assert info.eog_ids and 2 in info.eog_ids  # <|im_end|>
    assert info.quant.upper().startswith("Q4_1")
    # the same identity the store reads from the file header, whatever the backend
    assert info.vocab_fingerprint == read_gguf(starter_ref.path).vocab_fingerprint


def test_follow_up_and_restored_states_give_exactly_the_cold_output(loaded: LoadedModel):
    params = SamplingParams(temperature=0.0, max_tokens=8 if loaded.info.backend == "mlx" else 12)
    first = [Message("system", SHORT_SYSTEM), Message("user", "Name a river.")]
    p1 = loaded.render_chat(first)
    run(loaded, loaded.tokenize("Zebra crossing"), RESET)
    answer = "".join(c.text for c in run(loaded, p1, params))
    p2 = loaded.render_chat([*first, Message("assistant", answer),
                             Message("user", "And a mountain?")])
    run(loaded, loaded.tokenize("Zebra crossing"), RESET)
    cold = run(loaded, p2, params)
    snapshot = loaded.save_kv()  # the reusable prefix of p2: whole aligned blocks
    assert 0 < len(snapshot.tokens) <= len(p2) - 1 and len(snapshot.tokens) % ALIGN == 0
    assert list(snapshot.tokens) == p2[: len(snapshot.tokens)] and snapshot.nbytes > 0

    run(loaded, p1, params)  # the first turn again: its answer is in the KV cache now
    follow_up = run(loaded, p2, params)  # reuses the first turn's blocks, never the answer's
    assert generated(follow_up) == generated(cold)
    assert 0 < cached(follow_up) <= (len(p1) - 1) // ALIGN * ALIGN

    run(loaded, loaded.tokenize("Zebra crossing"), RESET)
    assert loaded.kv_prefix() != list(snapshot.tokens)
    assert loaded.load_kv(snapshot)
    restored = run(loaded, p2, params)
    assert generated(restored) == generated(cold)
    assert cached(restored) == len(snapshot.tokens)

    data = bytes(loaded.dump_kv(snapshot))  # through bytes, as the disk tier writes them
    again = loaded.undump_kv(snapshot.tokens, data)
    run(loaded, loaded.tokenize("Zebra crossing"), RESET)
    assert loaded.load_kv(again)
    assert generated(run(loaded, p2, params)) == generated(cold)


def test_logprobs_score_every_token_after_start(loaded: LoadedModel):
    toks = loaded.tokenize("The old lighthouse keeper climbed the stairs every night. " * 3)
    third = len(toks) // 3
    lps = loaded.logprobs(toks, start=1)
    assert len(lps) == len(toks) - 1 and all(lp <= 0 for lp in lps)
    assert loaded.logprobs(toks, start=third) == pytest.approx(lps[third - 1:], abs=2e-3)
    # the third time the sentence comes, the model has seen it twice: far more probable
    first = sum(lps[: third - 1]) / (third - 1)
    last = sum(lps[2 * third:]) / len(lps[2 * third:])
    assert last > first + 1.0, (first, last)


def test_logprobs_rank_the_greedy_token_first(loaded: LoadedModel):
    prompt = chat(loaded, "Name a colour.")
    greedy = generated(run(loaded, prompt, SamplingParams(temperature=0.0, max_tokens=1)))[0]
    other = loaded.tokenize(" zebra")[0]
    assert other != greedy
    chosen = loaded.logprobs([*prompt, greedy], start=len(prompt))
    rival = loaded.logprobs([*prompt, other], start=len(prompt))
    assert len(chosen) == len(rival) == 1 and chosen[0] > rival[0]
    # and the model still generates as before: scoring left no state behind
    again = generated(run(loaded, prompt, SamplingParams(temperature=0.0, max_tokens=1)))
    assert again == [greedy]


def test_logprobs_refuse_more_than_the_context(loaded: LoadedModel):
    n_ctx = loaded.info.n_ctx
    with pytest.raises(InvalidRequest) as err:
        loaded.logprobs([1] * (n_ctx + 1))
    assert f"scoring needs {n_ctx + 1} tokens in one context of {n_ctx}" in err.value.message
