"""kv_cache_type on the MLX backend: mlx-lm's quantized KV cache (kv_bits 8 or 4, groups
of 64), with every KV operation the engine uses (cut, copy between sequences, save,
write to bytes and read back, restore) working on its three-array layers: a quantized
state restored from bytes answers exactly as the cold run, and takes about a quarter of
the memory of the plain cache (f32 on a CPU)."""

from __future__ import annotations

import pytest

from localllm.backends.base import LoadOptions, Message, ModelRef, SamplingParams, SeqWork
from localllm.engine import single

pytestmark = [pytest.mark.model, pytest.mark.mlx]

GREEDY = SamplingParams(temperature=0.0, max_tokens=8)


def _text(model: object, prompt: list[int]) -> str:
    chunks = single.stream(model, prompt, GREEDY, should_stop=lambda: False)  # type: ignore[arg-type]
    return "".join(c.text for c in chunks)


def test_a_quantized_mlx_cache_round_trips_and_is_smaller(starter_mlx_ref: ModelRef):
    from localllm.backends.mlx import MlxBackend

    backend = MlxBackend()
    plain = backend.load(starter_mlx_ref, LoadOptions(n_ctx=256))
    prompt = plain.render_chat([Message("user", "Name a colour.")])
    try:
        plain.step([SeqWork(0, prompt, 1)])
        plain_bytes = plain.save_kv(0, exact=False).nbytes
    finally:
        plain.close()
    model = backend.load(starter_mlx_ref, LoadOptions(n_ctx=256, n_seq=2, kv_type="q8_0"))
    try:
        assert model.info.extra["kv_type"] == "q8_0"
        cold = _text(model, prompt)
        assert cold
        saved = model.save_kv(0, exact=False)
        # 8-bit values with a scale and a bias per 64 (f32 here): 72 bytes where f32 takes 256
        assert 0.2 < saved.nbytes / plain_bytes < 0.35
        again = model.undump_kv(saved.tokens, model.dump_kv(saved))
        assert again.nbytes == saved.nbytes
        model.seq_keep(0, 0)
        assert model.load_kv(again, 0) and model.seq_tokens(0) == list(saved.tokens)
        assert _text(model, prompt) == cold  # the exact prefix restored gives the cold answer
        # a prefix copied to another sequence reads as its own
        n = len(prompt) - 1
        assert model.seq_copy(0, 1, n) and model.seq_tokens(1) == prompt[:n]
        model.seq_keep(0, n)
        model.step([SeqWork(0, prompt[n:], 1), SeqWork(1, prompt[n:], 1)])
        assert (model.logits(0, 0) == model.logits(1, 0)).all()
        # the disk tier's bytes are checked before they are used
        with pytest.raises(ValueError, match="not a KV state"):
            model.undump_kv((1, 2), b"LLKV" + bytes(16))  # the plain cache's former format
        data = model.dump_kv(saved)
        with pytest.raises(ValueError, match="cut short"):
            model.undump_kv(saved.tokens, data[: len(data) // 2])
        with pytest.raises(ValueError, match="not a KV state of these tokens"):
            model.undump_kv(saved.tokens[:-1], data)
    finally:
        model.close()
