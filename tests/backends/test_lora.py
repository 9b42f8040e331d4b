"""LoRA adapters on both backends, with random-weight adapters for the starter written in
the tests (llama.cpp: a GGUF adapter, tests/gguf_fixtures.py; MLX: an mlx-lm adapter
folder): the adapter at scale 0 gives exactly the output of the model loaded without it,
at scale 1 another one, and an adapter made for another model is refused by name with
nothing left loaded."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from localllm.backends.base import LoadOptions, Message, ModelRef, SamplingParams
from localllm.backends.llamacpp import LlamaCppBackend
from localllm.engine import single
from localllm.errors import AdapterMismatch
from tests.conftest import THREADS
from tests.gguf_fixtures import starter_lora

QUESTION = [Message("user", "What is the capital of France?")]


def _answer(model: object, scale: float | None) -> tuple[str, list[float]]:
    """Greedy answer (12 tokens) and the first step's top logits, with adapter 0 at
    `scale` as its global scale (None: the model has no adapters)."""
    from localllm.backends.base import Adapter

    if scale is not None:
        model.adapters[0] = Adapter(model.adapters[0].path, scale)  # type: ignore[attr-defined]
    prompt = model.render_chat(QUESTION)  # type: ignore[attr-defined]
    model.seq_keep(0, 0)  # type: ignore[attr-defined]
    chunks = list(single.stream(model, prompt, SamplingParams(temperature=0.0, max_tokens=12),  # type: ignore[arg-type]
                                should_stop=lambda: False))
    scores = model.logprobs(prompt[:24], start=1)  # type: ignore[attr-defined]
    return "".join(c.text for c in chunks), scores


@pytest.mark.model
def test_a_gguf_adapter_at_scale_0_is_the_base_model_and_at_1_is_not(
    starter_ref: ModelRef, tmp_path: Path
):
    lora = starter_lora(starter_ref.path, tmp_path / "lora.gguf")
    backend = LlamaCppBackend()
    plain = backend.load(starter_ref, LoadOptions(n_ctx=512, n_threads=THREADS))
    try:
        base = _answer(plain, None)
    finally:
        plain.close()
    adapted = backend.load(
        starter_ref, LoadOptions(n_ctx=512, n_threads=THREADS, loras=((str(lora), 1.0),))
    )
    try:
        assert _answer(adapted, 0.0) == base  # text and log probabilities, bit for bit
        text, scores = _answer(adapted, 1.0)
        assert text != base[0] and scores != base[1]
        assert _answer(adapted, 0.0) == base  # and back
    finally:
        adapted.close()


@pytest.mark.model
def test_a_gguf_adapter_for_another_model_is_refused_by_name(starter_ref: ModelRef,
                                                            tmp_path: Path):
    good = starter_lora(starter_ref.path, tmp_path / "good.gguf")
    bad = starter_lora(starter_ref.path, tmp_path / "wide.gguf", misfit=True)
    with pytest.raises(AdapterMismatch) as err:
        LlamaCppBackend().load(
            starter_ref, LoadOptions(n_ctx=256, loras=((str(good), 1.0), (str(bad), 1.0)))
        )
    said = err.value.public_message
    assert "wide.gguf does not fit the model" in said
    assert "blk.0.ffn_down.weight" in said and "incorrect shape" in said
    assert err.value.status == 400


def _mlx_adapter(folder: Path, ref: ModelRef, *, width: int | None = None) -> Path:
    """An mlx-lm adapter folder for the starter's MLX import: rank-4 LoRA on the query
    projection of its last two layers, random A and B (`width`: shaped for another model)."""
    import mlx.core as mx

    config = json.loads((ref.path / "config.json").read_text())
    hidden, layers = int(config["hidden_size"]), int(config["num_hidden_layers"])
    n_in = width or hidden
    folder.mkdir()
    (folder / "adapter_config.json").write_text(json.dumps({
        "fine_tune_type": "lora",
        "num_layers": 2,
        "lora_parameters": {"rank": 4, "scale": 20.0, "dropout": 0.1,
                            "keys": ["self_attn.q_proj"]},
    }))
    mx.random.seed(0)
    weights = {}
    for i in (layers - 2, layers - 1):
        name = f"model.layers.{i}.self_attn.q_proj"
        weights[f"{name}.lora_a"] = mx.random.normal((n_in, 4)) * 0.05
        weights[f"{name}.lora_b"] = mx.random.normal((4, hidden)) * 0.05
    mx.save_safetensors(str(folder / "adapters.safetensors"), weights)
    return folder


@pytest.mark.model
@pytest.mark.mlx
def test_an_mlx_adapter_at_scale_0_is_the_base_model_and_at_1_is_not(
    starter_mlx_ref: ModelRef, tmp_path: Path
):
    from localllm.backends.mlx import MlxBackend

    folder = _mlx_adapter(tmp_path / "adapter", starter_mlx_ref)
    backend = MlxBackend()
    plain = backend.load(starter_mlx_ref, LoadOptions(n_ctx=256))
    try:
        base = _answer(plain, None)
    finally:
        plain.close()
    adapted = backend.load(starter_mlx_ref, LoadOptions(n_ctx=256, loras=((str(folder), 1.0),)))
    try:
        assert _answer(adapted, 0.0) == base
        assert _answer(adapted, 1.0)[1] != base[1]
    finally:
        adapted.close()
    wrong = _mlx_adapter(tmp_path / "wrong", starter_mlx_ref, width=100)
    with pytest.raises(AdapterMismatch) as err:
        backend.load(starter_mlx_ref, LoadOptions(n_ctx=256, loras=((str(wrong), 1.0),)))
    said = err.value.public_message
    assert "wrong does not fit the model: mlx-lm refuses it" in said
    assert "adapter shape (100, 4) does not match model parameter shape (576, 4)" in said
