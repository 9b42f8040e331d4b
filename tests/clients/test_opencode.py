"""opencode against a local OpenAI-compatible provider, replayed: opencode talks to it
through the AI SDK's `@ai-sdk/openai-compatible` chat model, vercel/ai,
packages/openai-compatible/src/chat/openai-compatible-chat-language-model.ts at commit
03955ee6dcc76e2b5b644f02e47f9b7fc3a7ff98 (`getArgs` and `doStream`). The body: `model`,
`max_tokens` (opencode asks for the model's whole output limit, 32,000 for a model it
does not know), `temperature`, `messages` (a lone text part as a plain string, tool
results as `role: "tool"` messages whose content is the JSON text), `tools` as function
tools whose `parameters` are zod's JSON Schema (draft-07 `$schema`, closed objects),
`tool_choice` left out, `stream: true`, and `stream_options: {"include_usage": true}`
only when the provider is set up with `includeUsage`; undefined fields are dropped by
JSON.stringify. The stream is read for `delta.content`, `delta.reasoning_content` and
`delta.tool_calls` (id, function name, arguments by index), and `usage` at the end.
"""

from __future__ import annotations

import json
from typing import Any

import httpx

from tests.clients.conftest import MODEL

DRAFT7 = "http://json-schema.org/draft-07/schema#"
BASH = {"type": "function", "function": {
    "name": "bash",
    "description": "Executes a given bash command in a persistent shell session.",
    "parameters": {
        "type": "object",
        "properties": {
            "command": {"type": "string", "description": "The command to execute"},
            "timeout": {"type": "number", "description": "Optional timeout in milliseconds"},
            "description": {"type": "string",
                            "description": "Clear, concise description of what it does"},
        },
        "required": ["command", "description"],
        "additionalProperties": False,
        "$schema": DRAFT7,
    }}}
READ = {"type": "function", "function": {
    "name": "read",
    "description": "Reads a file from the local filesystem.",
    "parameters": {
        "type": "object",
        "properties": {"filePath": {"type": "string"},
                       "offset": {"type": "number"}, "limit": {"type": "number"}},
        "required": ["filePath"], "additionalProperties": False, "$schema": DRAFT7,
    }}}


def body(messages: list[dict[str, Any]], *, usage: bool) -> dict[str, Any]:
    out: dict[str, Any] = {"model": MODEL, "max_tokens": 32000, "temperature": 0,
                           "messages": messages, "tools": [BASH, READ], "stream": True}
    if usage:
        out["stream_options"] = {"include_usage": True}
    return out


def _events(http: httpx.Client, payload: dict[str, Any], limit: int) -> list[dict[str, Any]]:
    """The stream's events, up to `limit` of them (then the connection is closed, as
    opencode's abort does, and the server stops the answer)."""
    events: list[dict[str, Any]] = []
    with http.stream("POST", "/v1/chat/completions", json=payload) as reply:
        assert reply.status_code == 200, reply.read()
        for line in reply.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                events.append(json.loads(line[6:]))
                if len(events) >= limit:
                    break
    return events


def test_first_turn_streams_in_the_shape_the_sdk_reads(http: httpx.Client):
    messages = [{"role": "system", "content": "You are opencode, an interactive CLI tool."},
                {"role": "user", "content": "List the files here."}]
    events = _events(http, body(messages, usage=True) | {"max_tokens": 48}, 400)
    assert events[0]["object"] == "chat.completion.chunk" and events[0]["model"] == MODEL
    deltas = [c["delta"] for e in events for c in e["choices"]]
    said = "".join(d.get("content") or "" for d in deltas)
    calls = [t for d in deltas for t in d.get("tool_calls") or []]
    assert said or calls
    for call in calls:  # each call whole: index, id and name with its arguments
        assert isinstance(call["index"], int) and call["id"] and call["function"]["name"]
        json.loads(call["function"]["arguments"])
    assert events[-1]["usage"]["completion_tokens"] >= 1


def test_a_tool_result_turn_and_the_whole_output_limit(http: httpx.Client):
    """The second request carries the call and its result; max_tokens 32,000 is more than
    the context holds and is served up to its end (read here for a few events only)."""
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": "List the files here."},
        {"role": "assistant", "content": "", "tool_calls": [{
            "id": "call_1", "type": "function",
            "function": {"name": "bash",
                         "arguments": '{"command":"ls","description":"List files"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "README.md\nsrc\n"},
    ]
    events = _events(http, body(messages, usage=False), 6)
    assert events and all("choices" in e for e in events)
    assert all("usage" not in e or e["usage"] is None for e in events)
