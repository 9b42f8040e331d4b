"""Zed's Ollama provider, replayed: zed-industries/zed, crates/ollama/src/ollama.rs at
commit 2703b3085141a7d5cdbf7055bcd06c85730391e0. Its `ChatRequest` serializes every
field, so unset options arrive as JSON null (`num_predict`, `stop`, `top_p`), `think` is
null unless the model thinks, `tools` is always a list, `keep_alive` is -1 (indefinite),
an assistant message carries `tool_calls: null` and `thinking: null`, and a request with
tools is sent with `stream: false` (ChatRequest::with_tools). Models are listed with
`/api/tags` and their capabilities read from `/api/show` with `{"model": ...}`.
"""

from __future__ import annotations

import json
from typing import Any

import httpx

from tests.clients.conftest import MODEL

HEADERS = {"Content-Type": "application/json"}
OPTIONS = {"num_ctx": 4096, "num_predict": None, "stop": None, "temperature": 0.0,
           "top_p": None}
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather now",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}


def chat(messages: list[Any], **over: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": messages, "stream": True, "keep_alive": -1,
            "options": {**OPTIONS, "num_predict": 24}, "tools": [], "think": None, **over}


def test_models_and_capabilities(http: httpx.Client):
    listing = http.get("/api/tags", headers={"Accept": "application/json"}).json()
    model = next(m for m in listing["models"] if m["name"] == MODEL)
    assert {"modified_at", "size", "digest", "details"} <= set(model)
    assert {"format", "family", "parameter_size", "quantization_level"} <= set(model["details"])
    shown = http.post("/api/show", json={"model": MODEL}, headers=HEADERS).json()
    assert "tools" in shown["capabilities"]


def test_streamed_chat_with_nulls(http: httpx.Client):
    messages = [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello!", "tool_calls": None, "thinking": None},
        {"role": "user", "content": "Name a colour."},
    ]
    reply = http.post("/api/chat", json=chat(messages), headers=HEADERS)
    assert reply.status_code == 200, reply.text
    lines = [json.loads(line) for line in reply.text.splitlines()]
    assert lines[-1]["done"] is True and lines[-1]["eval_count"] <= 24
    assert "".join(line["message"]["content"] for line in lines)


def test_tool_round_trip(http: httpx.Client):
    ask = [{"role": "user", "content": "What is the weather in Paris?"}]
    first = http.post("/api/chat", json=chat(ask, stream=False, tools=[WEATHER],
                                             options={**OPTIONS, "num_predict": 64}),
                      headers=HEADERS)
    assert first.status_code == 200, first.text
    message = first.json()["message"]
    assert '"name"' not in message["content"]  # a call is never text
    history = [*ask,
               {"role": "assistant", "content": "", "thinking": None,
                "tool_calls": [{"function": {"name": "get_weather",
                                             "arguments": {"city": "Paris"}}}]},
               {"role": "tool", "tool_name": "get_weather", "content": "18 C, sunny"}]
    second = http.post("/api/chat", json=chat(history, stream=False, tools=[WEATHER],
                                              options={**OPTIONS, "num_predict": 48}),
                       headers=HEADERS)
    assert second.status_code == 200, second.text
    answer = second.json()["message"]
    assert answer["content"] or answer.get("tool_calls")
