"""Render a model's chat template (Jinja, from the GGUF or tokenizer metadata)."""

from __future__ import annotations

import datetime
from collections.abc import Sequence
from functools import lru_cache
from typing import Any, NoReturn

from jinja2 import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment

from localllm.backends.base import Message
from localllm.errors import InvalidRequest

# Used when a model carries no template: ChatML, the most common instruct format.
CHATML = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def _raise(message: str) -> NoReturn:
    raise InvalidRequest(
        f"The model's chat template rejected the messages: {message}", param="messages"
    )


def _strftime_now(fmt: str) -> str:
    return datetime.datetime.now().strftime(fmt)


@lru_cache(maxsize=8)
def _compile(source: str) -> Any:
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = _raise
    env.globals["strftime_now"] = _strftime_now
    return env.from_string(source)


def render(
    template: str | None, messages: Sequence[Message], *, bos_token: str, eos_token: str
) -> str:
    """The prompt text for `messages`, ending where the assistant's answer begins."""
    try:
        compiled = _compile(template or CHATML)
        return str(
            compiled.render(
                messages=[{"role": m.role, "content": m.content} for m in messages],
                add_generation_prompt=True,
                bos_token=bos_token,
                eos_token=eos_token,
            )
        )
    except InvalidRequest:
        raise
    except TemplateError as exc:
        raise InvalidRequest(
            f"The model's chat template failed to render: {exc}", param="messages"
        ) from None
