"""Images on the MLX backend through mlx-vlm: a tiny random-weight LLaVA folder
(tests/gguf_fixtures.py) on the starter's tokenizer. Real mlx-vlm processes, encodes and
reads each picture; the checks are the plumbing: the processor's image tokens in the
prompt as stand-ins, the picture read whole whatever the cut, the same logits from a
cold read, a chunked one and a cache that kept half of the picture, and another picture
giving other logits."""

from __future__ import annotations

import numpy as np
import pytest

from localllm.backends import media
from localllm.backends.base import MEDIA_MARKER, LoadOptions, Message, ModelRef, SeqWork
from localllm.errors import InvalidRequest
from tests.gguf_fixtures import noise_png, tiny_llava_mlx

pytestmark = pytest.mark.model


@pytest.fixture(scope="module")
def llava(starter_mlx_ref: ModelRef, tmp_path_factory: pytest.TempPathFactory):
    pytest.importorskip("mlx_vlm")
    from localllm.backends.mlx import MlxBackend

    folder = tiny_llava_mlx(tmp_path_factory.mktemp("llava") / "tiny-llava", starter_mlx_ref.path)
    model = MlxBackend().load(ModelRef("tiny-llava", folder, "mlx", "path"),
                              LoadOptions(n_ctx=512, n_seq=2))
    yield model
    model.close()


def _prompt(model, seed: int = 0) -> list[int]:
    img = media.image(noise_png(seed=seed), param="image")
    return model.render_chat([Message("user", f"What is {MEDIA_MARKER} this?", media=(img,))])


def _read(model, seq: int, parts: list[list[int]]) -> np.ndarray:
    model.seq_keep(seq, 0)
    for i, part in enumerate(parts):
        model.step([SeqWork(seq, part, logits=1 if i == len(parts) - 1 else 0)])
    return model.logits(seq, 0)


def test_a_picture_is_read_whole_and_reused_from_a_half_kept_cache(llava):
    assert llava.info.media == frozenset({"image"})
    tokens = _prompt(llava)
    assert sum(t < 0 for t in tokens) == 16  # LLaVA's 16 patches of a 32x32 image
    assert _prompt(llava) == tokens
    whole = _read(llava, 0, [tokens])
    first = next(i for i, t in enumerate(tokens) if t < 0)
    chunked = _read(llava, 1, [tokens[:first], tokens[first : first + 16], tokens[first + 16 :]])
    np.testing.assert_allclose(chunked, whole, atol=1e-4)
    assert llava.seq_keep(1, first + 5)  # a cache that kept part of the picture
    llava.step([SeqWork(1, tokens[first + 5 :], logits=1)])
    assert llava.seq_tokens(1) == tokens
    np.testing.assert_allclose(llava.logits(1, 0), whole, atol=1e-4)
    other = _read(llava, 1, [_prompt(llava, seed=1)])
    assert not np.allclose(other, whole, atol=1e-4)


def test_audio_and_a_prompt_ending_in_a_picture_are_refused(llava):
    clip = media.Media("audio", b"RIFF0000WAVEfmt ", "00" * 32)
    with pytest.raises(InvalidRequest) as err:
        llava.render_chat([Message("user", f"{MEDIA_MARKER} hi", media=(clip,))])
    assert err.value.code == "audio_not_supported"
    img = media.image(noise_png(), param="image")
    with pytest.raises(InvalidRequest, match="may not end with an image"):
        llava._vision.tokenize(f"look {MEDIA_MARKER}", [img], llava.tokenize)


def test_a_picture_let_go_is_processed_again_from_the_one_held(llava):
    tokens = _prompt(llava)
    whole = _read(llava, 0, [tokens])
    for seed in range(2, 12):  # ten other pictures push it out of the processed ones
        _prompt(llava, seed=seed)
    base = -next(t for t in tokens if t < 0)
    assert base not in llava._vision._runs and llava._vision.held.get(base) is not None
    np.testing.assert_allclose(_read(llava, 1, [tokens]), whole, atol=1e-4)
