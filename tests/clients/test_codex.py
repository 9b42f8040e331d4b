"""Codex CLI's own request to the Responses API, replayed. Recorded from Codex CLI 0.171.0
(`codex exec`, npm @openai/codex, with a `wire_api = "responses"` provider at localllm)
through a recording proxy, 2026-12-04. Its instructions and tool descriptions are replaced
by short ones of our own; the keys, headers, item and tool shapes are as recorded:

- input items are messages with ids: two `developer` messages (one of two `input_text`
  parts) and two `user` messages; no `instructions`;
- flat `function` tools (`strict: false`), a `namespace` tool grouping function tools
  (`multi_agent_v1`), and a hosted `web_search` tool with `external_web_access: false`;
- `tool_choice: "auto"`, `parallel_tool_calls: true`, `reasoning: {"summary": "auto"}`,
  `store: false`, `include: ["reasoning.encrypted_content"]`, `prompt_cache_key`,
  `client_metadata`, `stream: true`.

The events are checked with the openai SDK's own types; the hosted tool is left out of
what the model sees and a namespaced function keeps its namespace in its call.

These tests have a server of their own: a request reuses any cached prefix (only
`deterministic` ones keep to whole aligned blocks), and a few tokens of another test's
prompt computed in another batch round differently, enough to send the 135M model's
greedy argument string into a loop (seen: `{"target": "cowboy"}` in 27 tokens on a fresh
server, a string to the token limit after one other chat).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pydantic
import pytest
from openai.types.responses import ResponseStreamEvent

from localllm.backends.base import ModelRef
from tests.clients.conftest import MODEL, coder_server
from tests.conftest import ServerProcess, starts_process

SESSION = "01a24385-c812-7b30-8926-51357002b67a"
HEADERS = {
    "x-codex-beta-features": "remote_compaction_v2",
    "x-codex-window-id": f"{SESSION}:0",
    "x-codex-turn-metadata": json.dumps({"session_id": SESSION, "turn_trigger": "exec",
                                         "sandbox_mode": "read-only", "model": MODEL}),
    "x-client-request-id": SESSION,
    "session-id": SESSION,
    "thread-id": SESSION,
    "accept": "text/event-stream",
    "content-type": "application/json",
    "originator": "codex_exec",
    "user-agent": "codex_exec/0.171.0 (Debian 12.0.0; x86_64) xterm (codex_exec; 0.171.0)",
    "authorization": "Bearer x",
}


@pytest.fixture(scope="module")
@starts_process
def clients_server(  # this module's own (see above); conftest's `http` talks to it
    tmp_path_factory: pytest.TempPathFactory, starter_ref: ModelRef
) -> Iterator[ServerProcess]:
    srv = coder_server(tmp_path_factory.mktemp("codex"), starter_ref)
    yield srv
    srv.stop()


def function(name: str, properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
    return {"type": "function", "name": name, "description": f"The {name} tool.",
            "strict": False, "parameters": {"type": "object", "properties": properties,
                                            "required": required,
                                            "additionalProperties": False}}


def text(words: str) -> dict[str, str]:
    return {"type": "input_text", "text": words}


def codex_body(prompt: str) -> dict[str, Any]:
    return {
        "model": MODEL,
        "input": [
            {"type": "message", "id": "msg_f4f79bbf-af2a-5abe-ad01-dc95fa605a60",
             "role": "developer", "content": [text("You are a coding agent in a terminal.")]},
            {"type": "message", "id": "msg_01a24385-c906-7381-ac5e-695f5682c262",
             "role": "developer", "content": [text("<permissions>read-only</permissions>"),
                                              text("<environment>linux</environment>")]},
            {"type": "message", "id": "msg_01a24385-c906-7381-ac5e-696d4d6e0ec2",
             "role": "user", "content": [text("<environment_context>cwd=/work"
                                              "</environment_context>")]},
            {"type": "message", "id": "msg_01a24385-c93e-7352-bd2d-af6624fdc04b",
             "role": "user", "content": [text(prompt)]},
        ],
        "tools": [
            function("exec_command", {"cmd": {"type": "string"}, "workdir": {"type": "string"},
                                      "tty": {"type": "boolean"}}, ["cmd"]),
            function("write_stdin", {"session_id": {"type": "number"},
                                     "chars": {"type": "string"}}, ["session_id"]),
            {"type": "namespace", "name": "multi_agent_v1",
             "description": "Tools for sub-agents.",
             "tools": [function("close_agent", {"target": {"type": "string"}}, ["target"])]},
            {"type": "web_search", "external_web_access": False},
        ],
        "tool_choice": "auto",
        "parallel_tool_calls": True,
        "reasoning": {"summary": "auto"},
        "store": False,
        "stream": True,
        "include": ["reasoning.encrypted_content"],
        "prompt_cache_key": SESSION,
        "client_metadata": {"x-codex-window-id": f"{SESSION}:0", "session_id": SESSION,
                            "thread_id": SESSION, "turn_id": "01a24385-c8ba"},
    }


def events_of(reply: httpx.Response) -> list[Any]:
    adapter: pydantic.TypeAdapter[Any] = pydantic.TypeAdapter(ResponseStreamEvent)
    out = []
    for line in reply.iter_lines():
        if line.startswith("data: "):
            out.append(adapter.validate_python(json.loads(line[6:])))
    return out


def run(http: httpx.Client, body: dict[str, Any]) -> list[Any]:
    with http.stream("POST", "/v1/responses", json=body, headers=HEADERS) as reply:
        assert reply.status_code == 200, reply.read()
        return events_of(reply)


def test_codex_turn_streams_openai_events(http: httpx.Client):
    body = codex_body("Say hi.")
    body["max_output_tokens"] = 32  # added: a 135M model may otherwise run on
    events = run(http, body)
    assert events[0].type == "response.created" and events[1].type == "response.in_progress"
    assert events[-1].type in ("response.completed", "response.incomplete")
    final = events[-1].response
    assert final.output and final.store is False
    assert [t.name for t in final.tools] == ["exec_command", "write_stdin", "close_agent"]
    # store: false keeps nothing to continue from
    again = http.post("/v1/responses", headers={"authorization": "Bearer x"},
                      json={"model": MODEL, "input": "Hi", "previous_response_id": final.id})
    assert again.status_code == 404


def test_a_namespaced_call_names_its_namespace(http: httpx.Client):
    body = codex_body("Close the agent named scout.")
    body["tool_choice"] = {"type": "function", "name": "close_agent"}
    body |= {"max_output_tokens": 64, "temperature": 0}  # added, as above
    events = run(http, body)
    done = [e for e in events if e.type == "response.output_item.done"]
    calls = [e.item for e in done if e.item.type == "function_call"]
    assert len(calls) == 1
    assert calls[0].name == "close_agent" and calls[0].namespace == "multi_agent_v1"
    assert isinstance(json.loads(calls[0].arguments)["target"], str)
