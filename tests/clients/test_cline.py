"""Cline's OpenAI-compatible provider, replayed: cline/cline, src/core/api/providers/openai.ts
at commit df613156e8afe6561a195784d561dd07a6987b8c (createMessage) and
src/core/api/transform/tool-call-processor.ts (getOpenAIToolParams): a system message, the
conversation, `temperature: 0` (its sane default), `stream: true` with
`stream_options.include_usage`, native tools with `tool_choice: "auto"` and
`parallel_tool_calls: false`; a tool's result comes back as a `tool` message whose content
is a list of text parts. Roo Code, a fork, sends the same shape.
"""

from __future__ import annotations

import json
from typing import Any

import httpx

from tests.clients.conftest import MODEL

TOOLS = [
    {"type": "function", "function": {
        "name": "read_file", "description": "Request to read the contents of a file.",
        "parameters": {"type": "object", "properties": {
            "path": {"type": "string", "description": "The path of the file to read"}},
            "required": ["path"]}}},
    {"type": "function", "function": {
        "name": "execute_command", "description": "Request to execute a CLI command.",
        "parameters": {"type": "object", "properties": {
            "command": {"type": "string"},
            "requires_approval": {"type": "boolean"}},
            "required": ["command", "requires_approval"]}}},
]
SYSTEM = {"role": "system", "content": "You are Cline, a software engineer. Use the tools."}


def cline_body(messages: list[Any]) -> dict[str, Any]:
    return {"model": MODEL, "messages": [SYSTEM, *messages], "temperature": 0,
            "stream": True, "stream_options": {"include_usage": True}, "tools": TOOLS,
            "tool_choice": "auto", "parallel_tool_calls": False, "max_tokens": 128}


def frames_of(http: httpx.Client, body: dict[str, Any]) -> list[dict[str, Any]]:
    with http.stream("POST", "/v1/chat/completions", json=body,
                     headers={"Authorization": "Bearer unused"}) as reply:
        assert reply.status_code == 200, reply.read()
        lines = [line[6:] for line in reply.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    return [json.loads(line) for line in lines[:-1]]


def test_native_tool_calls_streamed(http: httpx.Client):
    ask = [{"role": "user", "content": [{"type": "text", "text": "<task>Show me README.md"
                                         "</task>"}]}]
    frames = frames_of(http, cline_body(ask))
    usage = frames[-1]["usage"]  # include_usage: the last frame has no choices, the usage
    assert frames[-1]["choices"] == [] and usage["prompt_tokens"] > 0
    deltas = [f["choices"][0]["delta"] for f in frames if f["choices"]]
    calls = [c for d in deltas for c in d.get("tool_calls") or []]
    text = "".join(d.get("content") or "" for d in deltas)
    assert len(calls) <= 1  # parallel_tool_calls false: one call at most
    for call in calls:
        assert call["function"]["name"] in ("read_file", "execute_command")
        json.loads(call["function"]["arguments"])
    assert '"name"' not in text
    # the result goes back as Cline sends it, and the model answers
    history = [*ask,
               {"role": "assistant", "content": None, "tool_calls": [
                   {"id": "call_1", "type": "function", "function": {
                       "name": "read_file", "arguments": json.dumps({"path": "README.md"})}}]},
               {"role": "tool", "tool_call_id": "call_1",
                "content": [{"type": "text", "text": "# Demo\nA demo project."}]}]
    after = frames_of(http, cline_body(history))
    finish = [f["choices"][0]["finish_reason"] for f in after if f["choices"]][-1]
    assert finish in ("stop", "length", "tool_calls")
