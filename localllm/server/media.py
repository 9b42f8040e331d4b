"""Images and audio as the APIs send them: data URLs, base64 strings and, when the user
allowed it, http(s) URLs, turned into checked `Media` (backends/media.py) and placed in a
message's text by MEDIA_MARKER. Every API's schemas use these."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable, Mapping
from typing import TypeVar

import httpx
from starlette.requests import Request

from localllm.backends import media
from localllm.backends.base import MEDIA_MARKER, Media
from localllm.errors import InvalidRequest, LocalLLMError
from localllm.models import projector

T = TypeVar("T")
FETCH_TIMEOUT_S = 30.0
Fetched = Mapping[str, bytes]  # an http(s) URL -> the bytes fetched for it


def is_remote(url: str) -> bool:
    return url.lower().startswith(("http://", "https://"))


def image_from_url(url: str, *, param: str, fetched: Fetched) -> Media:
    """An image given as a data URL, or an http(s) URL fetched before (`fetch`)."""
    if is_remote(url):
        if url not in fetched:  # fetch() ran first and refused, or the caller skipped it
            raise not_fetched(param)
        return media.image(fetched[url], param=param)
    _mime, data = media.data_url(url, param=param)
    return media.image(data, param=param)


def not_fetched(param: str) -> InvalidRequest:
    return InvalidRequest(
        f"{param} is an http(s) URL, and localllm fetches none unless allowed (it works "
        "offline): send the image as a data URL (data:image/png;base64,...), or set "
        "fetch_image_urls = true in the config",
        param=param,
        code="image_url_not_allowed",
    )


async def fetch(urls: Iterable[str], *, allowed: bool) -> dict[str, bytes]:
    """The bytes behind each http(s) URL (at most MAX_MEDIA_BYTES each, all of them within
    FETCH_TIMEOUT_S in total: a server that sends a byte every few seconds is not waited
    for); InvalidRequest naming the URL when fetching is off or it fails."""
    wanted = list(dict.fromkeys(u for u in urls if is_remote(u)))
    if not wanted:
        return {}
    if not allowed:
        raise not_fetched("image_url")
    out: dict[str, bytes] = {}
    loop = asyncio.get_running_loop()
    deadline = loop.time() + FETCH_TIMEOUT_S
    async with httpx.AsyncClient(timeout=FETCH_TIMEOUT_S, follow_redirects=True) as client:
        for url in wanted:
            try:
                out[url] = await asyncio.wait_for(_get(client, url), deadline - loop.time())
            except asyncio.TimeoutError:
                raise InvalidRequest(
                    f"fetching the image at {url} took over {FETCH_TIMEOUT_S:g} s",
                    param="image_url",
                    code="image_url_timeout",
                ) from None
    return out


async def _get(client: httpx.AsyncClient, url: str) -> bytes:
    try:
        async with client.stream("GET", url) as response:
            if response.status_code != 200:
                raise InvalidRequest(
                    f"fetching the image at {url} answered HTTP {response.status_code}",
                    param="image_url",
                )
            data = bytearray()
            async for piece in response.aiter_bytes():
                data += piece
                if len(data) > media.MAX_MEDIA_BYTES:
                    raise InvalidRequest(
                        f"the image at {url} is over {media.MAX_MEDIA_BYTES:,} bytes",
                        param="image_url",
                        code="media_too_large",
                    )
            return bytes(data)
    except httpx.HTTPError as exc:
        raise InvalidRequest(
            f"could not fetch the image at {url}: {exc}", param="image_url"
        ) from None


async def off_loop(
    build: Callable[[], T], request: Request | None = None, model: str | None = None
) -> T:
    """`build()` (a request's messages, pictures decoded) on a worker thread: a large
    picture takes Pillow up to a second, which no other client's stream should wait for.
    Its pictures share one pixel budget (media.pixel_budget), and with the `request` and
    its `model`, a model known to read no pictures refuses the first before decoding it."""
    refused = None if request is None else _no_pictures(request, model)

    def bounded() -> T:
        with media.pixel_budget(refused=refused):
            return build()

    return await asyncio.to_thread(bounded)


def _no_pictures(request: Request, model: str | None) -> InvalidRequest | None:
    """The error for a picture sent to `model`, when it is known before loading it that
    the model reads none: a local GGUF with no projector beside it, not loaded with one,
    and no projector set in the config or remote route that could change that."""
    settings, engine = request.app.state.settings, request.app.state.engine
    if settings.mmproj or settings.routes:
        return None
    try:
        if engine.remotes.find(model) is not None:
            return None
        ref = engine.resolve(model or settings.model, paths=False)
        rows = [r for r in engine.status().resident() if r["model"] == ref.name]
    except LocalLLMError:  # not found here: the engine says so when it is asked
        return None
    if ref.format != "gguf" or any(r["media"] for r in rows) or projector.kinds(ref.path):
        return None
    return InvalidRequest(
        f"{ref.name} cannot read images: it has no projector: put the model's mmproj GGUF "
        "beside it (mmproj-*.gguf, which `localllm pull` fetches with the model), or load "
        "it with --mmproj FILE",
        param="messages",
        code="vision_not_supported",
    )


async def prefetch(request: Request, urls: Iterable[str]) -> dict[str, bytes]:
    """`fetch` under the server's setting (fetch_image_urls)."""
    return await fetch(urls, allowed=bool(request.app.state.settings.fetch_image_urls))


def check_text(text: str, *, param: str) -> str:
    """Text from a client, refused if it carries our marker (it would place a picture)."""
    if MEDIA_MARKER in text:
        raise InvalidRequest(
            f"{param} contains {MEDIA_MARKER!r}, which localllm reserves", param=param
        )
    return text


def base64_media(items: Iterable[str], *, param: str) -> tuple[Media, ...]:
    """Ollama's `images`: base64 strings of images (or audio files)."""
    return tuple(
        media.from_bytes(media.decode_base64(text, param=f"{param}[{i}]"), param=f"{param}[{i}]")
        for i, text in enumerate(items)
    )


def audio_part(data: str, fmt: str | None, *, param: str) -> Media:
    """OpenAI's `input_audio` part: base64 data and its format (wav or mp3)."""
    return media.audio(media.decode_base64(data, param=param), param=param, declared=fmt)


def image_source(source: Mapping[str, object], *, param: str, fetched: Fetched) -> Media:
    """Anthropic's image `source`: {type: base64, media_type, data} or {type: url, url}."""
    kind = source.get("type")
    if kind == "base64" and isinstance(source.get("data"), str):
        return media.image(media.decode_base64(str(source["data"]), param=param), param=param)
    if kind == "url" and isinstance(source.get("url"), str):
        return image_from_url(str(source["url"]), param=param, fetched=fetched)
    raise InvalidRequest(
        f"{param}: an image source of type {kind!r} is not read; send base64 data or a URL",
        param=param,
    )
