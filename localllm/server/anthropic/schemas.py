"""The Anthropic Messages API's request bodies (pydantic; a field we do not know is a 400
naming it) and how their content blocks map onto the engine's messages."""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import Field

from localllm.backends.base import MEDIA_MARKER, Media, Message, SamplingParams, ToolCall
from localllm.backends.tools import ToolChoice, ToolSpec
from localllm.engine import grammar
from localllm.errors import InvalidRequest
from localllm.server import media as smedia
from localllm.server import tolerance, wire


class CacheControl(wire.Wire):
    type: Literal["ephemeral"]
    ttl: str | None = None


class TextBlock(wire.Wire):
    type: Literal["text"]
    text: wire.Text
    cache_control: CacheControl | None = None
    citations: list[Any] | None = None


class ImageBlock(wire.Wire):
    type: Literal["image", "document"]
    source: dict[str, Any]
    cache_control: CacheControl | None = None


class ToolUseBlock(wire.Wire):
    type: Literal["tool_use"]
    id: wire.Text
    name: wire.Text
    input: dict[str, Any]
    cache_control: CacheControl | None = None


class ToolResultBlock(wire.Wire):
    type: Literal["tool_result"]
    tool_use_id: wire.Text
    content: wire.Text | list[TextBlock | ImageBlock] = ""
    is_error: bool | None = None
    cache_control: CacheControl | None = None

    def to_message(self, fetched: smedia.Fetched) -> Message:
        """The result as a tool message (its images placed where they are in it)."""
        items: list[Media] = []
        if isinstance(self.content, str):
            body = self.content
        else:
            body = "".join(_text_of(b, items, fetched) for b in self.content)
        body = f"Error: {body}" if self.is_error else body
        return Message("tool", body, tool_call_id=self.tool_use_id, media=tuple(items))


class ThinkingBlock(wire.Wire):
    """An earlier answer's reasoning, as a client sends it back: not rendered (templates
    leave an earlier turn's thinking out of the prompt)."""

    type: Literal["thinking"]
    thinking: wire.Text
    signature: str | None = None  # the blocks localllm sends carry an empty one


class RedactedThinkingBlock(wire.Wire):
    type: Literal["redacted_thinking"]
    data: str


Block = (
    TextBlock | ImageBlock | ToolUseBlock | ToolResultBlock | ThinkingBlock | RedactedThinkingBlock
)


def _text_of(block: Block, items: list[Media], fetched: smedia.Fetched) -> str:
    """A block's text; an image block adds its image to `items` and gives its marker."""
    if isinstance(block, ImageBlock):
        if block.type == "document":
            raise InvalidRequest(
                "document blocks (PDF and plain-text documents) are not read by localllm: "
                "send the text as a text block, or pages as images",
                param="messages",
                code="unsupported_media",
            )
        items.append(smedia.image_source(block.source, param="messages", fetched=fetched))
        return MEDIA_MARKER
    if isinstance(block, TextBlock):
        return smedia.check_text(block.text, param="messages")
    return ""  # thinking: not rendered


def _image_urls(blocks: list[Any]) -> list[str]:
    out = []
    for b in blocks:
        if isinstance(b, ImageBlock) and b.source.get("type") == "url":
            out.append(str(b.source.get("url")))
        elif isinstance(b, ToolResultBlock) and isinstance(b.content, list):
            out += _image_urls(b.content)
    return out


class AnthropicMessage(wire.Wire):
    # "system": Claude Code's mid-conversation system messages (its anthropic-beta
    # "mid-conversation-system"), kept in place; engine/prompt.py moves them into the next
    # user turn for a template that takes a system message only first
    role: Literal["user", "assistant", "system"]
    content: wire.Text | list[Block]

    def to_messages(self, fetched: smedia.Fetched) -> list[Message]:
        if isinstance(self.content, str):
            return [Message(self.role, smedia.check_text(self.content, param="messages"))]
        items: list[Media] = []
        if self.role == "system":
            text = "".join(_text_of(b, items, fetched) for b in self.content)
            return [Message("system", text, media=tuple(items))]
        out: list[Message] = []
        parts: list[str] = []
        calls: list[ToolCall] = []
        for block in self.content:
            if isinstance(block, ToolResultBlock):
                out.append(block.to_message(fetched))
            elif isinstance(block, ToolUseBlock):
                arguments = json.dumps(block.input, ensure_ascii=False)
                calls.append(ToolCall(block.id, block.name, arguments))
            else:
                parts.append(_text_of(block, items, fetched))
        if parts or calls or not out:
            out.append(
                Message(self.role, "".join(parts), tool_calls=tuple(calls), media=tuple(items))
            )
        return out


class AnthropicTool(wire.Wire):
    name: str = Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")
    description: wire.Text | None = None
    input_schema: dict[str, Any]
    cache_control: CacheControl | None = None
    type: Literal["custom"] | None = None


class AnthropicToolChoice(wire.Wire):
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool | None = None


class Metadata(wire.Wire):
    user_id: str | None = None


class Thinking(wire.Wire):
    """Extended thinking. For a model that thinks (its template reads `enable_thinking`),
    enabled and adaptive turn it on and disabled off; for one that does not, there is
    nothing to turn on and the answer is the same. The budget is not enforced (the
    answer's max_tokens bounds thinking and text together, as Anthropic's does)."""

    type: Literal["enabled", "disabled", "adaptive"]
    budget_tokens: int | None = Field(default=None, ge=0)


class OutputFormat(wire.Wire):
    type: Literal["json_schema"]
    schema_: dict[str, Any] = Field(alias="schema")


class OutputConfig(wire.Wire):
    """Claude Code's effort (passed to the template as `reasoning_effort`, which thinking
    models such as gpt-oss read; others answer the same) and structured output, honoured
    through the grammar."""

    effort: Literal["low", "medium", "high", "max"] | None = None
    format: OutputFormat | None = None


class _Prompt(wire.Wire):
    IGNORED = tolerance.names(tolerance.ANTHROPIC)

    model: wire.Name
    messages: list[AnthropicMessage] = Field(min_length=1)
    system: wire.Text | list[TextBlock] | None = None
    tools: Annotated[list[AnthropicTool] | None, wire.ToolCount] = None
    tool_choice: AnthropicToolChoice | None = None
    thinking: Thinking | None = None
    output_config: OutputConfig | None = None

    def template_vars(self) -> dict[str, Any] | None:
        """What the chat template is told of thinking and effort (None: nothing)."""
        out: dict[str, Any] = {}
        if self.thinking is not None:
            out["enable_thinking"] = self.thinking.type != "disabled"
        if self.output_config is not None and self.output_config.effort is not None:
            out["reasoning_effort"] = self.output_config.effort
        return out or None

    def image_urls(self) -> list[str]:
        """The http(s) image URLs in the messages, to fetch first (server/media.py)."""
        return [
            u for m in self.messages if isinstance(m.content, list) for u in _image_urls(m.content)
        ]

    def engine_messages(self, fetched: smedia.Fetched | None = None) -> list[Message]:
        out: list[Message] = []
        if self.system:
            system = self.system
            text = system if isinstance(system, str) else "".join(b.text for b in system)
            out.append(Message("system", smedia.check_text(text, param="system")))
        for m in self.messages:
            out += m.to_messages(fetched or {})
        return out

    def tool_spec(self) -> ToolSpec | None:
        choice = self.tool_choice or AnthropicToolChoice(type="auto")
        parallel = not choice.disable_parallel_tool_use
        if choice.type == "tool":
            picked = ToolChoice("function", choice.name, parallel)
        else:
            mode = {"auto": "auto", "any": "required", "none": "none"}[choice.type]
            picked = ToolChoice(mode, None, parallel)  # type: ignore[arg-type]
        functions = [
            {"name": t.name, "parameters": t.input_schema}
            | ({"description": t.description} if t.description else {})
            for t in self.tools or ()
        ]
        return wire.tool_spec(functions, picked)


class MessagesBody(_Prompt):
    max_tokens: int = Field(ge=1)
    stop_sequences: list[wire.Text] | None = Field(default=None, max_length=wire.MAX_STOP_STRINGS)
    stream: bool = False
    temperature: float | None = Field(default=None, ge=0.0, le=1.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    top_k: int | None = Field(default=None, ge=0)
    metadata: Metadata | None = None  # the caller's user id: not used

    def sampling(self) -> SamplingParams:
        out = self.output_config.format if self.output_config else None
        return SamplingParams.asked(
            temperature=self.temperature,
            top_p=self.top_p,
            top_k=self.top_k,
            max_tokens=self.max_tokens,
            stop=tuple(s for s in self.stop_sequences or () if s) or None,
            grammar=grammar.from_json_schema(out.schema_ or {"type": "object"}) if out else None,
        )


class CountBody(_Prompt):
    pass
