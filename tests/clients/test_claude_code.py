"""Claude Code's own requests, replayed. Claude Code is not open source; these bodies and
headers were recorded from Claude Code 2.1.197 (`claude -p`, npm
@anthropic-ai/claude-code) through a recording proxy in front of localllm, 2026-12-04.
Its prompt texts and tool descriptions are replaced by short ones of our own; every key,
header, block shape and value that is not prose is as recorded:

- `HEAD /` first, with Bun's user agent;
- `POST /v1/messages?beta=true` with `anthropic-beta` naming, among others,
  mid-conversation-system-2026-04-07, so a `{"role": "system"}` message follows the user's
  turn; `thinking: {"type": "adaptive"}`, `context_management` (clear_thinking edits),
  `output_config: {"effort": "high"}`, `metadata.user_id` as a JSON string,
  `max_tokens: 32000` whatever the context, three system blocks (the first a billing
  header) with `cache_control`, tools whose schemas declare draft 2020-12, `stream: true`.

The events are checked with the anthropic SDK's own types. One field is added to what
Claude Code sends: `temperature: 0`, so that a 135M model's answer, which may otherwise
run on to the context's end, is the same on every run.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import pydantic
from anthropic.types import Message, RawMessageStreamEvent

from tests.clients.conftest import MODEL
from tests.conftest import ServerProcess

HEADERS = {
    "accept": "application/json",
    "content-type": "application/json",
    "user-agent": "claude-cli/2.1.197 (external, sdk-cli)",
    "x-claude-code-session-id": "7f361597-c45e-4efd-a6d0-4626f32a9df0",
    "x-stainless-lang": "js",
    "x-stainless-package-version": "0.94.0",
    "x-stainless-retry-count": "0",
    "x-stainless-timeout": "600",
    "anthropic-beta": "claude-code-20250219,interleaved-thinking-2025-05-14,"
    "thinking-token-count-2026-05-13,context-management-2025-06-27,"
    "prompt-caching-scope-2026-01-05,mid-conversation-system-2026-04-07,effort-2025-11-24",
    "anthropic-dangerous-direct-browser-access": "true",
    "anthropic-version": "2023-06-01",
    "x-app": "cli",
    "x-api-key": "sk-local",
}
BASH = {
    "name": "Bash",
    "description": "Runs a shell command and returns its output.",
    "input_schema": {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "type": "object",
        "properties": {
            "command": {"description": "The command to run", "type": "string"},
            "timeout": {"description": "Milliseconds before it is stopped", "type": "number"},
            "description": {"description": "What the command does", "type": "string"},
            "run_in_background": {"description": "Run it in the background", "type": "boolean"},
        },
        "required": ["command"],
        "additionalProperties": False,
    },
}


def messages_body(prompt: str, **over: Any) -> dict[str, Any]:
    cache = {"type": "ephemeral"}
    return {
        "model": MODEL,
        "messages": [
            {"role": "user", "content": [
                {"type": "text", "text": "<system-reminder>\nToday's date is 2026-12-04.\n"
                 "</system-reminder>\n\n"},
                {"type": "text", "text": prompt, "cache_control": cache},
            ]},
            {"role": "system", "content": "Agent types available: general-purpose."},
        ],
        "system": [
            {"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1.197.c23; "
             "cc_entrypoint=sdk-cli;"},
            {"type": "text", "text": "You are a coding agent.", "cache_control": cache},
            {"type": "text", "text": "Answer briefly.", "cache_control": cache},
        ],
        "tools": [BASH],
        "metadata": {"user_id": json.dumps({"device_id": "0f04", "account_uuid": "",
                                            "session_id": "7f36"})},
        "max_tokens": 32000,
        "thinking": {"type": "adaptive"},
        "context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
        "output_config": {"effort": "high"},
        "stream": True,
        "temperature": 0.0,  # added: see the module's docstring
        **over,
    }


def events_of(reply: httpx.Response) -> list[Any]:
    adapter = pydantic.TypeAdapter(RawMessageStreamEvent)
    out = []
    name = None
    for line in reply.iter_lines():
        if line.startswith("event: "):
            name = line[7:]
        elif line.startswith("data: "):
            data = json.loads(line[6:])
            assert data["type"] == name
            out.append(adapter.validate_python(data))
    return out


def test_head_root_first(http: httpx.Client):
    reply = http.head("/", headers={"user-agent": "Bun/1.4.0"})
    assert reply.status_code == 200


def test_messages_as_claude_code_sends_them(http: httpx.Client):
    body = messages_body("Say hello in one word.")
    with http.stream("POST", "/v1/messages?beta=true", json=body, headers=HEADERS) as reply:
        assert reply.status_code == 200, reply.read()
        events = events_of(reply)
    kinds = [e.type for e in events]
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
    assert "message_delta" in kinds
    end = next(e for e in events if e.type == "message_delta")
    assert end.delta.stop_reason in ("end_turn", "tool_use", "max_tokens")
    assert end.usage.output_tokens >= 1


def test_whole_message_and_count_tokens(http: httpx.Client):
    body = messages_body("Say hello in one word.", stream=False)
    reply = http.post("/v1/messages?beta=true", json=body, headers=HEADERS)
    assert reply.status_code == 200, reply.text
    message = Message.model_validate(reply.json())
    assert message.content
    unsent = ("max_tokens", "stream", "metadata", "temperature")  # not count_tokens fields
    count = {k: v for k, v in body.items() if k not in unsent}
    counted = http.post("/v1/messages/count_tokens?beta=true", json=count, headers=HEADERS)
    assert counted.status_code == 200, counted.text
    # the system message inside `messages` is part of the prompt that was counted
    without = {**count, "messages": count["messages"][:1]}
    fewer = http.post("/v1/messages/count_tokens", json=without, headers=HEADERS).json()
    assert counted.json()["input_tokens"] > fewer["input_tokens"] > 0
    assert message.usage.input_tokens + (message.usage.cache_read_input_tokens or 0) == (
        counted.json()["input_tokens"]
    )


def test_max_tokens_beyond_the_context_is_served_to_its_end(small_server: ServerProcess):
    """Claude Code always asks for 32,000 tokens: on a 256-token context the answer runs
    to the context's end and says max_tokens, rather than being refused."""
    body = messages_body("Write a long story about a dragon who learns to bake bread.",
                         stream=False,
                         tools=[], thinking={"type": "disabled"},
                         model="starter")
    body["system"] = "Answer at length."
    # greedy, on a prompt the starter answers at length under its default repeat penalty
    # (asked to count from 1 to 500, it answers a sentence or two and stops on its own)
    body["temperature"] = 0
    reply = httpx.post(small_server.base + "/v1/messages", json=body, headers=HEADERS,
                       timeout=120)
    assert reply.status_code == 200, reply.text
    message = Message.model_validate(reply.json())
    assert message.stop_reason == "max_tokens"
    used = message.usage.input_tokens + (message.usage.cache_read_input_tokens or 0)
    assert used + message.usage.output_tokens == 256
