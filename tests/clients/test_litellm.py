"""litellm's Ollama providers, as aider and every `ollama/` or `ollama_chat/` user of
litellm call them: recorded from litellm 1.110.2 (`litellm.completion(model=
"ollama_chat/...", api_base=...)`) through a recording proxy, 2026-12-04. Its requests
carry no Content-Type at all (user-agent litellm/1.110.2), every message has `images: []`,
`max_tokens` becomes `options.num_predict`, `tool_choice` is dropped, and each answer is
followed by `/api/show` for the model's details.

The no-Content-Type rule (server/guard.py): such a POST is read as JSON when it bears no
browser's signs; a browser's still gets 415 (tests/server/test_security.py).
"""

from __future__ import annotations

import json
from typing import Any

import httpx

from tests.clients.conftest import MODEL

HEADERS = {"accept": "*/*", "user-agent": "litellm/1.110.2"}  # and no content-type
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather now",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}


def post(http: httpx.Client, path: str, body: dict[str, Any]) -> httpx.Response:
    reply = http.post(path, content=json.dumps(body), headers=HEADERS)
    assert "content-type" not in reply.request.headers
    return reply


def test_chat_without_a_content_type(http: httpx.Client):
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Say hi", "images": []}],
            "options": {"num_predict": 8}, "stream": False}
    reply = post(http, "/api/chat", body)
    assert reply.status_code == 200, reply.text
    answer = reply.json()
    assert answer["done"] is True and answer["message"]["content"]
    assert answer["eval_count"] <= 8
    shown = post(http, "/api/show", {"name": MODEL})
    assert shown.status_code == 200, shown.text
    assert shown.json()["details"]["format"] == "gguf"


def test_generate_and_stream_without_a_content_type(http: httpx.Client):
    body = {"model": MODEL, "prompt": "### User:\nSay hi\n\n", "options": {"num_predict": 8},
            "stream": False, "images": []}
    reply = post(http, "/api/generate", body)
    assert reply.status_code == 200, reply.text
    assert reply.json()["response"]
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Say hi", "images": []}],
            "options": {"num_predict": 8}, "stream": True}
    lines = [json.loads(line) for line in post(http, "/api/chat", body).text.splitlines()]
    assert lines[-1]["done"] is True
    assert "".join(line["message"]["content"] for line in lines)


def test_tool_call_through_ollama_chat(http: httpx.Client):
    body = {"model": MODEL,
            "messages": [{"role": "user", "content": "What is the weather in Paris?",
                          "images": []}],
            "options": {"num_predict": 64}, "stream": False, "tools": [WEATHER]}
    reply = post(http, "/api/chat", body)
    assert reply.status_code == 200, reply.text
    message = reply.json()["message"]
    calls = message.get("tool_calls") or []
    # the model may answer in text (tool_choice is not sent); call JSON never is content
    assert "tool_calls" not in message["content"] and '"name"' not in message["content"]
    for call in calls:
        assert call["function"]["name"] == "get_weather"
        assert isinstance(call["function"]["arguments"], dict)


def test_models_loaded_by_path_are_ollama_models(http: httpx.Client):
    """The server's model was loaded with --model PATH: Ollama clients still see it."""
    names = [m["name"] for m in http.get("/api/tags").json()["models"]]
    assert MODEL in names
    assert http.post("/api/show", json={"model": MODEL}).status_code == 200
    http.post("/api/generate", json={"model": MODEL, "prompt": "Hi",
                                     "options": {"num_predict": 1}})
    assert MODEL in [m["name"] for m in http.get("/api/ps").json()["models"]]
    version = http.get("/api/version").json()["version"]
    assert tuple(int(p) for p in version.split(".")) >= (0, 13, 4)  # Codex CLI --oss's floor
