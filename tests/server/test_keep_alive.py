"""A streamed answer whose prompt takes long to read says it is still coming: a keep-alive
frame after each quiet interval (Node's HTTP client, which Claude Code uses, dropped a
body quiet for 300 s while a 20,000-token prompt was read on two cores, then sent the
request again). The scripted model holds its first step at a gate, standing for the long
prefill; the server is the real one, in a thread; the official SDKs read the streams."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import httpx2
import openai
import pytest

from localllm.backends.fake import FakeBackend, Gate, Script, write_fake_model
from localllm.config import Settings
from localllm.engine.accounting import Accounting
from localllm.engine.engine import Engine
from localllm.server import framing
from localllm.server.runner import BackgroundEndpoint
from tests.conftest import free_port


@dataclasses.dataclass
class Served:
    base: str
    gate: Gate


@pytest.fixture
def served(
    settings: Settings, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest
) -> Iterator[Served]:
    monkeypatch.setattr(framing, "KEEP_ALIVE_S", 0.05)
    write_fake_model(settings.models_dir / "scripted.gguf")
    chosen = dataclasses.replace(settings, model="scripted", port=free_port(), parallel=1)
    gate = Gate()
    fail_at = getattr(request, "param", None)  # the step that fails, if one does
    script = Script(reply="Still here.", gate=gate, fail_at=fail_at)
    engine = Engine(chosen, backends=[FakeBackend(script)])
    endpoint = BackgroundEndpoint(chosen, engine, Accounting.for_settings(chosen))
    assert endpoint.error is None, endpoint.error
    try:
        yield Served(endpoint.url.rsplit("/v1", 1)[0], gate)
    finally:
        gate.open()
        endpoint.stop()
        engine.close()


ROUTES = [  # route, body, its keep-alive frame, the frame that ends its stream
    (
        "/v1/chat/completions",
        {"messages": [{"role": "user", "content": "Hi"}]},
        b": keep-alive",
        b"data: [DONE]",
    ),
    ("/v1/responses", {"input": "Hi"}, b": keep-alive", b"event: response.completed"),
    (
        "/v1/messages",
        {"max_tokens": 32, "messages": [{"role": "user", "content": "Hi"}]},
        b'event: ping\ndata: {"type":"ping"}',
        b"event: message_stop",
    ),
]


@pytest.mark.parametrize(("route", "body", "beat", "last"), ROUTES, ids=[r[0] for r in ROUTES])
def test_a_long_prompt_read_sends_keep_alives_then_the_answer(
    served: Served, route: str, body: dict, beat: bytes, last: bytes
) -> None:
    payload = {"model": "scripted", "stream": True, "temperature": 0, **body}
    received = b""
    with httpx.stream("POST", served.base + route, json=payload, timeout=30) as reply:
        assert reply.status_code == 200  # the headers came before the prompt was read
        for piece in reply.iter_raw():
            received += piece
            if received.count(beat) == 3:
                served.gate.open()  # the prompt is read: the answer comes
    frames = [f for f in received.split(b"\n\n") if f.strip()]
    first = next(i for i, f in enumerate(frames) if f != beat)
    assert first >= 3 and frames[:first] == [beat] * first  # while the prompt was read
    assert beat not in frames[first:]  # none once the answer flows (its frames are close)
    assert frames[-1].startswith(last)


@dataclasses.dataclass
class _Tap:
    """What an SDK read of one answer (the bytes, as they came); the gate opens once
    `beats` keep-alive frames came (the prompt is then read)."""

    gate: Gate
    beat: bytes
    beats: int = 3
    seen: bytes = b""

    def client(self, http: Any) -> Any:
        """An HTTP client of `http` (httpx, or httpx2 for the anthropic SDK) through the tap."""
        tap = self

        class Transport(http.BaseTransport):
            inner = http.HTTPTransport()

            def handle_request(self, request: Any) -> Any:
                response = self.inner.handle_request(request)

                class Stream(http.SyncByteStream):
                    def __iter__(self) -> Iterator[bytes]:
                        for piece in response.stream:
                            tap.seen += piece
                            if tap.seen.count(tap.beat) >= tap.beats:
                                tap.gate.open()
                            yield piece

                    def close(self) -> None:
                        response.close()

                return http.Response(
                    response.status_code,
                    headers=response.headers,
                    stream=Stream(),
                    extensions=response.extensions,
                )

        return http.Client(transport=Transport(), timeout=30)


@pytest.mark.parametrize("sdk", ["openai", "anthropic"])
def test_the_official_sdks_read_a_stream_with_keep_alives(served: Served, sdk: str) -> None:
    if sdk == "openai":
        tap = _Tap(served.gate, b": keep-alive")
        chat = openai.OpenAI(
            base_url=served.base + "/v1", api_key="x", http_client=tap.client(httpx)
        ).chat.completions.create(
            model="scripted", messages=[{"role": "user", "content": "Hi"}], stream=True
        )
        text = "".join(c.choices[0].delta.content or "" for c in chat if c.choices)
    else:
        tap = _Tap(served.gate, b"event: ping")
        client = anthropic.Anthropic(
            base_url=served.base, api_key="x", http_client=tap.client(httpx2)
        )
        with client.messages.stream(
            model="scripted", max_tokens=32, messages=[{"role": "user", "content": "Hi"}]
        ) as stream:
            text = "".join(stream.text_stream)
    assert text == "Still here."
    assert tap.seen.count(tap.beat) >= 3  # the SDK read past the keep-alives to the answer


@pytest.mark.parametrize("served", [1], indirect=True)
def test_a_failure_after_the_headers_went_out_is_the_api_s_error_frame(served: Served) -> None:
    payload = {"model": "scripted", "stream": True, "messages": [{"role": "user", "content": "Hi"}]}
    received = b""
    with httpx.stream("POST", served.base + "/v1/chat/completions", json=payload) as reply:
        assert reply.status_code == 200
        for piece in reply.iter_raw():
            received += piece
            if received.count(b": keep-alive") == 2:
                served.gate.open()  # the prompt is read, and its first token fails
    frames = [f for f in received.split(b"\n\n") if f.strip()]
    assert frames[:2] == [b": keep-alive"] * 2 and frames[-1] == b"data: [DONE]"
    error = json.loads(frames[-2].removeprefix(b"data: "))["error"]
    assert error["message"] and error["type"]
