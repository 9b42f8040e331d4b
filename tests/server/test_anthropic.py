"""The Anthropic Messages API through the official `anthropic` SDK, on a real server."""

from __future__ import annotations

import anthropic
import jsonschema
import pytest
from anthropic.types import MessageParam, ToolParam

from tests.conftest import ServerProcess

WEATHER: ToolParam = {"name": "get_weather", "description": "Current weather in a city",
           "input_schema": {"type": "object", "properties": {"city": {"type": "string"}},
                            "required": ["city"]}}


@pytest.fixture(scope="module")
def client(server: ServerProcess) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=server.base, api_key="unused", max_retries=0)


def test_message_plain_and_streamed(client: anthropic.Anthropic):
    msg = client.messages.create(
        model="starter", max_tokens=8, extra_body={"temperature": 0},
        system=[{"type": "text", "text": "You are brief.", "cache_control": {"type": "ephemeral"}}],
        messages=[{"role": "user", "content": "What color is the sky?"}])
    assert msg.type == "message" and msg.role == "assistant" and msg.model == "starter"
    assert msg.stop_reason == "max_tokens" and msg.usage.output_tokens == 8
    (block,) = msg.content
    assert block.type == "text" and block.text
    with client.messages.stream(
        model="starter", max_tokens=8, extra_body={"temperature": 0}, system="You are brief.",
        messages=[{"role": "user", "content": "What color is the sky?"}]) as stream:
        streamed = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert streamed == block.text
    assert final.stop_reason == "max_tokens" and final.usage.output_tokens == 8
    # the same prompt again is read from the prompt cache, and the usage says so
    assert (final.usage.cache_read_input_tokens or 0) > 0


def test_a_stop_sequence_is_reported_with_its_string(client: anthropic.Anthropic):
    ask: list[MessageParam] = [{"role": "user", "content": "What color is the sky?"}]
    free = client.messages.create(model="starter", max_tokens=12, messages=ask,
                                  extra_body={"temperature": 0})
    assert free.content[0].type == "text"
    text = free.content[0].text
    words = text.split()
    assert len(words) >= 3, text
    stop = words[2]  # a word the greedy answer writes: the same answer stops before it
    cut = client.messages.create(model="starter", max_tokens=12, messages=ask,
                                 stop_sequences=[stop, "never appears"],
                                 extra_body={"temperature": 0})
    assert cut.stop_reason == "stop_sequence" and cut.stop_sequence == stop
    assert cut.content[0].type == "text" and cut.content[0].text == text[: text.index(stop)]
    with client.messages.stream(model="starter", max_tokens=12, messages=ask,
                                stop_sequences=[stop], extra_body={"temperature": 0}) as stream:
        streamed = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert streamed == text[: text.index(stop)]
    assert final.stop_reason == "stop_sequence" and final.stop_sequence == stop


def test_tool_use_round_trip(client: anthropic.Anthropic):
    ask: list[MessageParam] = [{"role": "user", "content": "What is the weather in Paris?"}]
    msg = client.messages.create(
        model="starter", max_tokens=200, extra_body={"temperature": 0}, tools=[WEATHER],
        tool_choice={"type": "any", "disable_parallel_tool_use": True}, messages=ask)
    assert msg.stop_reason == "tool_use"
    (use,) = [b for b in msg.content if b.type == "tool_use"]
    assert use.name == "get_weather" and use.id
    jsonschema.validate(use.input, dict(WEATHER["input_schema"]))
    history: list[MessageParam] = [*ask, {"role": "assistant", "content": msg.content},
               {"role": "user", "content": [
                   {"type": "tool_result", "tool_use_id": use.id, "content": "18 C, cloudy"}]}]
    answer = client.messages.create(
        model="starter", max_tokens=24, extra_body={"temperature": 0}, tools=[WEATHER],
        tool_choice={"type": "none"}, messages=history)
    assert answer.stop_reason in ("end_turn", "max_tokens")
    assert answer.content[0].type == "text" and answer.content[0].text
    with client.messages.stream(
        model="starter", max_tokens=200, extra_body={"temperature": 0.5}, tools=[WEATHER],
        tool_choice={"type": "tool", "name": "get_weather", "disable_parallel_tool_use": True},
        messages=ask) as stream:
        final = stream.get_final_message()
    assert final.stop_reason == "tool_use"
    (use,) = [b for b in final.content if b.type == "tool_use"]
    jsonschema.validate(use.input, dict(WEATHER["input_schema"]))
    counted = client.messages.count_tokens(model="starter", messages=history, tools=[WEATHER])
    assert counted.input_tokens > 20


def test_errors_in_anthropics_shape(client: anthropic.Anthropic):
    with pytest.raises(anthropic.BadRequestError) as info:
        client.messages.create(model="starter", max_tokens=4,
                               messages=[{"role": "user", "content": "hi"}],
                               extra_body={"repetition_penalty": 1.3})
    body = info.value.body
    assert isinstance(body, dict)
    assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
    assert "repetition_penalty" in body["error"]["message"]
    with pytest.raises(anthropic.NotFoundError):
        client.messages.create(model="nope", max_tokens=4,
                               messages=[{"role": "user", "content": "hi"}])
