"""Ollama's request bodies (pydantic; a field we do not know, such as an option localllm
does not honour, is a 400 naming it) and the model name rule its clients follow."""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from fastapi import Request
from pydantic import Field

from localllm.backends import media
from localllm.backends.base import Message, SamplingParams, ToolCall
from localllm.backends.tools import ToolChoice, ToolSpec, new_call_id
from localllm.engine import grammar
from localllm.errors import InvalidRequest
from localllm.server import media as smedia
from localllm.server import tolerance, wire
from localllm.server.serving import who


class Options(wire.Wire):
    """Ollama's `options`: the sampling ones localllm honours; the runtime hints clients
    send (num_thread, num_gpu, use_mmap, ...: server/tolerance.py) are accepted and
    ignored; others (mirostat, ...) are a 400 naming them, as every unknown field is."""

    IGNORED = tolerance.names(tolerance.OLLAMA_OPTIONS)

    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    top_k: int | None = Field(default=None, ge=0)
    min_p: float | None = Field(default=None, ge=0.0, le=1.0)
    num_predict: int | None = Field(default=None, ge=-2)  # -1, -2: until the context ends
    num_ctx: int | None = Field(default=None, ge=16, le=1 << 20)
    stop: list[wire.Text] | None = Field(default=None, max_length=wire.MAX_STOP_STRINGS)
    seed: int | None = None
    repeat_penalty: float | None = Field(default=None, gt=0.0, le=10.0)
    frequency_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    presence_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)

    def sampling(self, grammar_text: str | None) -> SamplingParams:
        limit = self.num_predict if self.num_predict and self.num_predict > 0 else None
        return SamplingParams.asked(
            temperature=self.temperature,
            top_p=self.top_p,
            top_k=self.top_k,
            min_p=self.min_p,
            repeat_penalty=self.repeat_penalty,
            frequency_penalty=self.frequency_penalty,
            presence_penalty=self.presence_penalty,
            seed=self.seed,
            max_tokens=limit,
            stop=tuple(s for s in self.stop or () if s) or None,
            grammar=grammar_text,
        )


class OllamaFunction(wire.Wire):
    name: wire.Text
    arguments: dict[str, Any] = Field(default_factory=dict)
    index: int | None = None  # newer Ollama numbers the calls


class OllamaToolCall(wire.Wire):
    function: OllamaFunction
    id: wire.Text | None = None
    type: Literal["function"] | None = None


class OllamaMessage(wire.Wire):
    role: Literal["system", "user", "assistant", "tool"]
    content: wire.Text = ""
    images: list[str] | None = None
    tool_calls: list[OllamaToolCall] | None = None
    tool_name: wire.Text | None = None
    thinking: wire.Text | None = None  # a thinking model's reasoning, sent back: not rendered

    def to_message(self) -> Message:
        items = smedia.base64_media(self.images or (), param="images")
        text = media.with_markers(smedia.check_text(self.content, param="content"), items)
        calls = tuple(
            ToolCall(
                c.id or new_call_id(),
                c.function.name,
                json.dumps(c.function.arguments, ensure_ascii=False),
            )
            for c in self.tool_calls or ()
        )
        name = self.tool_name if self.role == "tool" else None
        return Message(self.role, text, tool_calls=calls, name=name, media=items)


class _Common(wire.Wire):
    model: wire.Name
    format: Literal["json", ""] | dict[str, Any] | None = None
    options: Options | None = None
    stream: bool = True
    keep_alive: wire.KeepAlive = None
    think: bool | None = None

    def grammar(self) -> str | None:
        if not self.format:
            return None
        if self.format == "json":
            return grammar.any_json_object()
        assert isinstance(self.format, dict)
        return grammar.from_json_schema(self.format, param="format")

    def sampling(self) -> SamplingParams:
        return (self.options or Options()).sampling(self.grammar())

    def engine_fields(self, request: Request) -> dict[str, Any]:
        options = self.options or Options()
        return {
            "model": model_name(self.model),
            "keep_alive": self.keep_alive,
            "min_ctx": options.num_ctx,
            "template_vars": None if self.think is None else {"enable_thinking": self.think},
            **who(request),
        }


class ChatBody(_Common):
    messages: list[OllamaMessage] = Field(default_factory=list)
    tools: Annotated[list[wire.ToolDef] | None, wire.ToolCount] = None

    def tool_spec(self) -> ToolSpec | None:
        functions = [t.function.model_dump(exclude_none=True) for t in self.tools or ()]
        return wire.tool_spec(functions, ToolChoice())


class GenerateBody(_Common):
    prompt: wire.Text = ""
    suffix: wire.Text | None = None
    system: wire.Text | None = None
    raw: bool = False
    images: list[str] | None = None


class NameBody(wire.Wire):
    model: wire.Name | None = None
    name: wire.Name | None = None  # older clients say `name`
    verbose: bool | None = None

    def which(self) -> str:
        chosen = self.model or self.name
        if not chosen:
            raise InvalidRequest("'model' is required", param="model")
        return model_name(chosen)


class PullBody(NameBody):
    stream: bool = True
    insecure: bool | None = None


def model_name(name: str) -> str:
    """Ollama clients add the default tag ":latest" to a bare name; it names the model."""
    return name.removesuffix(":latest")
