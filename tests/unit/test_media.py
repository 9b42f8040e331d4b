"""Images and audio as every API hands them over (backends/media.py): formats, bounds and
encodings refused by name, and the pictures held for their steps."""

from __future__ import annotations

import base64
import io

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

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


def test_pictures_whose_digests_agree_in_their_first_bits_get_other_ids():
    """Round 4 found two PNGs whose SHA-256 agree in 30 bits in 0.35 s of hashing, and
    the second was answered from the first's KV: the ids took 30 bits of the digest. They
    now take all 256, so a shared id means a shared digest."""
    a = "ab" * 8 + "0" * 48
    b = "ab" * 8 + "0" * 47 + "1"  # agrees in 252 bits
    assert set(media.run_ids(a, 600)).isdisjoint(media.run_ids(b, 600))


@settings(max_examples=300, deadline=None)
@given(
    st.binary(min_size=32, max_size=32),
    st.binary(min_size=32, max_size=32),
    st.integers(1, 4096),
    st.integers(1, 4096),
)
def test_two_pictures_runs_never_meet(x: bytes, y: bytes, n: int, m: int) -> None:
    """Different digests: no id in common, and a run placed right after the other is
    never read as its continuation (each is its own picture to the cache and the
    backend)."""
    assume(x != y)
    first, second = media.run_ids(x.hex(), n), media.run_ids(y.hex(), m)
    assert set(first).isdisjoint(second)
    both = first + second
    assert media.run_end(both, 0) == n and media.run_start(both, n) == n
    again = first + first  # the same picture twice in a row: two runs
    assert media.run_end(again, 0) == n


def _png_header(width: int, height: int) -> bytes:
    """A PNG's signature and header chunk only: its size is known, its pixels never come."""
    import struct
    import zlib

    def chunk(kind: bytes, data: bytes) -> bytes:
        body = kind + data
        return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"\0" * 9))


def test_a_requests_images_share_a_pixel_budget_checked_before_decoding():
    """Round 4: six 6300x6300 PNGs in one request were all decoded (1.1 GB) before any
    check. Each image's size is read from its header and held to what the request has
    left, so the one past the budget is refused before its pixels are decoded."""
    small = noise_png(40, 30)
    with media.pixel_budget(2500):
        media.image(small, param="a")  # 1,200 pixels
        media.image(small, param="b")  # 2,400
        with pytest.raises(InvalidRequest, match="in all") as err:
            media.image(small, param="c")
        assert err.value.code == "media_too_large" and err.value.param == "c"
    with media.pixel_budget(6300 * 6300 * 2):
        for param in ("a", "b"):  # headers of 6300x6300: within the budget, then undecodable
            with pytest.raises(InvalidRequest, match="does not decode"):
                media.image(_png_header(6300, 6300), param=param)
        with pytest.raises(InvalidRequest, match="in all"):  # refused before decoding
            media.image(_png_header(6300, 6300), param="c")
    media.image(small, param="free")  # outside a request: no budget


def test_an_image_url_that_trickles_is_cut_at_the_deadline(monkeypatch: pytest.MonkeyPatch):
    """Round 4: a picture URL sending a byte every 5 s had no total deadline."""
    import asyncio
    import threading
    import time
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from localllm.server import media as smedia

    class Trickle(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Length", "1000")
            self.end_headers()
            try:
                for _ in range(1000):
                    self.wfile.write(b"x")
                    self.wfile.flush()
                    time.sleep(0.2)  # each byte well within the read timeout
            except OSError:
                return

    server = ThreadingHTTPServer(("127.0.0.1", 0), Trickle)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.setattr(smedia, "FETCH_TIMEOUT_S", 1.0)
    url = f"http://127.0.0.1:{server.server_address[1]}/a.png"
    try:
        with pytest.raises(InvalidRequest, match="took over 1 s") as err:
            asyncio.run(smedia.fetch([url], allowed=True))
        assert err.value.code == "image_url_timeout" and url in err.value.message
    finally:
        server.shutdown()
