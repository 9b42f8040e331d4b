"""System messages after the first turn (Claude Code's mid-conversation system beta):
kept in place where the template takes them, moved into the next user turn where the
template takes a system message only first (as Gemma's and Mistral's templates do)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from types import SimpleNamespace
from typing import Any

from localllm.backends import chat_template
from localllm.backends.base import Message, SamplingParams
from localllm.engine.prompt import inline_late_system, render_messages
from localllm.engine.request import Request

# shaped as the strict templates are: a system message is read first, then roles alternate
STRICT = (
    "{% if messages[0].role == 'system' %}{% set rest = messages[1:] %}"
    "[SYS]{{ messages[0].content }}[/SYS]{% else %}{% set rest = messages %}{% endif %}"
    "{% for m in rest %}"
    "{% if (m.role == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant') }}"
    "{% endif %}[{{ m.role }}]{{ m.content }}{% endfor %}[assistant]"
)
CHATML = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "<|im_start|>assistant\n"
)


class TemplateModel:
    """Just enough of a loaded model to render a chat with a given template."""

    def __init__(self, template: str) -> None:
        self.info = SimpleNamespace(chat_template=template)
        self.text = ""

    def render_chat(
        self, messages: Sequence[Message], variables: Mapping[str, Any] | None = None
    ) -> list[int]:
        self.text = chat_template.render(
            self.info.chat_template, messages, bos_token="", eos_token="", variables=variables
        )
        return list(self.text.encode())


CONVERSATION = [
    Message("system", "Be brief."),
    Message("user", "Hi"),
    Message("assistant", "Hello"),
    Message("system", "The user prefers French."),
    Message("user", "How are you?"),
    Message("system", "Reminder: tools are off."),
]


def render(template: str) -> str:
    model = TemplateModel(template)
    render_messages(model, Request(SamplingParams(), messages=CONVERSATION), CONVERSATION)  # type: ignore[arg-type]
    return model.text


def test_a_template_that_takes_them_gets_them_in_place():
    text = render(CHATML)
    assert text.index("<|im_start|>system\nThe user prefers French.") < text.index("How are")
    assert text.count("<|im_start|>system") == 3


def test_a_strict_template_gets_them_in_the_next_user_turn():
    text = render(STRICT)
    assert text.startswith("[SYS]Be brief.[/SYS]")
    assert "[user]The user prefers French.\n\nHow are you?" in text
    assert "Reminder: tools are off." in text  # after the last user turn: added to it
    assert text.endswith("How are you?\n\nReminder: tools are off.[assistant]")


def test_inline_keeps_every_word_and_the_order():
    out = inline_late_system(CONVERSATION)
    assert [m.role for m in out] == ["system", "user", "assistant", "user"]
    assert out[-1].content == "The user prefers French.\n\nHow are you?\n\nReminder: tools are off."
