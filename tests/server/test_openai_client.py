"""The endpoint through the official `openai` client, on a real server process."""

from __future__ import annotations

import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam

from tests.conftest import ServerProcess, usage_of


@pytest.fixture(scope="module")
def client(server: ServerProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base + "/v1", api_key="unused", max_retries=0)


MSG: list[ChatCompletionMessageParam] = [
    {"role": "system", "content": "You are a zoologist who answers briefly. " * 6},
    {"role": "user", "content": "Name three animals."},
]


def test_models_and_health(client: openai.OpenAI, server: ServerProcess):
    ids = [m.id for m in client.models.list()]
    assert "starter" in ids
    assert server.health()["status"] == "ok"


def test_greedy_stream_equals_non_stream(client: openai.OpenAI):
    full = client.chat.completions.create(model="starter", messages=MSG, max_tokens=24,
                                          temperature=0)
    again = client.chat.completions.create(model="starter", messages=MSG, max_tokens=24,
                                           temperature=0)
    parts: list[str] = []
    finish, usage = None, None
    for ev in client.chat.completions.create(model="starter", messages=MSG, max_tokens=24,
                                             temperature=0, stream=True,
                                             stream_options={"include_usage": True}):
        if ev.usage is not None:
            usage = ev.usage
        for ch in ev.choices:
            parts.append(ch.delta.content or "")
            finish = ch.finish_reason or finish
    text = full.choices[0].message.content
    assert text and text == again.choices[0].message.content
    assert "".join(parts) == text
    assert finish == full.choices[0].finish_reason
    assert usage is not None and usage.completion_tokens == usage_of(full).completion_tokens
    assert usage.prompt_tokens == usage_of(full).prompt_tokens
    # the identical prompt was served from the KV cache the second and third time, all of
    # it: the logits its last token gave, which pick the first answer token, were kept
    assert usage.prompt_tokens_details is not None
    cached = usage.prompt_tokens_details.cached_tokens
    assert cached == usage.prompt_tokens


def test_max_tokens_gives_length_with_exactly_that_many(client: openai.OpenAI):
    r = client.chat.completions.create(
        messages=[{"role": "user", "content": "Write a long story about a castle."}],
        model="starter", max_completion_tokens=9, temperature=0)
    assert r.choices[0].finish_reason == "length"
    usage = usage_of(r)
    assert usage.completion_tokens == 9
    assert usage.total_tokens == usage.prompt_tokens + 9


def test_stop_strings_string_and_list(client: openai.OpenAI):
    prompt: list[ChatCompletionMessageParam] = [
        {"role": "user", "content": "Count from 1 to 10, separated by commas."}
    ]
    free = client.chat.completions.create(model="starter", messages=prompt, max_tokens=30,
                                          temperature=0).choices[0].message.content
    assert free is not None and "5" in free
    for stop in ("5", ["zzz", "5"]):
        r = client.chat.completions.create(model="starter", messages=prompt, max_tokens=30,
                                           temperature=0, stop=stop)
        assert r.choices[0].message.content == free[: free.index("5")]
        assert r.choices[0].finish_reason == "stop"


def test_system_and_text_parts(client: openai.OpenAI):
    r = client.chat.completions.create(
        model="starter", temperature=0, max_tokens=8,
        messages=[{"role": "system", "content": "You answer in one word."},
                  {"role": "user", "content": [{"type": "text", "text": "Capital of "},
                                               {"type": "text", "text": "France?"}]}])
    assert r.choices[0].message.content
    assert r.choices[0].message.role == "assistant"


def test_non_ascii_is_valid_utf8_without_replacements(client: openai.OpenAI):
    out = []
    for ev in client.completions.create(model="starter", prompt="Emoji party: 🎉🎉",
                                        max_tokens=9, temperature=0, stream=True):
        out.append(ev.choices[0].text if ev.choices else "")
    text = "".join(out)
    assert any(ord(c) > 127 for c in text), text
    assert "\ufffd" not in text


def test_completions_with_seed_repeat(client: openai.OpenAI):
    kw = dict(model="starter", prompt="Once upon a time", max_tokens=10, temperature=0.9,
              seed=42)
    a = client.completions.create(**kw)  # type: ignore[call-overload]
    b = client.completions.create(**kw)  # type: ignore[call-overload]
    assert a.choices[0].text == b.choices[0].text
    assert a.object == "text_completion" and usage_of(a).completion_tokens <= 10


def test_unknown_model_is_404_listing_local_models(client: openai.OpenAI):
    with pytest.raises(openai.NotFoundError) as err:
        client.chat.completions.create(model="gpt-4o", messages=MSG, max_tokens=2)
    body = err.value.body
    assert isinstance(body, dict) and body["code"] == "model_not_found"
    assert "starter" in body["message"] and body["param"] == "model"


def test_bad_parameter_is_400_naming_the_field(client: openai.OpenAI):
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model="starter", messages=MSG, temperature=7)
    assert err.value.body["param"] == "temperature"  # type: ignore[index]
    assert "2" in err.value.body["message"]  # type: ignore[index]
    with pytest.raises(openai.BadRequestError, match="only n=1"):
        client.chat.completions.create(model="starter", messages=MSG, n=2)
