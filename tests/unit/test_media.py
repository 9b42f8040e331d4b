"""Images and audio as every API hands them over (backends/media.py): formats, bounds and
encodings refused by name, and the pictures held for their steps."""

from __future__ import annotations

import base64
import io

import pytest

from localllm.backends import media
from localllm.errors import InvalidRequest
from tests.gguf_fixtures import noise_png, tone_wav


def _refused(call, *args, **kwargs) -> InvalidRequest:
    with pytest.raises(InvalidRequest) as err:
        call(*args, **kwargs)
    return err.value


def test_an_image_is_checked_and_decoded_once():
    png = noise_png(48, 40)
    item = media.image(png, param="image_url")
    assert (item.kind, item.width, item.height, len(item.data)) == ("image", 48, 40, 48 * 40 * 3)
    assert item.source == png and item.mime == "image/png"
    assert media.image(png, param="x").digest == item.digest != media.image(noise_png(seed=1),
                                                                            param="x").digest


def test_formats_and_bounds_are_refused_with_their_numbers():
    from PIL import Image

    tiff = io.BytesIO()
    Image.new("RGB", (8, 8)).save(tiff, "TIFF")
    err = _refused(media.image, tiff.getvalue(), param="image_url")
    assert err.code == "unsupported_media" and "TIFF" in err.message and "PNG" in err.message
    err = _refused(media.image, b"\x00" * (media.MAX_MEDIA_BYTES + 1), param="image_url")
    assert err.code == "media_too_large" and "20,971,521 bytes" in err.message
    err = _refused(media.image, noise_png()[:60], param="image_url")  # cut short
    assert err.code == "unsupported_media"
    err = _refused(media.decode_base64, "A" * (media.MAX_MEDIA_BYTES * 4 // 3 + 8), param="x")
    assert err.code == "media_too_large"
    assert "not valid base64" in _refused(media.decode_base64, "ab$cd", param="x").message
    assert "data URL" in _refused(media.data_url, "data:image/png,raw", param="x").message
    mime, data = media.data_url("data:image/png;base64," + base64.b64encode(b"hi").decode(),
                                param="x")
    assert (mime, data) == ("image/png", b"hi")
    assert media.decode_base64("aGk", param="x") == b"hi"  # padding left out


def test_audio_is_told_by_its_first_bytes():
    wav = tone_wav()
    assert media.audio_format(wav) == "wav"
    assert media.audio_format(b"fLaC" + bytes(8)) == "flac"
    assert media.audio_format(b"ID3" + bytes(8)) == "mp3"
    assert media.audio_format(noise_png()) is None
    assert media.from_bytes(wav, param="images[0]").kind == "audio"
    assert media.from_bytes(noise_png(), param="images[0]").kind == "image"
    err = _refused(media.audio, noise_png(), param="input_audio", declared="wav")
    assert err.code == "unsupported_media" and "wav, mp3 or flac" in err.message


def test_pictures_are_held_by_bytes_the_prompt_s_own_kept():
    items = [media.image(noise_png(seed=i), param="x") for i in range(4)]
    size = len(items[0].data)
    held = media.Held(limit=2 * size)
    held.add(1, items[0])
    held.add(2, items[1])
    held.add(3, items[2])  # over the bound: the least recently used goes
    assert held.get(1) is None and held.get(2) is items[1] and held.get(3) is items[2]
    held.add(4, items[3], keep=[2, 3, 4])  # one prompt's three pictures all stay
    assert all(held.get(b) is not None for b in (2, 3, 4))
