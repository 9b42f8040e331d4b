"""Images and audio in prompts: checked, decoded and placed in the token stream.

Every API hands its images (data URLs, base64 strings, files) to `image()` and its audio
to `audio()`: one set of limits and one set of errors for all of them. A prompt holds an
image as a run of stand-in token ids, all negative (no vocabulary has those): the run's
ids follow from the picture's digest, so the prompt cache, which compares token ids,
reuses the KV of a picture it has read before and never that of another one. The
backend (backends/llamacpp_media.py) turns a run back into the picture's embeddings.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import io
import threading
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar

from localllm.backends.base import MEDIA_MARKER, Media, ModelInfo
from localllm.errors import InvalidRequest

MAX_MEDIA_BYTES = 20 * 1024 * 1024  # one image or clip as sent (after base64)
MAX_IMAGE_PIXELS = 40_000_000  # width times height, decoded
MAX_REQUEST_PIXELS = 100_000_000  # all of a request's images (50 screenshots of 1080p)
IMAGE_FORMATS = ("PNG", "JPEG", "WEBP", "GIF", "BMP")
AUDIO_FORMATS = ("wav", "mp3", "flac")


def decode_base64(text: str, *, param: str) -> bytes:
    """The bytes of a base64 string (standard or URL-safe alphabet, padding optional);
    InvalidRequest naming `param` when it is not base64 or decodes to too much."""
    if len(text) * 3 // 4 > MAX_MEDIA_BYTES:
        raise InvalidRequest(
            f"{param} is {len(text) * 3 // 4:,} bytes; the limit is {MAX_MEDIA_BYTES:,}",
            param=param,
            code="media_too_large",
        )
    clean = "".join(text.split())
    clean += "=" * (-len(clean) % 4)
    try:
        return base64.b64decode(clean.replace("-", "+").replace("_", "/"), validate=True)
    except (binascii.Error, ValueError):
        raise InvalidRequest(f"{param} is not valid base64", param=param) from None


def data_url(url: str, *, param: str) -> tuple[str, bytes]:
    """The media type and bytes of a `data:` URL (base64 only)."""
    head, sep, payload = url.partition(",")
    if not sep or not head.startswith("data:") or not head.endswith(";base64"):
        raise InvalidRequest(f"{param} must be a data URL (data:image/png;base64,...)", param=param)
    return head[5:-7].lower(), decode_base64(payload, param=param)


_pixels_left: ContextVar[list[int] | None] = ContextVar("pixels_left", default=None)
_refused: ContextVar[InvalidRequest | None] = ContextVar("media_refused", default=None)


@contextmanager
def pixel_budget(
    limit: int = MAX_REQUEST_PIXELS, *, refused: InvalidRequest | None = None
) -> Iterator[None]:
    """The images `image()` decodes meanwhile (on this thread) share `limit` pixels; each
    is checked against what is left from its header, before its pixels are decoded (six
    6300x6300 PNGs in one request took 1.1 GB before this). `refused`: the model cannot
    read pictures at all, known before any is decoded: the first one raises it."""
    token, said = _pixels_left.set([limit]), _refused.set(refused)
    try:
        yield
    finally:
        _pixels_left.reset(token)
        _refused.reset(said)


def _spend(width: int, height: int, param: str) -> None:
    left = _pixels_left.get()
    if left is None:
        return
    if width * height > left[0]:
        raise InvalidRequest(
            f"{param} ({width}x{height}) takes the request's images past "
            f"{MAX_REQUEST_PIXELS:,} pixels in all; send fewer or smaller images",
            param=param,
            code="media_too_large",
        )
    left[0] -= width * height


def image(data: bytes, *, param: str) -> Media:
    """A checked image: PNG, JPEG, WebP, GIF (its first frame) or BMP, at most
    MAX_MEDIA_BYTES as sent and MAX_IMAGE_PIXELS decoded; InvalidRequest naming `param`
    and the limit otherwise. Decoded to RGB here, so the native code reads pixels only."""
    from PIL import Image, UnidentifiedImageError

    refused = _refused.get()
    if refused is not None:
        raise refused
    if len(data) > MAX_MEDIA_BYTES:
        raise InvalidRequest(
            f"{param} is {len(data):,} bytes; the limit is {MAX_MEDIA_BYTES:,}",
            param=param,
            code="media_too_large",
        )
    try:
        with Image.open(io.BytesIO(data)) as img:
            fmt = img.format or "?"
            if fmt not in IMAGE_FORMATS:
                raise InvalidRequest(
                    f"{param} is a {fmt} image; send one of {', '.join(IMAGE_FORMATS)}",
                    param=param,
                    code="unsupported_media",
                )
            width, height = img.size
            if width * height > MAX_IMAGE_PIXELS or not width or not height:
                raise InvalidRequest(
                    f"{param} is {width}x{height} pixels ({width * height:,}); the limit is "
                    f"{MAX_IMAGE_PIXELS:,} pixels",
                    param=param,
                    code="media_too_large",
                )
            _spend(width, height, param)
            rgb = img.convert("RGB").tobytes()
    except InvalidRequest:
        raise
    except UnidentifiedImageError:
        raise InvalidRequest(
            f"{param} is not an image ({len(data):,} bytes that no image format reads); "
            f"send one of {', '.join(IMAGE_FORMATS)}",
            param=param,
            code="unsupported_media",
        ) from None
    except (OSError, ValueError, SyntaxError, Image.DecompressionBombError) as exc:
        raise InvalidRequest(
            f"{param} does not decode as an image: {exc}", param=param, code="unsupported_media"
        ) from None
    digest = hashlib.sha256(data).hexdigest()
    return Media("image", rgb, digest, width, height, data, f"image/{fmt.lower()}")


def audio_format(data: bytes) -> str | None:
    """wav, mp3 or flac by the file's first bytes; None for anything else."""
    if data[:4] == b"RIFF" and data[8:12] == b"WAVE":
        return "wav"
    if data[:4] == b"fLaC":
        return "flac"
    if data[:3] == b"ID3" or (len(data) > 1 and data[0] == 0xFF and data[1] & 0xE0 == 0xE0):
        return "mp3"
    return None


def audio(data: bytes, *, param: str, declared: str | None = None) -> Media:
    """A checked audio clip: a wav, mp3 or flac file of at most MAX_MEDIA_BYTES (decoded
    by the backend); InvalidRequest naming `param` otherwise."""
    if len(data) > MAX_MEDIA_BYTES:
        raise InvalidRequest(
            f"{param} is {len(data):,} bytes; the limit is {MAX_MEDIA_BYTES:,}",
            param=param,
            code="media_too_large",
        )
    found = audio_format(data)
    if found is None or (declared is not None and declared.lower() not in AUDIO_FORMATS):
        said = f" (format {declared!r})" if declared else ""
        raise InvalidRequest(
            f"{param} is not a wav, mp3 or flac file{said}; send audio in one of "
            f"{', '.join(AUDIO_FORMATS)}",
            param=param,
            code="unsupported_media",
        )
    return Media(
        "audio", data, hashlib.sha256(data).hexdigest(), source=data, mime=f"audio/{found}"
    )


def from_bytes(data: bytes, *, param: str) -> Media:
    """An image, or audio when its first bytes say wav, mp3 or flac (Ollama's `images`
    and files named in the chat carry either)."""
    if audio_format(data) is not None:
        return audio(data, param=param)
    return image(data, param=param)


def with_markers(text: str, items: Sequence[Media]) -> str:
    """A message's text with a marker for each of `items` before it (where Ollama and
    llama-server place a message's images when its text does not say)."""
    return MEDIA_MARKER * len(items) + text


def no_media(info: ModelInfo, kind: str) -> InvalidRequest:
    """The error for a picture or clip sent to a model that cannot read it, saying what
    would let it."""
    what = "images" if kind == "image" else "audio"
    if info.media:
        fix = f"its projector reads {' and '.join(sorted(info.media))} only"
    elif info.format == "gguf":
        fix = (
            "it was loaded without a projector: put the model's mmproj GGUF beside it "
            "(mmproj-*.gguf, which `localllm pull` fetches with the model), or load it "
            "with --mmproj FILE"
        )
    else:
        fix = f"its backend ({info.backend}) reads text only"
    return InvalidRequest(
        f"{info.id} cannot read {what}: {fix}",
        param="messages",
        code="vision_not_supported" if kind == "image" else "audio_not_supported",
    )


class Held:
    """The pictures of prompts being read, by the base of their stand-in ids: what a step
    prepares a picture from (again, when what it made of it was let go). Kept least
    recently used first out, up to `limit` bytes, and never a prompt's own pictures while
    it is laid out: a long conversation's many pictures all stay until its step."""

    def __init__(self, limit: int = 512 * 1024 * 1024) -> None:
        self._limit = limit
        self._items: OrderedDict[int, Media] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()  # the tokenizer thread adds, the worker reads

    def add(self, base: int, item: Media, keep: Sequence[int] = ()) -> None:
        with self._lock:
            old = self._items.pop(base, None)
            self._bytes += len(item.data) - (len(old.data) if old is not None else 0)
            self._items[base] = item
            for other in [b for b in self._items if b not in keep and b != base]:
                if self._bytes <= self._limit:
                    break
                self._bytes -= len(self._items.pop(other).data)

    def get(self, base: int) -> Media | None:
        with self._lock:
            item = self._items.get(base)
            if item is not None:
                self._items.move_to_end(base)
            return item


def lost_media(text: str) -> None:
    """InvalidRequest when a prompt without pictures places one: the marker came with the
    client's text, in a field the schemas do not check one by one (a tool's description,
    a tool call's arguments, a system prompt: server/media.py checks message text)."""
    if MEDIA_MARKER in text:
        raise InvalidRequest(
            f"the request's text contains {MEDIA_MARKER!r}, which localllm reserves for "
            "pictures; remove it (from a message, a system prompt or instructions, a tool's "
            "description or a tool call's arguments)",
            param="messages",
            code="reserved_marker",
        )


# -- stand-in token ids ----------------------------------------------------------------


def run_ids(digest: str, n: int) -> list[int]:
    """The stand-in ids of a picture's n tokens: -base, -(base+1), ... where base is the
    whole SHA-256 digest as a number (Python's ints have no width, and a stand-in never
    reaches a backend's int32 token arrays): two pictures share ids only when their
    digests agree in all 256 bits. A run is told apart from the next by its ids not
    continuing."""
    base = 1 + (int(digest, 16) << 16)  # 2^16 ids of room before the next digest's run
    return [-(base + i) for i in range(n)]


def run_base(tokens: Sequence[int], i: int) -> int:
    """The base of the run that starts at tokens[i] (a negative id)."""
    return -tokens[i]


def continues(tokens: Sequence[int], i: int) -> bool:
    """Whether tokens[i] is inside a run that started before it."""
    return i > 0 and tokens[i] < 0 and tokens[i - 1] == tokens[i] + 1


def run_start(tokens: Sequence[int], i: int) -> int:
    """The index where the run holding tokens[i] starts."""
    while continues(tokens, i):
        i -= 1
    return i


def run_end(tokens: Sequence[int], i: int) -> int:
    """The index just past the run holding tokens[i]."""
    i += 1
    while i < len(tokens) and continues(tokens, i):
        i += 1
    return i


def has_media(tokens: Sequence[int]) -> bool:
    return bool(tokens) and min(tokens) < 0


def whole_runs(tokens: Sequence[int], lo: int, hi: int) -> int:
    """A cut point near `hi` for reading tokens[lo:hi] that cuts through no picture: hi
    itself when it falls outside one, else the start of the picture it falls in, or (when
    that picture starts at lo) its end: a picture is read whole, in one step."""
    if hi >= len(tokens) or not continues(tokens, hi):
        return hi
    start = run_start(tokens, hi)
    return start if start > lo else run_end(tokens, hi)
