"""A thinking model's reasoning, apart from its answer: `reasoning_content` on the OpenAI
route (whole and streamed), `message.thinking` on Ollama's, `thinking` content blocks on
Anthropic's (whole and streamed as thinking_delta), and thinking turned off
through the template (`chat_template_kwargs` / Ollama's `think`). The starter with a
Qwen3-style template: its generation prompt opens a think block unless thinking is off."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import anthropic
import httpx
import openai
import pytest
from anthropic.types import MessageParam
from openai.types.chat import ChatCompletionMessageParam

from localllm.backends.base import ModelRef
from tests.conftest import ServerProcess, starts_process
from tests.gguf_fixtures import copy_with_metadata

THINKING_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n"
    "{% else %}<think>\n{% endif %}{% endif %}"
)
ASK: list[ChatCompletionMessageParam] = [{"role": "user", "content": "What is two plus two?"}]


def thinking_model(starter_ref: ModelRef, folder: Path) -> Path:
    return copy_with_metadata(starter_ref.path, folder / "thinker.gguf",
                              {"tokenizer.chat_template": THINKING_TEMPLATE})


@pytest.fixture(scope="module")
@starts_process
def thinker(tmp_path_factory: pytest.TempPathFactory, starter_ref: ModelRef
            ) -> Iterator[ServerProcess]:
    tmp = tmp_path_factory.mktemp("thinker")
    srv = ServerProcess(tmp, "--model", str(thinking_model(starter_ref, tmp)), "--ctx", "1024")
    yield srv
    srv.stop()


def test_reasoning_comes_apart_from_the_answer(thinker: ServerProcess):
    client = openai.OpenAI(base_url=thinker.base + "/v1", api_key="unused", max_retries=0)
    whole = client.chat.completions.create(model="thinker", messages=ASK, max_tokens=12,
                                           temperature=0)
    message = whole.choices[0].message
    # the prompt opened the block and 12 tokens do not close it: all of it is reasoning
    assert message.model_extra is not None
    thought = message.model_extra["reasoning_content"]
    assert thought.strip() and message.content == "" and "<think>" not in thought
    streamed = client.chat.completions.create(model="thinker", messages=ASK, max_tokens=12,
                                              temperature=0, stream=True)
    pieces = [e.choices[0].delta for e in streamed if e.choices]
    assert "".join((d.model_extra or {}).get("reasoning_content") or "" for d in pieces) == thought
    assert not "".join(d.content or "" for d in pieces)
    off = client.chat.completions.create(
        model="thinker", messages=ASK, max_tokens=12, temperature=0,
        extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    assert off.choices[0].message.content and "reasoning_content" not in (
        off.choices[0].message.model_extra or {})


def test_ollama_thinking_field(thinker: ServerProcess):
    on = httpx.post(thinker.base + "/api/chat", timeout=60, json={
        "model": "thinker", "messages": ASK, "stream": False,
        "options": {"num_predict": 12, "temperature": 0}}).json()
    assert on["message"]["thinking"] and on["message"]["content"] == ""
    off = httpx.post(thinker.base + "/api/chat", timeout=60, json={
        "model": "thinker", "messages": ASK, "stream": False, "think": False,
        "options": {"num_predict": 12, "temperature": 0}}).json()
    assert off["message"]["content"] and "thinking" not in off["message"]


def test_anthropic_thinking_blocks(thinker: ServerProcess):
    client = anthropic.Anthropic(base_url=thinker.base, api_key="unused", max_retries=0)
    ask: list[MessageParam] = [{"role": "user", "content": "What is two plus two?"}]
    whole = client.messages.create(model="thinker", max_tokens=12, messages=ask,
                                   extra_body={"temperature": 0})
    # the prompt opened the block and 12 tokens do not close it: all of it is thinking
    assert [b.type for b in whole.content] == ["thinking"]  # no answer text yet
    (thinking,) = whole.content
    assert thinking.type == "thinking" and thinking.thinking and "<think>" not in thinking.thinking
    with client.messages.stream(model="thinker", max_tokens=12, messages=ask,
                                extra_body={"temperature": 0}) as stream:
        events = list(stream)
        final = stream.get_final_message()
    deltas = [e.delta for e in events if e.type == "content_block_delta"]
    streamed = "".join(d.thinking for d in deltas if d.type == "thinking_delta")
    assert streamed.strip() == thinking.thinking
    assert not [d for d in deltas if d.type == "text_delta"]
    assert final.content[0].type == "thinking"
    # a client sends the thinking block back with the next turn (as Claude Code does)
    again: list[MessageParam] = [*ask, {"role": "assistant", "content": whole.content},
                                 {"role": "user", "content": "And three plus three?"}]
    follow = client.messages.create(model="thinker", max_tokens=4, messages=again,
                                    extra_body={"temperature": 0})
    assert follow.content and follow.content[0].type == "thinking"
