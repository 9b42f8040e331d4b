"""Continue's own requests, replayed: continuedev/continue at commit
d0a3c0b626b5bebc3bef4742eec05a0242be0bab (2026-06-18).

- core/llm/openaiTypeConverters.ts toChatBody / toCompleteBody: chat and legacy
  completions on the OpenAI provider (stream true by default, `tools` with `strict`
  passed through, `stop` lists);
- core/llm/llms/OpenAI.ts _embed: `{input: [chunks], model}` for codebase indexing;
- core/llm/llms/Ollama.ts _streamChat / _getModelFileParams: the Ollama provider, with
  `options.num_ctx` (8192 unless configured), `keep_alive: 1800` and `think`.
"""

from __future__ import annotations

import json
from typing import Any

import httpx

from tests.clients.conftest import MODEL

HEADERS = {"Content-Type": "application/json", "Authorization": "Bearer unused"}


def sse(http: httpx.Client, path: str, body: dict[str, Any]) -> list[dict[str, Any]]:
    with http.stream("POST", path, json=body, headers=HEADERS) as reply:
        assert reply.status_code == 200, reply.read()
        lines = [line[6:] for line in reply.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    return [json.loads(line) for line in lines[:-1]]


def test_chat_with_tools_streamed(http: httpx.Client):
    body = {
        "messages": [
            {"role": "system", "content": "You are a helpful coding assistant."},
            {"role": "user", "content": "Read the file README.md"},
        ],
        "model": MODEL,
        "max_tokens": 96,
        "temperature": 0,
        "stream": True,
        "stop": ["<|im_end|>"],
        "tools": [{"type": "function", "function": {
            "name": "read_file", "description": "Read a file in the workspace",
            "parameters": {"type": "object", "required": ["filepath"],
                           "properties": {"filepath": {"type": "string"}}},
            "strict": False}}],
    }
    frames = sse(http, "/v1/chat/completions", body)
    deltas = [f["choices"][0]["delta"] for f in frames if f["choices"]]
    text = "".join(d.get("content") or "" for d in deltas)
    calls = [c for d in deltas for c in d.get("tool_calls") or []]
    finish = [f["choices"][0]["finish_reason"] for f in frames if f["choices"]][-1]
    assert text or calls
    assert "tool_calls" not in text and "read_file" not in text  # no call JSON as text
    assert (finish == "tool_calls") == bool(calls)


def test_legacy_completion_streamed(http: httpx.Client):
    body = {"prompt": "The three largest cities of France are", "model": MODEL, "max_tokens": 16,
            "temperature": 0.01, "stream": True, "stop": ["\n\n", "\ndef "]}
    frames = sse(http, "/v1/completions", body)
    assert "".join(f["choices"][0]["text"] for f in frames if f["choices"])


def test_embeddings_for_indexing(http: httpx.Client):
    chunks = ["def add(a, b):\n    return a + b\n", "class Stack:\n    pass\n"]
    reply = http.post("/v1/embeddings", json={"input": chunks, "model": MODEL}, headers=HEADERS)
    assert reply.status_code == 200, reply.text
    vectors = [row["embedding"] for row in reply.json()["data"]]
    assert len(vectors) == 2 and len(vectors[0]) == len(vectors[1]) > 0


def test_ollama_provider_chat(http: httpx.Client):
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Say hi"}],
        "options": {"temperature": 0.2, "num_predict": 12, "num_ctx": 8192,
                    "stop": ["<|im_end|>"]},
        "think": False,
        "keep_alive": 1800,
        "stream": True,
    }
    reply = http.post("/api/chat", json=body, headers=HEADERS)
    assert reply.status_code == 200, reply.text
    lines = [json.loads(line) for line in reply.text.splitlines()]
    assert lines[-1]["done"] is True
    assert "".join(line["message"]["content"] for line in lines)
