"""Images on the llama.cpp backend through libmtmd: the starter with a tiny random-weight
LLaVA projector beside it (tests/gguf_fixtures.py). Real libmtmd preprocesses, encodes and
decodes each picture; the answers are noise, so these check the plumbing: the picture's
tokens in the prompt, its KV read whole whatever the cut, the same picture giving the
same logits from a cold read and from a cache that kept half of it."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from localllm.backends import media
from localllm.backends.base import MEDIA_MARKER, LoadOptions, Message, ModelRef, SeqWork
from localllm.errors import InvalidRequest, LocalLLMError
from tests.gguf_fixtures import noise_png, tiny_projector

pytestmark = pytest.mark.model


@pytest.fixture(scope="module")
def seer(tmp_path_factory: pytest.TempPathFactory):
    from localllm.backends.llamacpp import LlamaCppBackend
    from localllm.models.starter import starter_path

    path = starter_path()
    assert path is not None
    proj = tiny_projector(tmp_path_factory.mktemp("vision") / "mmproj.gguf")
    ref = ModelRef("seer", Path(path), "gguf", "path")
    model = LlamaCppBackend().load(ref, LoadOptions(n_ctx=512, n_seq=2, mmproj=str(proj)))
    yield model
    model.close()


def _prompt(model, seed: int = 0) -> list[int]:
    img = media.image(noise_png(seed=seed), param="image")
    msg = Message("user", f"What is in {MEDIA_MARKER} this picture?", media=(img,))
    return model.render_chat([msg])


def _next_logits(model, seq: int, parts: list[list[int]]) -> np.ndarray:
    model.seq_keep(seq, 0)
    for i, part in enumerate(parts):
        model.step([SeqWork(seq, part, logits=1 if i == len(parts) - 1 else 0)])
    return model.logits(seq, 0)


def test_a_picture_becomes_its_projector_tokens_in_the_prompt(seer):
    assert seer.info.media == frozenset({"image"})
    tokens = _prompt(seer)
    text = seer.render_chat([Message("user", "What is in  this picture?")])
    pictures = [t for t in tokens if t < 0]
    assert len(pictures) == 16  # 32x32 pixels in 8x8 patches: 16 embeddings
    assert [t for t in tokens if t >= 0] == text  # the text around it as it was
    assert _prompt(seer) == tokens  # the same picture: the same stand-in ids
    other = [t for t in _prompt(seer, seed=1) if t < 0]
    assert other != pictures and not set(other) & set(pictures)
    assert seer.detokenize(tokens).count("What is in") == 1  # stand-ins render as nothing


def test_the_picture_changes_the_logits_and_a_cut_through_it_does_not(seer):
    tokens = _prompt(seer)
    whole = _next_logits(seer, 0, [tokens])
    first = tokens.index(min(t for t in tokens if t < 0) + 15)  # the picture's first token
    # cut before the picture and after it: the same prompt in three steps
    parts = [tokens[:first], tokens[first : first + 16], tokens[first + 16 :]]
    assert np.argmax(_next_logits(seer, 1, parts)) == np.argmax(whole)
    np.testing.assert_allclose(_next_logits(seer, 1, parts), whole, atol=1e-3)
    other = _next_logits(seer, 1, [_prompt(seer, seed=1)])
    assert not np.allclose(other, whole, atol=1e-3)


def test_a_cache_that_kept_half_a_picture_reads_it_again_whole(seer):
    tokens = _prompt(seer)
    whole = _next_logits(seer, 0, [tokens])
    first = tokens.index(min(t for t in tokens if t < 0) + 15)
    _next_logits(seer, 1, [tokens])
    assert seer.seq_keep(1, first + 5)  # a prompt cache cut inside the picture
    seer.step([SeqWork(1, tokens[first + 5 :], logits=1)])
    assert seer.seq_tokens(1) == tokens
    np.testing.assert_allclose(seer.logits(1, 0), whole, atol=1e-3)


def test_a_step_that_ends_inside_a_picture_is_refused(seer):
    tokens = _prompt(seer)
    first = tokens.index(min(t for t in tokens if t < 0) + 15)
    seer.seq_keep(0, 0)
    with pytest.raises(LocalLLMError, match="read whole"):
        seer.step([SeqWork(0, tokens[: first + 4], logits=0)])
    assert seer.seq_tokens(0) == []


def test_the_scheduler_cut_never_falls_inside_a_picture():
    tokens = [5, 6, *media.run_ids("ab" * 32, 10), 7, 8]
    assert media.whole_runs(tokens, 0, 1) == 1
    assert media.whole_runs(tokens, 0, 2) == 2  # just before the picture
    assert media.whole_runs(tokens, 0, 5) == 2  # inside: back to its start
    assert media.whole_runs(tokens, 2, 5) == 12  # it starts the part: read to its end
    assert media.whole_runs(tokens, 0, 12) == 12
    twice = [*media.run_ids("ab" * 32, 4), *media.run_ids("ab" * 32, 4), 1]
    assert media.whole_runs(twice, 0, 4) == 4  # the same picture twice: two pictures
    assert media.run_end(twice, 0) == 4 and media.run_start(twice, 6) == 4


def test_text_only_and_a_prompt_ending_in_a_picture(seer):
    img = media.image(noise_png(), param="image")
    with pytest.raises(InvalidRequest, match="places 2 images or clips and carries 1"):
        seer.render_chat([Message("user", f"{MEDIA_MARKER}{MEDIA_MARKER}", media=(img,))])
    proj = seer._projector
    with pytest.raises(InvalidRequest, match="may not end with an image"):
        proj.tokenize(f"look: {MEDIA_MARKER}", [img])
    clip = media.Media("audio", b"RIFF0000WAVEfmt ", "00" * 32)
    with pytest.raises(InvalidRequest) as err:
        seer.render_chat([Message("user", f"{MEDIA_MARKER} hi", media=(clip,))])
    assert err.value.code == "audio_not_supported"


def test_audio_through_an_audio_projector(tmp_path: Path):
    """A Qwen2-Audio-style projector: libmtmd's mel spectrogram and Whisper encoder turn
    a clip into 750 embeddings (one 30-second window), wrapped in the model's audio
    markers; another sound gives other logits."""
    from localllm.backends.llamacpp import LlamaCppBackend
    from localllm.models.starter import starter_path
    from tests.gguf_fixtures import tiny_audio_projector, tone_wav

    proj = tiny_audio_projector(tmp_path / "mmproj-audio.gguf")
    ref = ModelRef("hearer", Path(str(starter_path())), "gguf", "path")
    model = LlamaCppBackend().load(ref, LoadOptions(n_ctx=2048, mmproj=str(proj)))
    try:
        assert model.info.media == frozenset({"audio"})

        def heard(hz: float) -> np.ndarray:
            clip = media.audio(tone_wav(hz=hz), param="audio")
            msg = Message("user", f"{MEDIA_MARKER}What is this sound?", media=(clip,))
            tokens = model.render_chat([msg])
            assert sum(t < 0 for t in tokens) == 750
            assert "<|audio_bos|><|audio_eos|>What is this sound?" in model.detokenize(tokens)
            return _next_logits(model, 0, [tokens])

        assert not np.allclose(heard(440), heard(880), atol=1e-3)
        img = media.image(noise_png(), param="image")
        with pytest.raises(InvalidRequest) as err:
            model.render_chat([Message("user", f"{MEDIA_MARKER} hi", media=(img,))])
        assert err.value.code == "vision_not_supported"
    finally:
        model.close()


def test_a_picture_let_go_is_prepared_again_from_the_one_held(seer):
    """The prepared chunks are few (8); a step whose picture's chunk was let go meanwhile
    prepares it again from the picture held for it, with the same logits."""
    tokens = _prompt(seer)
    whole = _next_logits(seer, 0, [tokens])
    proj = seer._projector
    for seed in range(2, 12):  # ten other pictures push it out of the prepared ones
        _prompt(seer, seed=seed)
    base = -min(t for t in tokens if t < 0) - 15
    assert base not in proj._chunks and proj.held.get(base) is not None
    np.testing.assert_allclose(_next_logits(seer, 1, [tokens]), whole, atol=1e-3)
