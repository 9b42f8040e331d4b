"""The endpoint on the MLX backend: `localllm serve --backend mlx` through the `openai` client."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam, ChatCompletionToolParam

from localllm.backends.common import ALIGN
from tests.conftest import ServerProcess, runs_mlx, starts_process, usage_of

pytest.importorskip("mlx.core", reason="the mlx extra is not installed")

ASK: list[ChatCompletionMessageParam] = [
    {"role": "system", "content": "You answer questions about nature briefly. " * 8},
    {"role": "user", "content": "What color is the sky?"},
]


@pytest.fixture(scope="module")
@starts_process
@runs_mlx
def mlx_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """The starter model served on MLX: the GGUF is imported into the server's store first."""
    srv = ServerProcess(tmp_path_factory.mktemp("mlx-server"), "--backend", "mlx", "--ctx", "512")
    yield srv
    srv.stop()


def test_chat_on_mlx(mlx_server: ServerProcess):
    client = openai.OpenAI(base_url=mlx_server.base + "/v1", api_key="unused", max_retries=0)
    assert "starter" in [m.id for m in client.models.list()]
    full = client.chat.completions.create(model="starter", messages=ASK, max_tokens=8,
                                          temperature=0)
    text = full.choices[0].message.content
    assert text and "sky" in text.lower()
    assert usage_of(full).completion_tokens == 8 and full.choices[0].finish_reason == "length"
    parts: list[str] = []
    usage = None
    for ev in client.chat.completions.create(model="starter", messages=ASK, max_tokens=8,
                                             temperature=0, stream=True,
                                             stream_options={"include_usage": True}):
        usage = ev.usage or usage
        parts.extend(ch.delta.content or "" for ch in ev.choices)
    assert "".join(parts) == text  # streamed and whole answers agree
    assert usage is not None and usage.prompt_tokens == usage_of(full).prompt_tokens
    assert usage.prompt_tokens > ALIGN
    # the same prompt again: all of it from the KV cache, the logits of its last token too
    assert usage.prompt_tokens_details is not None
    assert usage.prompt_tokens_details.cached_tokens == usage.prompt_tokens
    follow: list[ChatCompletionMessageParam] = [
        *ASK, {"role": "assistant", "content": text}, {"role": "user", "content": "Why?"}]
    turn = client.chat.completions.create(model="starter", messages=follow, max_tokens=2,
                                          temperature=0)
    details = usage_of(turn).prompt_tokens_details  # a follow-up reads only what is new
    assert details is not None and details.cached_tokens >= usage.prompt_tokens
    health = mlx_server.health()
    assert health["status"] == "ok"
    imported = Path(mlx_server.log.parent, "data", "models", "starter-mlx")
    assert (imported / "localllm.json").is_file()  # imported once, into the store


def test_errors_keep_the_openai_shape_on_mlx(mlx_server: ServerProcess):
    client = openai.OpenAI(base_url=mlx_server.base + "/v1", api_key="unused", max_retries=0)
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(
            model="starter", messages=[{"role": "user", "content": "word " * 600}], max_tokens=4
        )
    assert err.value.code == "context_length_exceeded"
    assert "512" in err.value.message


def test_constrained_output_on_mlx(mlx_server: ServerProcess):
    """A JSON schema and a required tool call hold on the MLX backend too."""
    import json

    import jsonschema

    client = openai.OpenAI(base_url=mlx_server.base + "/v1", api_key="unused", max_retries=0)
    schema: dict[str, object] = {
        "type": "object",
        "properties": {"color": {"enum": ["blue", "grey", "red"]},
                       "why": {"type": "string", "maxLength": 40}},
        "required": ["color", "why"],
    }
    r = client.chat.completions.create(
        model="starter", messages=ASK, temperature=0.7, seed=1, max_tokens=60,
        response_format={"type": "json_schema", "json_schema": {"name": "c", "schema": schema}},
        logprobs=True)
    assert r.choices[0].finish_reason == "stop"
    content, logprobs = r.choices[0].message.content, r.choices[0].logprobs
    assert content is not None and logprobs is not None and logprobs.content is not None
    jsonschema.validate(json.loads(content), schema)
    assert len(logprobs.content) == usage_of(r).completion_tokens
    topic: dict[str, object] = {"type": "object",
                                "properties": {"topic": {"type": "string", "maxLength": 30}},
                                "required": ["topic"]}
    tools: list[ChatCompletionToolParam] = [
        {"type": "function", "function": {"name": "look_up", "parameters": topic}}
    ]
    call = client.chat.completions.create(
        model="starter", messages=ASK, tools=tools, tool_choice="required",
        parallel_tool_calls=False, temperature=0, max_tokens=60)
    assert call.choices[0].finish_reason == "tool_calls"
    (made,) = call.choices[0].message.tool_calls or []
    assert made.type == "function" and made.function.name == "look_up"
    assert "topic" in json.loads(made.function.arguments)


def test_embeddings_and_reranking_refused_on_mlx(mlx_server: ServerProcess):
    import httpx

    r = httpx.post(mlx_server.base + "/v1/embeddings", json={"model": "starter", "input": "hi"},
                   timeout=60)
    assert r.status_code == 400 and r.json()["error"]["code"] == "embeddings_not_supported"
    assert "mlx-lm cannot compute embeddings" in r.json()["error"]["message"]
    r = httpx.post(mlx_server.base + "/v1/rerank",
                   json={"model": "starter", "query": "q", "documents": ["a", "b"]}, timeout=60)
    assert r.status_code == 400 and r.json()["error"]["code"] == "rerank_not_supported"
    assert "GGUF reranker" in r.json()["error"]["message"]
