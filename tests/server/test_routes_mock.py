"""The routes over a `Mock(spec=EngineClient)`: what each API's request becomes (the
sampling settings the engine is handed), what the engine's stream becomes on the wire,
and the engine's errors and status as each API says them. In-process and in
milliseconds; the same routes over the real engine are tested against a real server in
the other files here."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from typing import Any
from unittest.mock import Mock

import anthropic
import httpx
import httpx2
import openai
import pytest

from localllm.backends.base import Chunk, GenerationStats, Message, SamplingParams
from localllm.config import Settings
from localllm.engine.client import EngineClient, EngineStatus
from localllm.engine.request import Request
from localllm.engine.stream import END, ChunkStream, Started
from localllm.errors import ModelNotFound
from localllm.server.app import create_app

FINAL = Chunk(
    "",
    (),
    finish_reason="stop",
    stats=GenerationStats(
        prompt_tokens=5, cached_tokens=0, generated_tokens=2, ttft_s=0.01, decode_tps=50.0
    ),
)
HI = {"role": "user", "content": "Hi"}


def answering(*items: Any) -> Any:
    """A submit() that streams `items` (then the end) on the caller's loop."""

    def submit(request: Request) -> ChunkStream:
        stream = ChunkStream(asyncio.get_running_loop(), threading.Event())
        for item in items:
            stream.feed(item)
        stream.feed(END)
        return stream

    return submit


@pytest.fixture
def engine() -> Mock:
    mock = Mock(spec=EngineClient)
    mock.status.return_value = EngineStatus(state="ready")
    mock.remotes.find.return_value = None
    mock.submit.side_effect = answering(
        Started("starter", 5), Chunk("Hel", (1,)), Chunk("lo", (2,)), FINAL
    )
    return mock


@pytest.fixture
def transport(settings: Settings, engine: Mock) -> Iterator[httpx.ASGITransport]:
    yield httpx.ASGITransport(app=create_app(settings, engine))


def handed(engine: Mock) -> Request:
    """The one request the routes handed the engine."""
    engine.submit.assert_called_once()
    request: Request = engine.submit.call_args.args[0]
    return request


async def test_openai_chat_fields_become_the_engines_sampling(
    engine: Mock, transport: httpx.ASGITransport
):
    async with httpx2.AsyncClient(transport=httpx2.ASGITransport(app=transport.app)) as http:
        client = openai.AsyncOpenAI(base_url="http://localhost/v1", api_key="x", http_client=http)
        reply = await client.chat.completions.create(
            model="starter",
            messages=[
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": "Hi"},
            ],
            temperature=0.3,
            top_p=0.5,
            max_tokens=7,
            stop=["END"],
            seed=4,
            presence_penalty=0.25,
            frequency_penalty=0.5,
        )
    assert reply.choices[0].message.content == "Hello"
    assert reply.choices[0].finish_reason == "stop"
    assert reply.usage is not None and (
        reply.usage.prompt_tokens,
        reply.usage.completion_tokens,
    ) == (5, 2)
    request = handed(engine)
    assert request.model == "starter"
    assert request.messages == [Message("system", "Be brief."), Message("user", "Hi")]
    asked = SamplingParams.asked(
        temperature=0.3,
        top_p=0.5,
        max_tokens=7,
        stop=("END",),
        seed=4,
        presence_penalty=0.25,
        frequency_penalty=0.5,
    )
    assert request.params == asked  # the fields a request leaves unset stay unset
    assert request.params.given == asked.given


async def test_openai_streaming_sends_each_chunk(engine: Mock, transport: httpx.ASGITransport):
    async with httpx2.AsyncClient(transport=httpx2.ASGITransport(app=transport.app)) as http:
        client = openai.AsyncOpenAI(base_url="http://localhost/v1", api_key="x", http_client=http)
        stream = await client.chat.completions.create(
            model="starter", messages=[{"role": "user", "content": "Hi"}], stream=True
        )
        pieces = [c.choices[0].delta.content async for c in stream if c.choices]
    assert "".join(p for p in pieces if p) == "Hello"
    assert handed(engine).params == SamplingParams.asked()


async def test_ollama_options_become_the_engines_sampling(
    engine: Mock, transport: httpx.ASGITransport
):
    body = {
        "model": "starter",
        "messages": [{"role": "user", "content": "Hi"}],
        "stream": False,
        "options": {
            "temperature": 0.2,
            "top_k": 12,
            "num_predict": 9,
            "repeat_penalty": 1.2,
            "seed": 7,
            "stop": ["\n\n"],
        },
    }
    async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as http:
        r = await http.post("/api/chat", json=body)
    assert r.status_code == 200, r.text
    assert r.json()["message"]["content"] == "Hello"
    assert handed(engine).params == SamplingParams.asked(
        temperature=0.2, top_k=12, max_tokens=9, repeat_penalty=1.2, seed=7, stop=("\n\n",)
    )


async def test_anthropic_fields_become_the_engines_sampling(
    engine: Mock, transport: httpx.ASGITransport
):
    async with httpx2.AsyncClient(transport=httpx2.ASGITransport(app=transport.app)) as http:
        client = anthropic.AsyncAnthropic(
            base_url="http://localhost", api_key="x", http_client=http
        )
        reply = await client.messages.create(
            model="starter",
            max_tokens=11,
            stop_sequences=["STOP"],
            extra_body={"temperature": 0.4, "top_k": 5},  # no longer parameters of this SDK
            system="Be brief.",
            messages=[{"role": "user", "content": "Hi"}],
        )
    assert reply.content[0].text == "Hello"  # type: ignore[union-attr]
    request = handed(engine)
    assert request.messages is not None and request.messages[0] == Message("system", "Be brief.")
    assert request.params == SamplingParams.asked(
        max_tokens=11, temperature=0.4, top_k=5, stop=("STOP",)
    )


async def test_the_engines_first_error_keeps_its_status(
    engine: Mock, transport: httpx.ASGITransport
):
    """A bad name is resolved on the engine's worker and arrives as the stream's first
    item; each API answers with its 404 and the engine's message."""
    error = ModelNotFound("nope", ["starter"])
    engine.submit.side_effect = answering(error)
    async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as http:
        openai_reply = await http.post(
            "/v1/chat/completions",
            json={"model": "nope", "messages": [{"role": "user", "content": "Hi"}]},
        )
        ollama_reply = await http.post(
            "/api/chat",
            json={
                "model": "nope",
                "messages": [{"role": "user", "content": "Hi"}],
                "stream": False,
            },
        )
    assert openai_reply.status_code == 404 and ollama_reply.status_code == 404
    assert error.message in openai_reply.json()["error"]["message"]
    assert error.message in ollama_reply.json()["error"]


async def test_health_reads_the_status_snapshot(engine: Mock, transport: httpx.ASGITransport):
    engine.status.return_value = EngineStatus(state="loading", queued=3)
    engine.remotes.status.return_value = []
    async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as http:
        r = await http.get("/health")
    assert r.status_code == 503
    assert r.json()["status"] == "loading" and r.json()["queued"] == 3
    engine.submit.assert_not_called()


def test_a_request_that_ended_before_its_first_token_logs_no_time_to_it(engine: Mock):
    """The access log's engine figures for a request that produced nothing (a client that
    left while its prompt was read): no `ttft_s` of 0, which would read as instant."""
    from localllm.server.metrics import Telemetry

    engine.backend_of.return_value = "llamacpp"
    telemetry = Telemetry(engine)
    left = GenerationStats(prompt_tokens=900, cached_tokens=0, generated_tokens=0, ttft_s=0.0,
                           decode_tps=0.0)
    for rid, stats in (("left", left), ("answered", FINAL.stats)):
        request = Request(SamplingParams(), prompt="x", request_id=rid)
        final = Chunk("", (), finish_reason="cancelled" if rid == "left" else "stop", stats=stats)
        telemetry.observe(request, "starter", final, 1.0)
    lines = [{"request_id": rid, "route": "/v1/completions", "status": 200, "model": "starter"}
             for rid in ("left", "answered")]
    for line in lines:
        telemetry.finish(line)
    assert lines[0]["completion_tokens"] == 0 and lines[0]["ttft_s"] is None
    assert lines[1]["ttft_s"] == 0.01
