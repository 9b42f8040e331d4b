"""A thinking model's reasoning, apart from its answer: `reasoning_content` on the OpenAI
route (whole and streamed), `message.thinking` on Ollama's, and thinking turned off
through the template (`chat_template_kwargs` / Ollama's `think`). The starter with a
Qwen3-style template: its generation prompt opens a think block unless thinking is off."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam

from localllm.backends.base import ModelRef
from tests.conftest import ServerProcess
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
