"""Images through every API, on the starter with a tiny random-weight projector beside it
in the store (tests/gguf_fixtures.py): OpenAI image_url parts, Ollama's images, Anthropic
image blocks and the Responses API's input_image, counted in the usage, reused from the
prompt cache by the picture's hash, shown as a capability; and the bad input (no
projector, not an image, too many pixels, URLs while offline, audio to a projector that
reads none) refused by name."""

from __future__ import annotations

import base64
import json
import struct
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest

from localllm.backends.base import ModelRef
from localllm.models.starter import starter_path
from tests.conftest import ServerProcess, starts_process
from tests.gguf_fixtures import (
    noise_png,
    tiny_audio_projector,
    tiny_llava_mlx,
    tiny_projector,
    tone_wav,
    vision_folder,
)

PNG = base64.b64encode(noise_png(seed=0)).decode()
OTHER = base64.b64encode(noise_png(seed=1)).decode()


@pytest.fixture(scope="module")
@starts_process
def seer(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    tmp = tmp_path_factory.mktemp("vision-server")
    vision_folder(tmp / "data" / "models")
    hearer = tmp / "data" / "models" / "hearer"  # the starter with an audio projector
    hearer.mkdir()
    starter = starter_path()
    assert starter is not None
    (hearer / "hearer.gguf").symlink_to(starter)
    tiny_audio_projector(hearer / "mmproj-hearer-f16.gguf")
    srv = ServerProcess(tmp, "--model", "seer")
    yield srv
    srv.stop()


def _ask(srv: ServerProcess, image: str | None, **extra: Any) -> dict[str, Any]:
    parts: list[dict[str, Any]] = [{"type": "text", "text": "What is in this picture?"}]
    if image is not None:
        parts.append({"type": "image_url", "image_url": {"url": f"data:image/png;base64,{image}"}})
    body = {"model": "seer", "messages": [{"role": "user", "content": parts}],
            "temperature": 0, "max_tokens": 4, **extra}  # `model` in extra replaces it
    r = httpx.post(srv.base + "/v1/chat/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    return dict(r.json())


def picture_kept(usage: dict[str, Any]) -> bool:
    """Whether a greedy rerun of a prompt ending in a picture and the template's last
    tokens found the picture's KV and the logits its first run sampled from: it reads
    nothing, the picture's 16 tokens included."""
    n, cached = usage["prompt_tokens"], usage["prompt_tokens_details"]["cached_tokens"]
    return bool(cached == n)


def test_an_image_is_read_counted_and_reused_from_the_prompt_cache(seer: ServerProcess):
    plain = _ask(seer, None)["usage"]["prompt_tokens"]
    first = _ask(seer, PNG, logprobs=True)
    usage = first["usage"]
    assert usage["prompt_tokens"] == plain + 16  # the projector's 16 tokens per picture
    again = _ask(seer, PNG, logprobs=True)
    assert picture_kept(again["usage"])  # the picture's KV was kept by its hash
    assert again["choices"][0]["message"] == first["choices"][0]["message"]
    other = _ask(seer, OTHER, logprobs=True)
    assert other["usage"]["prompt_tokens"] == usage["prompt_tokens"]
    # another picture: the cache gives back only the text before it
    assert other["usage"]["prompt_tokens_details"]["cached_tokens"] < plain
    first_lp = first["choices"][0]["logprobs"]["content"][0]["logprob"]
    other_lp = other["choices"][0]["logprobs"]["content"][0]["logprob"]
    assert first_lp != other_lp  # the picture reached the model


def test_the_official_clients_send_images_through_each_api(seer: ServerProcess):
    """Each API's request with the picture reads the projector's 16 tokens more than the
    same request without it (the text around its place may tokenize one token apart)."""
    client = openai.OpenAI(base_url=seer.base + "/v1", api_key="none")
    claude = anthropic.Anthropic(base_url=seer.base, api_key="none")
    image_url = {"url": f"data:image/png;base64,{PNG}", "detail": "low"}
    claude_image = {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                                "data": PNG}}

    def openai_chat(image: bool) -> int:
        parts: list[Any] = [{"type": "text", "text": "Describe it."}]
        parts += [{"type": "image_url", "image_url": image_url}] if image else []
        out = client.chat.completions.create(
            model="seer", max_tokens=3, temperature=0,
            messages=[{"role": "user", "content": parts}])
        assert out.usage is not None
        return out.usage.prompt_tokens

    def anthropic_messages(image: bool) -> int:
        blocks: list[Any] = [claude_image] if image else []
        msg = claude.messages.create(model="seer", max_tokens=3, messages=[
            {"role": "user", "content": [*blocks, {"type": "text", "text": "Describe it."}]}])
        return msg.usage.input_tokens + (msg.usage.cache_read_input_tokens or 0)

    def ollama(path: str, image: bool) -> int:
        body: dict[str, Any] = {"model": "seer", "stream": False, "options": {"num_predict": 3}}
        if path == "/api/chat":
            body["messages"] = [{"role": "user", "content": "Describe it.",
                                 "images": [PNG] if image else []}]
        else:
            body |= {"prompt": "Describe it.", "images": [PNG] if image else []}
        r = httpx.post(seer.base + path, json=body, timeout=120)
        assert r.status_code == 200, r.text
        return int(r.json()["prompt_eval_count"])

    def responses(image: bool) -> int:
        parts: list[Any] = [{"type": "input_text", "text": "Describe it."}]
        parts += [{"type": "input_image", "image_url": image_url["url"]}] if image else []
        r = httpx.post(seer.base + "/v1/responses", json={
            "model": "seer", "max_output_tokens": 3,
            "input": [{"role": "user", "content": parts}]}, timeout=120)
        assert r.status_code == 200, r.text
        return int(r.json()["usage"]["input_tokens"])

    for name, count in [("openai", openai_chat), ("anthropic", anthropic_messages),
                        ("ollama chat", lambda i: ollama("/api/chat", i)),
                        ("ollama generate", lambda i: ollama("/api/generate", i)),
                        ("responses", responses)]:
        grown = count(True) - count(False)
        assert 16 <= grown <= 17, (name, grown)


def test_the_lists_say_vision(seer: ServerProcess):
    r = httpx.post(seer.base + "/api/show", json={"model": "seer"}, timeout=30)
    assert "vision" in r.json()["capabilities"]
    r = httpx.post(seer.base + "/api/show", json={"model": "starter"}, timeout=30)
    assert "vision" not in r.json()["capabilities"]
    rows = {m["id"]: m for m in httpx.get(seer.base + "/v1/models", timeout=30).json()["data"]}
    assert "vision" in rows["seer"]["capabilities"]
    assert "vision" not in rows["starter"]["capabilities"]


def _huge_png(width: int, height: int) -> bytes:
    """A PNG whose header claims width x height (its pixel data is never read)."""
    head = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    chunk = b"IHDR" + head
    ihdr = struct.pack(">I", len(head)) + chunk + struct.pack(">I", zlib.crc32(chunk))
    return b"\x89PNG\r\n\x1a\n" + ihdr + noise_png()[33:]


def test_bad_images_are_refused_by_name(seer: ServerProcess):
    def refused(model: str, part: dict[str, Any]) -> dict[str, Any]:
        body = {"model": model, "max_tokens": 2,
                "messages": [{"role": "user", "content": [{"type": "text", "text": "x"}, part]}]}
        r = httpx.post(seer.base + "/v1/chat/completions", json=body, timeout=120)
        assert r.status_code == 400, r.text
        return dict(r.json()["error"])

    def url(data: bytes, mime: str = "image/png") -> dict[str, Any]:
        encoded = base64.b64encode(data).decode()
        return {"type": "image_url", "image_url": {"url": f"data:{mime};base64,{encoded}"}}

    err = refused("starter", url(noise_png()))
    assert err["code"] == "vision_not_supported" and "--mmproj" in err["message"]
    # round 4: six 6300x6300 PNGs to a model with no projector were decoded (1.1 GB)
    # before the 400; it is known first now, and nothing is decoded (these headers promise
    # pixels that never come: decoding them would be a different error)
    huge = url(_huge_png(6300, 6300))
    err = refused("starter", huge)
    assert err["code"] == "vision_not_supported", err
    r = httpx.post(seer.base + "/api/chat", timeout=60, json={
        "model": "starter", "stream": False, "messages": [
            {"role": "user", "content": "x", "images": [huge["image_url"]["url"][22:]] * 6}]})
    assert r.status_code == 400 and "cannot read images" in r.json()["error"], r.text
    err = refused("seer", url(b"plain text, not a picture"))
    assert err["code"] == "unsupported_media" and "not an image" in err["message"]
    err = refused("seer", url(_huge_png(9000, 9000)))
    assert err["code"] == "media_too_large" and "9000x9000" in err["message"]
    assert "40,000,000" in err["message"]
    err = refused("seer", {"type": "image_url", "image_url": {"url": "http://example.invalid/a.png"}})
    assert err["code"] == "image_url_not_allowed" and "fetch_image_urls" in err["message"]
    err = refused("seer", {"type": "image_url", "image_url": {"url": "data:image/png,abc"}})
    assert "data URL" in err["message"]
    wav = b"RIFF\x24\x00\x00\x00WAVEfmt " + bytes(28)
    audio = {"type": "input_audio", "input_audio": {"data": base64.b64encode(wav).decode(),
                                                    "format": "wav"}}
    err = refused("seer", audio)
    assert err["code"] == "audio_not_supported"
    bad = {"type": "input_audio", "input_audio": {"data": PNG, "format": "wav"}}
    assert refused("seer", bad)["code"] == "unsupported_media"
    r = httpx.post(seer.base + "/api/generate", timeout=60, json={
        "model": "seer", "prompt": "x", "images": ["AAAA"], "stream": False})
    assert r.status_code == 400 and "not an image" in r.json()["error"], r.text
    r = httpx.post(seer.base + "/api/generate", json={
        "model": "seer", "prompt": "x", "raw": True, "images": [PNG], "stream": False},
        timeout=60)
    assert r.status_code == 400 and "raw" in r.json()["error"]
    # the server still answers afterwards
    assert _ask(seer, PNG)["choices"][0]["finish_reason"] in ("stop", "length")


@pytest.mark.process
def test_images_reach_a_remote_engine_as_they_came(seer: ServerProcess, tmp_path: Path):
    """localllm in front of another engine (here the vision server) sends the picture on
    as an image_url part: the remote reads it (its 16 tokens counted there)."""
    remotes = [{"name": "eyes", "url": seer.base + "/v1", "models": ["seer"]}]
    front = ServerProcess(tmp_path, env={"LOCALLLM_REMOTES": json.dumps(remotes)})
    try:
        direct = _ask(seer, PNG)["usage"]["prompt_tokens"]
        body = {"model": "eyes/seer", "max_tokens": 2, "temperature": 0, "messages": [
            {"role": "user", "content": [
                {"type": "text", "text": "What is in this picture?"},
                {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PNG}"}}]}]}
        r = httpx.post(front.base + "/v1/chat/completions", json=body, timeout=120)
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["prompt_tokens"] == direct
    finally:
        front.stop()


@pytest.mark.process
def test_an_mlx_vision_model_reads_images_through_the_same_api(
    starter_mlx_ref: ModelRef, tmp_path: Path
):
    pytest.importorskip("mlx_vlm")
    tiny_llava_mlx(tmp_path / "data" / "models" / "tiny-llava", starter_mlx_ref.path)
    srv = ServerProcess(tmp_path, "--model", "tiny-llava")
    try:
        plain = _ask(srv, None, model="tiny-llava")["usage"]["prompt_tokens"]
        first = _ask(srv, PNG, model="tiny-llava")
        assert first["usage"]["prompt_tokens"] == plain + 16
        assert picture_kept(_ask(srv, PNG, model="tiny-llava")["usage"])
        r = httpx.post(srv.base + "/api/show", json={"model": "tiny-llava"}, timeout=30)
        assert "vision" in r.json()["capabilities"]
    finally:
        srv.stop()


@pytest.mark.process
@pytest.mark.model
def test_mmproj_names_the_projector_and_urls_are_fetched_when_allowed(tmp_path: Path):
    """`--mmproj FILE` gives the starter its projector (listed as vision once loaded), and
    with fetch_image_urls an http image URL is fetched (here from a loopback server)."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Picture(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def do_GET(self) -> None:
            body = noise_png() if self.path == "/cat.png" else b""
            self.send_response(200 if body else 404)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    pictures = ThreadingHTTPServer(("127.0.0.1", 0), Picture)
    threading.Thread(target=pictures.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{pictures.server_address[1]}"
    proj = tiny_projector(tmp_path / "proj.gguf")
    srv = ServerProcess(tmp_path, "--mmproj", str(proj),
                        env={"LOCALLLM_FETCH_IMAGE_URLS": "true"})
    try:
        rows = {m["id"]: m for m in httpx.get(srv.base + "/v1/models", timeout=30).json()["data"]}
        assert "vision" in rows["starter"]["capabilities"]
        body = {"model": "starter", "max_tokens": 2, "messages": [{"role": "user", "content": [
            {"type": "text", "text": "What is in this picture?"},
            {"type": "image_url", "image_url": {"url": url + "/cat.png"}}]}]}
        r = httpx.post(srv.base + "/v1/chat/completions", json=body, timeout=120)
        assert r.status_code == 200, r.text
        as_data = _ask(srv, base64.b64encode(noise_png()).decode(), model="starter")
        plain = _ask(srv, None, model="starter")["usage"]["prompt_tokens"]
        assert r.json()["usage"]["prompt_tokens"] == plain + 16  # the fetched picture read
        body["messages"] = [{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": url + "/gone.png"}},
            {"type": "text", "text": "x"}]}]
        r = httpx.post(srv.base + "/v1/chat/completions", json=body, timeout=120)
        assert r.status_code == 400 and "HTTP 404" in r.json()["error"]["message"]
        assert picture_kept(as_data["usage"])  # the same picture as a data URL: its KV kept
    finally:
        srv.stop()
        pictures.shutdown()


def test_audio_goes_in_as_input_audio_and_ollama_images(seer: ServerProcess):
    wav = base64.b64encode(tone_wav()).decode()

    def ask(content: list[dict[str, Any]]) -> dict[str, Any]:
        body = {"model": "hearer", "max_tokens": 2, "temperature": 0,
                "messages": [{"role": "user", "content": content}]}
        r = httpx.post(seer.base + "/v1/chat/completions", json=body, timeout=300)
        assert r.status_code == 200, r.text
        return dict(r.json()["usage"])

    text = {"type": "text", "text": "What is this sound?"}
    plain = ask([text])["prompt_tokens"]
    clip = {"type": "input_audio", "input_audio": {"data": wav, "format": "wav"}}
    heard = ask([clip, text])
    # 750 embeddings for its 30-second window, and the model's two audio markers
    assert heard["prompt_tokens"] - plain >= 750
    r = httpx.post(seer.base + "/api/chat", json={
        "model": "hearer", "stream": False, "options": {"num_predict": 2, "temperature": 0},
        "messages": [{"role": "user", "content": "What is this sound?", "images": [wav]}]},
        timeout=300)
    assert r.status_code == 200, r.text
    assert r.json()["prompt_eval_count"] == heard["prompt_tokens"]
    r = httpx.post(seer.base + "/api/show", json={"model": "hearer"}, timeout=30)
    assert "audio" in r.json()["capabilities"] and "vision" not in r.json()["capabilities"]


def test_a_picture_in_a_tool_result_reaches_the_model(seer: ServerProcess):
    """Claude Code's screenshots come back as image blocks inside tool_result; the
    starter's template has no tool format, so the results become a user turn (generic
    format) and the picture goes with it."""
    tool = {"name": "screenshot", "description": "Take a screenshot",
            "input_schema": {"type": "object", "properties": {}}}
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                         "data": PNG}}

    def count(result: list[dict[str, Any]]) -> int:
        body = {"model": "seer", "tools": [tool], "messages": [
            {"role": "user", "content": "What is on my screen?"},
            {"role": "assistant", "content": [
                {"type": "tool_use", "id": "toolu_1", "name": "screenshot", "input": {}}]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1", "content": result}]}]}
        r = httpx.post(seer.base + "/v1/messages/count_tokens", json=body, timeout=120)
        assert r.status_code == 200, r.text
        return int(r.json()["input_tokens"])

    text = {"type": "text", "text": "Here it is."}
    # the picture's 16 tokens (the text around its place may tokenize one token apart)
    assert 16 <= count([image, text]) - count([text]) <= 17
