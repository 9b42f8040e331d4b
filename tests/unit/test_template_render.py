"""Chat templates render what their authors wrote: the starter's own template, and
Gemma-style and Llama-3-style templates (written for these tests) with tools, tool calls,
tool results, loop controls, tojson, strftime_now and {% generation %}."""

from __future__ import annotations

import datetime

import pytest

from localllm.backends import chat_template
from localllm.backends.base import Message, ToolCall
from localllm.models.gguf import read_gguf
from localllm.models.starter import starter_path
from tests.unit.test_tools import GEMMA_LIKE, WEATHER

LLAMA3_LIKE = (
    "{{ bos_token }}<|start_header_id|>system<|end_header_id|>\n\n"
    "{% if tools %}Environment: ipython\n{% endif %}"
    "Today Date: {{ strftime_now('%d %b %Y') }}\n"
    "{% if tools %}Call a function by replying with JSON:\n"
    "{% for t in tools %}{{ t | tojson(indent=2) }}\n{% endfor %}{% endif %}"
    "<|eot_id|>"
    "{% for m in messages %}"
    "{% if m.role == 'system' %}{% continue %}{% endif %}"
    "{% if m.role == 'assistant' and m.tool_calls %}"
    "<|start_header_id|>assistant<|end_header_id|>\n\n"
    "{% for c in m.tool_calls %}<|python_tag|>{\"name\": \"{{ c.function.name }}\", "
    "\"parameters\": {{ c.function.arguments | tojson }}}{% endfor %}<|eom_id|>"
    "{% elif m.role == 'tool' %}<|start_header_id|>ipython<|end_header_id|>\n\n"
    "{{ m.content }}<|eot_id|>"
    "{% else %}<|start_header_id|>{{ m.role }}<|end_header_id|>\n\n"
    "{% generation %}{{ m.content | trim }}{% endgeneration %}<|eot_id|>{% endif %}"
    "{% if loop.index >= 50 %}{% break %}{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
)


def render(template: str | None, messages: list[Message], **variables: object) -> str:
    return chat_template.render(
        template, messages, bos_token="<s>", eos_token="</s>", variables=variables
    )


def test_the_starters_own_template():
    path = starter_path()
    assert path is not None
    template = read_gguf(path).chat_template
    text = render(template, [Message("user", "Hi")])
    assert text == (
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
        "Face<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    )
    with_system = render(template, [Message("system", "Be terse."), Message("user", "Hi")])
    assert with_system == (
        "<|im_start|>system\nBe terse.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
        "<|im_start|>assistant\n"
    )


def test_gemma_style_template():
    text = render(GEMMA_LIKE, [Message("system", "Be terse."), Message("user", "Hi "),
                               Message("assistant", "Hello."), Message("user", "Bye")])
    assert text == (
        "<s><start_of_turn>user\nBe terse.\n\nHi<end_of_turn>\n"
        "<start_of_turn>model\nHello.<end_of_turn>\n"
        "<start_of_turn>user\nBye<end_of_turn>\n<start_of_turn>model\n"
    )


def test_llama3_style_template_with_tools_calls_and_results():
    today = datetime.datetime.now().strftime("%d %b %Y")
    messages = [
        Message("system", "ignored by this template"),
        Message("user", "Weather in Zürich?"),
        Message("assistant", "", tool_calls=(
            ToolCall("call_1", "get_weather", '{"city": "Zürich <CH>"}'),)),
        Message("tool", '{"temp": 3}', tool_call_id="call_1", name="get_weather"),
    ]
    text = render(LLAMA3_LIKE, messages, tools=[{"type": "function", "function": WEATHER}])
    assert text == (
        "<s><|start_header_id|>system<|end_header_id|>\n\nEnvironment: ipython\n"
        f"Today Date: {today}\nCall a function by replying with JSON:\n"
        '{\n  "type": "function",\n  "function": {\n    "name": "get_weather",\n'
        '    "description": "Weather in a city",\n    "parameters": {\n'
        '      "type": "object",\n      "properties": {\n        "city": {\n'
        '          "type": "string"\n        }\n      },\n      "required": [\n'
        '        "city"\n      ]\n    }\n  }\n}\n<|eot_id|>'
        "<|start_header_id|>user<|end_header_id|>\n\nWeather in Zürich?<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n"
        '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Zürich <CH>"}}<|eom_id|>'
        '<|start_header_id|>ipython<|end_header_id|>\n\n{"temp": 3}<|eot_id|>'
        "<|start_header_id|>assistant<|end_header_id|>\n\n"
    )
    # tojson writes neither \\u00fc nor \\u003c; without tools the template says less
    plain = render(LLAMA3_LIKE, [Message("user", "Hi")])
    assert "ipython" not in plain
    assert plain.endswith("<|start_header_id|>assistant<|end_header_id|>\n\n")


def test_template_variables_and_raise_exception():
    thinking = "{% if enable_thinking is defined and not enable_thinking %}/no_think{% endif %}"
    assert render(thinking, [Message("user", "x")], enable_thinking=False) == "/no_think"
    assert render(thinking, [Message("user", "x")]) == ""
    with pytest.raises(Exception, match="rejected the messages: no"):
        render("{{ raise_exception('no') }}", [Message("user", "x")])
