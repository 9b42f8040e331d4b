"""The Responses API through the official `openai` SDK (`client.responses`), on the starter:
plain and streamed answers, stored responses and `previous_response_id` (with the prompt
cache reading only what is new), function calls and their outputs, structured output,
input token counts, and the errors."""

from __future__ import annotations

import json
from typing import Any

import httpx
import jsonschema
import openai
import pytest
from openai.types.responses import FunctionToolParam

from tests.conftest import ServerProcess

WEATHER: FunctionToolParam = {
    "type": "function", "name": "get_weather", "description": "Weather now", "strict": False,
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]},
}
HOSTED: Any = {"type": "web_search"}  # a hosted tool: left out of what the model sees


def client_of(srv: ServerProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=srv.base + "/v1", api_key="x", max_retries=0)


def test_plain_and_continued(server: ServerProcess):
    client = client_of(server)
    first = client.responses.create(model="starter", input="Say hello in five words.",
                                    max_output_tokens=24, temperature=0)
    assert first.status in ("completed", "incomplete") and first.output_text
    assert first.usage is not None and first.usage.output_tokens >= 1
    assert first.output[0].type == "message"
    again = client.responses.create(
        model="starter", input="Now say it in French.", previous_response_id=first.id,
        max_output_tokens=24, temperature=0)
    assert again.output_text and again.previous_response_id == first.id
    assert again.usage is not None
    # the conversation before was rendered again and read from the prompt cache
    assert again.usage.input_tokens > first.usage.input_tokens
    assert again.usage.input_tokens_details.cached_tokens >= first.usage.input_tokens - 8
    assert client.responses.retrieve(first.id).output_text == first.output_text
    items = client.responses.input_items.list(again.id, order="asc").data
    assert [i.type for i in items] == ["message"]
    # instructions are the system message of this response only (not carried on)
    told = client.responses.create(model="starter", input="Who are you?", temperature=0,
                                   instructions="You are Ada.", max_output_tokens=8)
    counted = client.responses.input_tokens.count(model="starter", input="Who are you?",
                                                  instructions="You are Ada.")
    assert told.usage is not None and told.usage.input_tokens == counted.input_tokens
    client.responses.delete(first.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(first.id)
    with pytest.raises(openai.NotFoundError) as info:
        client.responses.create(model="starter", input="Hi", previous_response_id=first.id)
    assert first.id in str(info.value)


def test_streamed_events(server: ServerProcess):
    events = list(client_of(server).responses.create(
        model="starter", input="Count to five.", max_output_tokens=16, temperature=0,
        stream=True))
    kinds = [e.type for e in events]
    assert kinds[:4] == ["response.created", "response.in_progress",
                         "response.output_item.added", "response.content_part.added"]
    assert kinds[-4:-1] == ["response.output_text.done", "response.content_part.done",
                            "response.output_item.done"]
    assert kinds[-1] in ("response.completed", "response.incomplete")
    assert [e.sequence_number for e in events] == list(range(len(events)))
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    last = events[-1]
    assert last.type in ("response.completed", "response.incomplete")
    assert text and last.response.output_text == text


def test_not_stored_when_asked(server: ServerProcess):
    client = client_of(server)
    r = client.responses.create(model="starter", input="Hi", max_output_tokens=4, store=False)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(r.id)


def test_function_call_round_trip(server: ServerProcess):
    client = client_of(server)
    called = client.responses.create(
        model="starter", input="What is the weather in Paris?", tools=[WEATHER, HOSTED],
        tool_choice="required", temperature=0)
    calls = [o for o in called.output if o.type == "function_call"]
    assert len(calls) == 1 and calls[0].name == "get_weather"
    assert isinstance(json.loads(calls[0].arguments)["city"], str)
    assert [t.type for t in called.tools] == ["function"]  # the hosted one was left out
    answered = client.responses.create(  # no tools now: the answer is text
        model="starter", previous_response_id=called.id, temperature=0, max_output_tokens=32,
        input=[{"type": "function_call_output", "call_id": calls[0].call_id,
                "output": "18 C and sunny"}])
    assert answered.output_text
    streamed = list(client.responses.create(
        model="starter", input="What is the weather in Rome?", tools=[WEATHER],
        tool_choice="required", temperature=0, stream=True))
    kinds = [e.type for e in streamed]
    assert "response.function_call_arguments.delta" in kinds
    done = next(e for e in streamed if e.type == "response.function_call_arguments.done")
    assert json.loads(done.arguments)["city"]


def test_free_form_shell_and_hosted_call_items_sent_back(server: ServerProcess):
    """What agents send back from earlier turns: a free-form tool's call and result
    (Codex's apply_patch on models that take it), a hosted shell's call, a web search's
    record. The calls and results are in the prompt; the hosted record is left out."""
    client = client_of(server)
    ask = [{"role": "user", "content": "Fix the typo in README."}]
    history = [
        {"type": "custom_tool_call", "call_id": "c1", "name": "apply_patch",
         "input": "*** Begin Patch\n*** Update File: README\n-teh\n+the\n*** End Patch"},
        {"type": "custom_tool_call_output", "call_id": "c1", "output": "Done: 1 file changed"},
        {"type": "local_shell_call", "call_id": "c2", "status": "completed",
         "action": {"type": "exec", "command": ["git", "diff", "--stat"]}},
        {"type": "function_call_output", "call_id": "c2", "output": "README | 2 +-"},
    ]
    record = [{"type": "web_search_call", "id": "ws_1", "status": "completed",
               "action": {"type": "search", "query": "typo"}}]
    count = client.responses.input_tokens.count
    alone = count(model="starter", input=ask).input_tokens  # type: ignore[arg-type]
    called = count(model="starter", input=ask + history).input_tokens  # type: ignore[arg-type]
    recorded = count(model="starter", input=ask + history + record).input_tokens  # type: ignore[arg-type]
    assert called > alone + 20  # the patch, the command and both results are read
    assert recorded == called  # the search record adds nothing the model sees
    r = client.responses.create(model="starter", input=ask + history + record,  # type: ignore[arg-type]
                                max_output_tokens=4, temperature=0)
    assert r.status == "incomplete" and r.usage is not None
    bad = httpx.post(server.base + "/v1/responses", timeout=60, json={
        "model": "starter", "input": [*ask, {"type": "compaction", "encrypted_content": "x"}]})
    assert bad.status_code == 400
    assert "input item 1 has type 'compaction'" in bad.json()["error"]["message"]
    for route in ("/v1/responses", "/v1/responses/input_tokens"):  # not items at all
        for items in ([[None, None]], [5], [{"type": None}]):
            odd = httpx.post(server.base + route, json={"input": items}, timeout=60)
            assert odd.status_code == 400, (route, items, odd.text)


def test_structured_output_and_counting(server: ServerProcess):
    client = client_of(server)
    schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 20},
                                               "legs": {"type": "integer"}},
              "required": ["name", "legs"], "additionalProperties": False}
    r = client.responses.create(
        model="starter", input="Describe a cat as JSON.", temperature=0,
        text={"format": {"type": "json_schema", "name": "animal", "schema": schema}})
    jsonschema.validate(json.loads(r.output_text), schema)
    counted = client.responses.input_tokens.count(model="starter", input="Hello there")
    assert counted.input_tokens > 3


def test_refusals_name_what_is_wrong(server: ServerProcess):
    url = server.base + "/v1/responses"
    for extra, named in (({"include": ["file_search_call.results"]}, "include"),
                         ({"tools": [{"type": "computer", "display_width": 1}]}, "computer"),
                         ({"background": True}, "background"),
                         ({"max_output_tokens": 0}, "max_output_tokens")):
        r = httpx.post(url, json={"model": "starter", "input": "Hi", **extra}, timeout=60)
        assert r.status_code == 400 and named in r.json()["error"]["message"], (extra, r.text)


def test_bodies_validate_against_the_sdk_types(server: ServerProcess):
    """The SDK builds its objects leniently; validated strictly, every required field of
    the response object is there (usage details included)."""
    from openai.types.responses import Response

    reply = httpx.post(server.base + "/v1/responses", timeout=60, json={
        "model": "starter", "input": "Hi", "max_output_tokens": 4, "tools": [WEATHER]})
    assert reply.status_code == 200, reply.text
    body = Response.model_validate(reply.json())
    assert body.usage is not None and body.usage.input_tokens_details.cache_write_tokens >= 0
