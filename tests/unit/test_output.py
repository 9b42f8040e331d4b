"""engine/output.py: one request's chunks become typed deltas, once, for every face.

A local model's reply is text the processor splits (think tags, Hermes tool calls); a
remote engine's structured reasoning and calls (vLLM's and SGLang's parsers send them
apart from the text) pass through as they are, with no round trip through markup.
"""

from __future__ import annotations

from typing import Any

import pytest

from localllm.backends.base import Chunk, GenerationStats
from localllm.engine.output import Delta, OutputProcessor
from localllm.engine.remote_route import _Reply
from localllm.engine.request import Started
from localllm.errors import RemoteRejected

STATS = GenerationStats(5, 0, 7, 0.01, 50.0)


def deltas(started: Started, pieces: list[str], final: Chunk) -> list[Delta]:
    out = OutputProcessor(started)
    return [out.chunk(Chunk(p, (1,))) for p in pieces] + [out.chunk(final)]


def whole(parts: list[Delta]) -> Delta:
    total = Delta()
    for d in parts:
        total = total + d
    return total


def test_a_local_reply_is_split_into_reasoning_text_and_calls():
    started = Started("m", 5, tool_format="hermes", tool_names=("get_weather",), reasoning="open")
    pieces = ["Paris is", " a city.</th", "ink>\n\nLet me check.", "<tool_call>\n{\"name\": ",
              "\"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>"]
    parts = deltas(started, pieces, Chunk("", (), finish_reason="stop", stats=STATS))
    assert "".join(d.reasoning for d in parts) == "Paris is a city."
    assert "".join(d.text for d in parts) == "Let me check."
    # a call goes out whole, with the final delta, which says so in its finish reason
    assert [d.tool_calls for d in parts[:-1]] == [()] * (len(parts) - 1)
    (call,) = parts[-1].tool_calls
    assert call.name == "get_weather" and '"Paris"' in call.arguments and call.id
    assert parts[-1].finish_reason == "tool_calls"
    assert parts[-1].final is not None and parts[-1].final.stats == STATS


def test_a_stop_string_travels_on_the_final_delta():
    final = Chunk("", (), finish_reason="stop", stats=STATS, stop_sequence="END")
    parts = deltas(Started("m", 5), ["one two"], final)
    assert whole(parts).text == "one two"
    assert parts[-1].finish_reason == "stop" and parts[-1].final is final
    assert parts[-1].final.stop_sequence == "END"


def vllm_events() -> list[dict[str, Any]]:
    """A streamed chat completion as vLLM sends it with a reasoning parser and a tool
    parser on (`reasoning_content`; newer releases say `reasoning`)."""
    def delta(**fields: Any) -> dict[str, Any]:
        return {"choices": [{"index": 0, "delta": fields, "finish_reason": None}]}

    call = {"index": 0, "id": "chatcmpl-tool-1", "type": "function",
            "function": {"name": "get_weather", "arguments": ""}}
    return [
        delta(role="assistant", content=""),
        delta(reasoning_content="The user wants"),
        delta(reasoning=" the weather."),
        delta(content="Checking."),
        delta(tool_calls=[call]),
        delta(tool_calls=[{"index": 0, "function": {"arguments": '{"city": '}}]),
        delta(tool_calls=[{"index": 0, "function": {"arguments": '"Paris"}'}}]),
        {"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}],
         "usage": {"prompt_tokens": 12, "completion_tokens": 9}},
    ]


def test_a_remote_engines_structured_reply_passes_through():
    reply = _Reply("vllm")
    out = OutputProcessor(Started("gpu/qwen", 0, backend="remote"))
    parts = []
    for event in vllm_events():
        text, thought = reply.delta_of(event)
        if text or thought:
            parts.append(out.chunk(Chunk(text, (), reasoning=thought)))
    assert reply.finish == "tool_calls" and reply.usage == {"prompt_tokens": 12,
                                                            "completion_tokens": 9}
    final = Chunk("", (), finish_reason="stop", stats=STATS, tool_calls=reply.tool_calls("gpu"))
    parts.append(out.chunk(final))
    answer = whole(parts)
    assert answer.reasoning == "The user wants the weather."
    assert answer.text == "Checking." and "<think>" not in answer.text
    (call,) = answer.tool_calls
    assert call.id == "chatcmpl-tool-1" and call.name == "get_weather"
    assert call.arguments == '{"city": "Paris"}'
    assert answer.finish_reason == "tool_calls"


def test_a_remote_call_whose_arguments_do_not_parse_is_refused_not_altered():
    reply = _Reply("vllm")
    reply.delta_of({"choices": [{"index": 0, "delta": {"tool_calls": [
        {"index": 0, "function": {"name": "f", "arguments": "{not json"}}]}}]})
    with pytest.raises(RemoteRejected, match="not a JSON object"):
        reply.tool_calls("gpu")
