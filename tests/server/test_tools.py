"""Tool calls, structured output and log probabilities through the `openai` client.

The starter's template knows no tools, so it gets the generic format (the server
describes the tools and constrains the reply). A copy of the starter with a
Hermes-style template (written for this test, as Qwen's is shaped) covers the
native path: `<tool_call>` blocks in the reply, constrained when a call is required.
"""

from __future__ import annotations

import base64
import itertools
import json
from collections.abc import Iterator, Sequence
from typing import Any

import httpx
import jsonschema
import openai
import pytest
from openai.types.chat import (
    ChatCompletionFunctionToolParam,
    ChatCompletionMessageParam,
)

from localllm.backends.base import ModelRef
from tests.conftest import ServerProcess, body_of, starts_process, usage_of
from tests.gguf_fixtures import copy_with_metadata, noise_png

WEATHER_PARAMS: dict[str, object] = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 40},
                   "unit": {"enum": ["celsius", "fahrenheit"]}},
    "required": ["city", "unit"],
}
TIME_PARAMS: dict[str, object] = {"type": "object", "properties": {}}
TOOLS: list[ChatCompletionFunctionToolParam] = [
    {"type": "function", "function": {"name": "get_weather", "description": "Weather now",
                                      "parameters": WEATHER_PARAMS}},
    {"type": "function", "function": {"name": "get_time", "description": "The time now",
                                      "parameters": TIME_PARAMS}},
]
PARAMS = {"get_weather": WEATHER_PARAMS, "get_time": TIME_PARAMS}
ASK: list[ChatCompletionMessageParam] = [
    {"role": "user", "content": "What is the weather in Paris?"}
]

HERMES_LIKE = (
    "{% if tools %}<|im_start|>system\nYou may call functions:\n<tools>\n"
    "{% for t in tools %}{{ t | tojson }}\n{% endfor %}</tools>\n"
    "Reply with <tool_call>{\"name\": ..., \"arguments\": ...}</tool_call> for each call."
    "<|im_end|>\n{% endif %}"
    "{% for m in messages %}"
    "{% if m.role == 'assistant' and m.tool_calls %}<|im_start|>assistant\n"
    "{% for c in m.tool_calls %}<tool_call>\n{\"name\": \"{{ c.function.name }}\", "
    "\"arguments\": {{ c.function.arguments | tojson }}}\n</tool_call>\n{% endfor %}"
    "<|im_end|>\n"
    "{% elif m.role == 'tool' %}<|im_start|>user\n<tool_response>\n{{ m.content }}\n"
    "</tool_response><|im_end|>\n"
    "{% else %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endif %}"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

PNG = base64.b64encode(noise_png()).decode()


def client_of(srv: ServerProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=srv.base + "/v1", api_key="x", max_retries=0)


@pytest.fixture(scope="module")
@starts_process
def hermes_server(tmp_path_factory: pytest.TempPathFactory, starter_ref: ModelRef
                  ) -> Iterator[ServerProcess]:
    tmp = tmp_path_factory.mktemp("hermes")
    path = copy_with_metadata(starter_ref.path, tmp / "hermes-starter.gguf",
                              {"tokenizer.chat_template": HERMES_LIKE})
    srv = ServerProcess(tmp, "--model", str(path), "--ctx", "1024")
    yield srv
    srv.stop()


def check_calls(calls: Sequence[Any] | None, names: set[str]) -> None:
    assert calls
    for call in calls:
        assert call.type == "function" and call.id.startswith("call_")
        assert call.function.name in names
        jsonschema.validate(json.loads(call.function.arguments), PARAMS[call.function.name])


def test_generic_round_trip(server: ServerProcess):
    client = client_of(server)
    first = client.chat.completions.create(
        model="starter", messages=ASK, tools=TOOLS, tool_choice="required",
        parallel_tool_calls=False, temperature=0)
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    calls = choice.message.tool_calls or []
    assert len(calls) == 1
    check_calls(calls, {"get_weather", "get_time"})
    call = calls[0]
    history: list[Any] = [*ASK, choice.message.model_dump(exclude_none=True),
               {"role": "tool", "tool_call_id": call.id,
                "content": json.dumps({"temperature": 18, "sky": "cloudy"})}]
    answer = client.chat.completions.create(
        model="starter", messages=history, tools=TOOLS, tool_choice="none", max_tokens=24,
        temperature=0)
    assert answer.choices[0].message.tool_calls is None
    assert answer.choices[0].message.content and answer.choices[0].finish_reason in (
        "stop", "length")
    # the result was in the prompt: it is longer than the question's
    assert usage_of(answer).prompt_tokens > usage_of(first).prompt_tokens - 200
    # under "auto" the reply is either an answer or calls, and always well formed
    auto = client.chat.completions.create(
        model="starter", messages=history, tools=TOOLS, max_tokens=96, temperature=0.7, seed=3)
    message = auto.choices[0].message
    if auto.choices[0].finish_reason == "tool_calls":
        check_calls(message.tool_calls, {"get_weather", "get_time"})
    else:
        assert auto.choices[0].finish_reason in ("stop", "length")
        assert message.tool_calls is None and message.content is not None


def test_named_function_streamed(server: ServerProcess):
    client = client_of(server)
    stream = client.chat.completions.create(
        model="starter", messages=ASK, tools=TOOLS, temperature=0.9, seed=11, stream=True,
        tool_choice={"type": "function", "function": {"name": "get_weather"}})
    calls: dict[int, dict] = {}
    finish = None
    for event in stream:
        for ch in event.choices:
            finish = ch.finish_reason or finish
            for d in ch.delta.tool_calls or []:
                slot = calls.setdefault(d.index, {"id": "", "name": "", "arguments": ""})
                slot["id"] += d.id or ""
                slot["name"] += (d.function.name or "") if d.function else ""
                slot["arguments"] += (d.function.arguments or "") if d.function else ""
    assert finish == "tool_calls" and calls
    for slot in calls.values():
        assert slot["name"] == "get_weather" and slot["id"].startswith("call_")
        jsonschema.validate(json.loads(slot["arguments"]), WEATHER_PARAMS)


def test_native_hermes_calls(hermes_server: ServerProcess):
    client = client_of(hermes_server)
    required = client.chat.completions.create(
        model="hermes-starter", messages=ASK, tools=TOOLS, tool_choice="required",
        temperature=0.8, seed=5)
    assert required.choices[0].finish_reason == "tool_calls"
    calls = required.choices[0].message.tool_calls or []
    check_calls(calls, {"get_weather", "get_time"})
    # the model's own template rendered the tools and the earlier call
    call = calls[0]
    history: list[Any] = [*ASK, required.choices[0].message.model_dump(exclude_none=True),
               {"role": "tool", "tool_call_id": call.id, "content": "18 C"}]
    streamed = client.chat.completions.create(
        model="hermes-starter", messages=history, tools=TOOLS, max_tokens=48,
        temperature=0, stream=True)
    text, finish, deltas = "", None, list[Any]()
    for event in streamed:
        for ch in event.choices:
            text += ch.delta.content or ""
            deltas += ch.delta.tool_calls or []
            finish = ch.finish_reason or finish
    assert "<tool_call>" not in text  # calls never leak into the content
    assert finish in ("stop", "length", "tool_calls")
    assert (finish == "tool_calls") == bool(deltas)


def test_auto_never_answers_nothing(hermes_server: ServerProcess):
    """Under tool_choice auto a model whose first token would end the answer (staged with
    a logit bias on the starter's end tokens) still says something: the end is ruled out
    for the first token, so the reply is a call or text, never an empty success. Without
    tools the same request is allowed its empty answer."""
    ends = {"0": 100, "2": 100}  # <|endoftext|> and <|im_end|>
    client = client_of(hermes_server)
    plain = client.chat.completions.create(
        model="hermes-starter", messages=ASK, max_tokens=8, temperature=0, logit_bias=ends)
    assert plain.choices[0].message.content == ""  # what the bias alone does
    auto = client.chat.completions.create(
        model="hermes-starter", messages=ASK, tools=TOOLS, tool_choice="auto", max_tokens=8,
        temperature=0, logit_bias=ends)
    message = auto.choices[0].message
    assert message.content or message.tool_calls
    assert usage_of(auto).completion_tokens >= 1


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_json_schema_answers_validate(server: ServerProcess, seed: int):
    schema: dict[str, object] = {"type": "object", "properties": {
        "name": {"type": "string", "maxLength": 30},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 12},
                 "maxItems": 3}},
        "required": ["name", "age", "tags"], "additionalProperties": False}
    r = client_of(server).chat.completions.create(
        model="starter", messages=[{"role": "user", "content": "Describe a person as JSON"}],
        response_format={"type": "json_schema",
                         "json_schema": {"name": "person", "schema": schema, "strict": True}},
        temperature=1.0, seed=seed, max_tokens=200)
    assert r.choices[0].finish_reason == "stop"
    jsonschema.validate(json.loads(r.choices[0].message.content or ""), schema)


def test_json_object(server: ServerProcess):
    r = client_of(server).chat.completions.create(
        model="starter", messages=[{"role": "user", "content": "A JSON object about cats"}],
        response_format={"type": "json_object"}, temperature=0.8, seed=0, max_tokens=200,
        frequency_penalty=0.5,  # greedy, this small model repeats a list until the limit
        # alone and independent of the prompt cache: the same answer whatever ran before
        extra_body={"deterministic": True})
    assert r.choices[0].finish_reason == "stop"
    assert isinstance(json.loads(r.choices[0].message.content or ""), dict)


def test_logprobs(server: ServerProcess):
    client = client_of(server)
    r = client.chat.completions.create(
        model="starter", messages=[{"role": "user", "content": "Say hi"}], max_tokens=5,
        temperature=0, logprobs=True, top_logprobs=3)
    logprobs = r.choices[0].logprobs
    assert logprobs is not None and logprobs.content is not None
    content = logprobs.content
    assert len(content) == usage_of(r).completion_tokens == 5
    assert "".join(t.token for t in content) == r.choices[0].message.content
    for t in content:
        assert len(t.top_logprobs) == 3 and t.logprob <= 0
        assert t.top_logprobs[0].logprob >= t.top_logprobs[1].logprob >= t.top_logprobs[2].logprob
        assert t.logprob == pytest.approx(t.top_logprobs[0].logprob)  # greedy: the best one
        assert bytes(t.bytes or []).decode() == t.token
    streamed = client.chat.completions.create(
        model="starter", messages=[{"role": "user", "content": "Say hi"}], max_tokens=5,
        temperature=0, logprobs=True, stream=True)
    tokens = [t.token for ev in streamed for ch in ev.choices if ch.logprobs
              for t in ch.logprobs.content or []]
    assert tokens == [t.token for t in content]
    c = client.completions.create(model="starter", prompt="The capital of France is",
                                  max_tokens=3, temperature=0, logprobs=2)
    lp = c.choices[0].logprobs
    assert lp is not None and lp.tokens and lp.token_logprobs and lp.text_offset
    assert lp.top_logprobs is not None
    assert "".join(lp.tokens) == c.choices[0].text and len(lp.token_logprobs) == 3
    assert lp.text_offset[0] == 0 and all(len(top) == 2 for top in lp.top_logprobs)


def test_refusals_name_what_is_wrong(server: ServerProcess):
    client = client_of(server)

    def refused(**kwargs: object) -> openai.BadRequestError:
        body = {"model": "starter", "messages": ASK, "max_tokens": 2, **kwargs}
        with pytest.raises(openai.BadRequestError) as info:
            client.chat.completions.create(**body)  # type: ignore[call-overload]
        return info.value

    err = refused(extra_body={"reasoning_effort": "high"})
    assert "'reasoning_effort' is not supported" in err.message
    assert body_of(err)["code"] == "unsupported_parameter"
    err = refused(response_format={"type": "json_schema", "json_schema": {
        "name": "x", "schema": {"type": "array", "uniqueItems": True}}})
    assert "uniqueItems" in err.message
    err = refused(tools=TOOLS, tool_choice={"type": "function", "function": {"name": "nope"}})
    assert "'nope'" in err.message and "get_weather" in err.message
    err = refused(tool_choice="required")
    assert "no tools" in err.message
    err = refused(messages=[{"role": "user", "content": [
        {"type": "text", "text": "What is this?"},
        {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PNG}"}}]}])
    assert body_of(err)["code"] == "vision_not_supported" and "mmproj" in err.message
    err = refused(logit_bias={"99999999": 5})
    assert "99999999" in err.message and "vocabulary" in err.message


def test_a_schema_that_admits_nothing_is_a_400_on_every_route(server: ServerProcess):
    # a reference to itself and nothing else, and an object that must contain itself
    selfish: dict[str, Any] = {"$defs": {"a": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"}
    endless = {"type": "object", "properties": {"x": {"$ref": "#"}}, "required": ["x"]}
    user = [{"role": "user", "content": "Hi"}]
    bodies = [
        ("/v1/chat/completions", {"model": "starter", "messages": user, "max_tokens": 8,
                                  "response_format": {"type": "json_schema", "json_schema": {
                                      "name": "x", "schema": selfish}}}),
        ("/v1/chat/completions", {"model": "starter", "messages": user, "max_tokens": 8,
                                  "tool_choice": "required", "tools": [{
                                      "type": "function", "function": {
                                          "name": "f", "parameters": endless}}]}),
        ("/v1/messages", {"model": "starter", "messages": user, "max_tokens": 8,
                          "tool_choice": {"type": "any"},
                          "tools": [{"name": "f", "input_schema": endless}]}),
        ("/api/chat", {"model": "starter", "messages": user, "stream": False,
                       "format": selfish}),
    ]
    for path, body in bodies:
        r = httpx.post(server.base + path, json=body, timeout=120)
        assert r.status_code == 400, (path, r.text)
        message = r.json()["error"]
        message = message if isinstance(message, str) else message["message"]
        assert "admits no value" in message and "Stop:" not in message, (path, message)


def test_tool_schemas_written_for_cloud_apis_still_work(server: ServerProcess):
    """Agents send schemas with keywords the grammar engine cannot enforce: those go
    unenforced rather than refusing the request (response_format still refuses them)."""
    tools: list[ChatCompletionFunctionToolParam] = [
        {"type": "function", "function": {"name": "fetch", "parameters": {
        "type": "object",
        "properties": {"url": {"type": "string", "format": "uri-reference", "maxLength": 60},
                       "tags": {"type": "array", "items": {"type": "string", "maxLength": 10},
                                "uniqueItems": True, "maxItems": 2}},
        "required": ["url"]}}}]
    r = client_of(server).chat.completions.create(
        model="starter", messages=[{"role": "user", "content": "Fetch example.com"}],
        tools=tools, tool_choice="required", parallel_tool_calls=False, temperature=0)
    (call,) = r.choices[0].message.tool_calls or []
    assert call.type == "function" and call.function.name == "fetch"
    assert isinstance(json.loads(call.function.arguments)["url"], str)


def test_openai_hints_are_accepted_and_store_is_refused(server: ServerProcess):
    client = client_of(server)
    r = client.chat.completions.create(
        model="starter", messages=ASK, max_tokens=2, store=False, metadata={"a": "b"},
        service_tier="auto", extra_body={"prompt_cache_key": "k", "safety_identifier": "u1"})
    assert r.choices[0].message.content is not None
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model="starter", messages=ASK, max_tokens=2, store=True)
    assert "store=true" in info.value.message


TWO_CITIES: list[ChatCompletionMessageParam] = [
    {"role": "user", "content": "What is the weather in Paris and in London?"}
]


@pytest.mark.parametrize("which", ["generic", "hermes"])
def test_one_call_unless_parallel_calls_are_asked(
    which: str, server: ServerProcess, hermes_server: ServerProcess
):
    """A required call on a small model is one call (llama-server's default too); with
    parallel_tool_calls it is at most MAX_PARALLEL_CALLS, none repeating the one before."""
    srv, model = (server, "starter") if which == "generic" else (hermes_server, "hermes-starter")
    client = client_of(srv)
    one = client.chat.completions.create(
        model=model, messages=TWO_CITIES, tools=TOOLS, tool_choice="required",
        temperature=0, max_tokens=300)
    assert one.choices[0].finish_reason == "tool_calls"
    assert len(one.choices[0].message.tool_calls or []) == 1
    assert not one.choices[0].message.content
    many = client.chat.completions.create(
        model=model, messages=TWO_CITIES, tools=TOOLS, tool_choice="required",
        parallel_tool_calls=True, temperature=0, max_tokens=600)
    calls = many.choices[0].message.tool_calls or []
    check_calls(calls, {"get_weather", "get_time"})
    assert len(calls) <= 8
    said = [(c.function.name, c.function.arguments) for c in calls if c.type == "function"]
    assert all(a != b for a, b in itertools.pairwise(said))
    assert not many.choices[0].message.content


@pytest.mark.parametrize("which", ["generic", "hermes"])
def test_a_call_cut_by_its_token_limit_never_reaches_the_content(
    which: str, server: ServerProcess, hermes_server: ServerProcess
):
    srv, model = (server, "starter") if which == "generic" else (hermes_server, "hermes-starter")
    cut = client_of(srv).chat.completions.create(
        model=model, messages=ASK, tools=TOOLS, tool_choice="required", temperature=0,
        max_tokens=6)
    choice = cut.choices[0]
    assert choice.finish_reason == "length"
    assert not choice.message.tool_calls  # no call was finished in 6 tokens
    assert not choice.message.content  # and the half-written one is not passed on as text
