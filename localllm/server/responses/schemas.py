"""OpenAI's Responses API request bodies (`POST /v1/responses`, `/v1/responses/input_tokens`)
and how their input items map onto the engine's messages.

Input items: messages (a string, or `input_text` / `output_text` parts; roles user, system,
developer, assistant), `function_call` and `function_call_output` (and their free-form
twins `custom_tool_call` / `custom_tool_call_output`, and `local_shell_call`: rendered as
tool calls and results), `reasoning` items a client sends back (accepted, not rendered:
templates leave an earlier turn's thinking out) and hosted tools' call records
(`web_search_call`, ...: accepted, left out). Any other item type is a 400 naming it.
Tools: `function` tools are offered to the model; a hosted tool localllm cannot run
(`web_search`, `file_search`, `code_interpreter`, ...) is left out of what the model sees,
as the README says; any other kind is a 400 naming it.
"""

from __future__ import annotations

import functools
import json
from typing import Annotated, Any, Literal, TypeVar

import pydantic
from pydantic import Discriminator, Field, Tag, field_validator

from localllm.backends.base import MEDIA_MARKER, Media, Message, SamplingParams, ToolCall
from localllm.backends.tools import ToolChoice, ToolSpec
from localllm.engine import grammar
from localllm.errors import InvalidRequest
from localllm.server import media as smedia
from localllm.server import tolerance, wire

# hosted tools: run by OpenAI's servers, none of them here
HOSTED = frozenset(
    {
        "web_search",
        "web_search_preview",
        "file_search",
        "code_interpreter",
        "image_generation",
        "computer_use_preview",
        "mcp",
        "tool_search",
    }
)


class Part(wire.Wire):
    type: Literal["input_text", "output_text", "input_image", "input_file", "refusal"]
    text: wire.Text = ""
    annotations: list[Any] | None = None  # output_text sent back: citations, none here
    logprobs: list[Any] | None = None
    refusal: wire.Text | None = None
    image_url: str | None = None
    file_id: str | None = None
    detail: str | None = None

    def plain(self, items: list[Media], fetched: smedia.Fetched) -> str:
        """The part's text; an image adds itself to `items` and gives its marker."""
        if self.type == "input_image" and self.image_url:
            items.append(smedia.image_from_url(self.image_url, param="input", fetched=fetched))
            return MEDIA_MARKER
        if self.type in ("input_image", "input_file"):
            raise InvalidRequest(
                f"{self.type} parts by file_id, and files, are not read by localllm (it "
                "keeps no uploaded files): send an image as an image_url data URL",
                param="input",
                code="unsupported_media",
            )
        if self.type == "refusal":
            return self.refusal or ""
        return smedia.check_text(self.text, param="input")


class MessageItem(wire.Wire):
    type: Literal["message"] = "message"
    role: Literal["user", "system", "developer", "assistant"]
    content: wire.Text | list[Part]
    id: str | None = None
    status: str | None = None
    phase: str | None = None  # Codex's commentary/final_answer mark on an assistant turn

    def message(self, fetched: smedia.Fetched) -> Message:
        text = self.content if isinstance(self.content, str) else ""
        items: list[Media] = []
        if isinstance(self.content, list):
            text = "".join(p.plain(items, fetched) for p in self.content)
        role = "system" if self.role == "developer" else self.role
        return Message(role, text, media=tuple(items))


class FunctionCallItem(wire.Wire):
    type: Literal["function_call"]
    call_id: wire.Text
    name: wire.Text
    arguments: wire.Text
    id: str | None = None
    status: str | None = None
    namespace: str | None = None


class _Output(wire.Wire):
    """A tool's result sent back: its call's id and what it returned."""

    call_id: wire.Text
    output: wire.Text | list[Part]
    id: str | None = None
    status: str | None = None

    def message(self, name: str | None, fetched: smedia.Fetched) -> Message:
        items: list[Media] = []
        if isinstance(self.output, str):
            text = self.output
        else:
            text = "".join(p.plain(items, fetched) for p in self.output)
        return Message("tool", text, tool_call_id=self.call_id, name=name, media=tuple(items))


class FunctionOutputItem(_Output):
    type: Literal["function_call_output"]


class ReasoningItem(wire.Wire):
    type: Literal["reasoning"]
    id: str | None = None
    summary: list[Any] = Field(default_factory=list)
    content: list[Any] | None = None
    encrypted_content: str | None = None
    status: str | None = None


class CustomCallItem(wire.Wire):
    """A call of a free-form tool (Codex's `apply_patch` on models that take it): its
    `input` is the call's text, sent back as the call's arguments."""

    type: Literal["custom_tool_call"]
    call_id: wire.Text
    name: wire.Text
    input: wire.Text
    id: str | None = None
    status: str | None = None


class CustomOutputItem(_Output):
    type: Literal["custom_tool_call_output"]


class LocalShellCallItem(wire.Wire):
    """OpenAI's hosted-shell call (`local_shell` tool): the model's command, kept in the
    prompt as a `local_shell` call with the action as its arguments."""

    type: Literal["local_shell_call"]
    call_id: wire.Text
    action: dict[str, Any]
    id: str | None = None
    status: str | None = None


class HostedCallItem(wire.Wire):
    """The record of a hosted tool's call (a web search, say) a client sends back: no such
    tool was offered here, so the record is accepted and left out of the prompt."""

    type: Literal["web_search_call", "file_search_call", "image_generation_call"]
    id: str | None = None
    status: str | None = None
    action: dict[str, Any] | None = None
    queries: list[Any] | None = None
    results: list[Any] | None = None
    result: str | None = None


_KINDS = (
    "message",
    "function_call",
    "function_call_output",
    "reasoning",
    "custom_tool_call",
    "custom_tool_call_output",
    "local_shell_call",
    "web_search_call",
    "file_search_call",
    "image_generation_call",
)


def _kind(value: Any) -> str | None:
    """An input item's kind: its `type` (a bare {"role", "content"} is a message); None
    for what is not an item at all (pydantic then says what was expected)."""
    # a dict from the wire; else a parsed item, or something that is not an item at all
    kind = value.get("type", "message") if isinstance(value, dict) else getattr(value, "type", None)
    hosted = ("web_search_call", "file_search_call", "image_generation_call")
    return "hosted_call" if kind in hosted else None if kind is None else str(kind)


Item = Annotated[
    Annotated[MessageItem, Tag("message")]
    | Annotated[FunctionCallItem, Tag("function_call")]
    | Annotated[FunctionOutputItem, Tag("function_call_output")]
    | Annotated[ReasoningItem, Tag("reasoning")]
    | Annotated[CustomCallItem, Tag("custom_tool_call")]
    | Annotated[CustomOutputItem, Tag("custom_tool_call_output")]
    | Annotated[LocalShellCallItem, Tag("local_shell_call")]
    | Annotated[HostedCallItem, Tag("hosted_call")],
    Discriminator(
        _kind,
        custom_error_type="invalid_item_type",
        custom_error_message="an input item's type must be one of " + ", ".join(_KINDS),
    ),
]


def _call_of(item: FunctionCallItem | CustomCallItem | LocalShellCallItem) -> ToolCall:
    if isinstance(item, FunctionCallItem):
        return ToolCall(item.call_id, item.name, item.arguments)
    if isinstance(item, CustomCallItem):
        return ToolCall(item.call_id, item.name, item.input)
    return ToolCall(item.call_id, "local_shell", json.dumps(item.action))


def image_urls(items: list[Item]) -> list[str]:
    """The input's image URLs (the http(s) ones are fetched first: server/media.py)."""
    out = []
    for item in items:
        parts = item.content if isinstance(item, MessageItem) else getattr(item, "output", "")
        if isinstance(parts, list):
            out += [p.image_url for p in parts if p.type == "input_image" and p.image_url]
    return out


def messages_of(items: list[Item], fetched: smedia.Fetched | None = None) -> list[Message]:
    """The engine's messages for a list of input items: consecutive calls become one
    assistant turn with several tool calls; their outputs become tool messages."""
    out: list[Message] = []
    names: dict[str, str] = {}
    for item in items:
        if isinstance(item, MessageItem):
            out.append(item.message(fetched or {}))
        elif isinstance(item, FunctionCallItem | CustomCallItem | LocalShellCallItem):
            call = _call_of(item)
            names[item.call_id] = call.name
            last = out[-1] if out else None
            if last is not None and last.role == "assistant":
                out[-1] = Message("assistant", last.content, tool_calls=(*last.tool_calls, call))
            else:
                out.append(Message("assistant", "", tool_calls=(call,)))
        elif isinstance(item, _Output):
            name = names.get(item.call_id)
            out.append(item.message(name, fetched or {}))
    return out


class FunctionTool(wire.Wire):
    type: Literal["function"]
    name: str = Field(pattern=wire.FUNCTION_NAME)
    description: wire.Text | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class NamespaceTool(wire.Wire):
    type: Literal["namespace"]
    name: str = Field(pattern=wire.FUNCTION_NAME)
    description: wire.Text | None = None
    tools: Annotated[list[dict[str, Any]], wire.ToolCount]


class NamedChoice(wire.Wire):
    type: Literal["function"]
    name: str = Field(pattern=wire.FUNCTION_NAME)


class Format(wire.Wire):
    type: Literal["text", "json_object", "json_schema"]
    name: str | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    description: wire.Text | None = None
    strict: bool | None = None


class TextConfig(wire.Wire):
    format: Format | None = None
    verbosity: Literal["low", "medium", "high"] | None = None  # a hint: nothing to tune


class Reasoning(wire.Wire):
    """A thinking model thinks unless `effort` is "none" (its template is told
    enable_thinking and reasoning_effort); the summary kind is accepted, and the model's
    own thinking comes back as the reasoning item's text."""

    effort: Literal["none", "minimal", "low", "medium", "high", "xhigh"] | None = None
    summary: Literal["auto", "concise", "detailed"] | None = None
    generate_summary: Literal["auto", "concise", "detailed"] | None = None


# what `include` may ask for: encrypted reasoning (a local model's reasoning is sent in the
# clear, in the reasoning item, so there is nothing to encrypt)
INCLUDABLE = frozenset({"reasoning.encrypted_content"})


_T = TypeVar("_T", bound=pydantic.BaseModel)


def _tool(kind: type[_T], raw: Any, param: str) -> _T:
    """A tool entry read as `kind`; a malformed one is a 400 naming where it is and what
    is wrong with it (its name's pattern, a missing name, parameters not an object)."""
    try:
        return kind.model_validate(raw)
    except pydantic.ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first.get("loc", ()))
        field = f"{param}.{where}" if where else param
        raise InvalidRequest(f"{field}: {first.get('msg', 'invalid')}", param=field) from None


class ResponsesBody(wire.Wire):
    IGNORED = tolerance.names(tolerance.RESPONSES)

    model: wire.Name | None = None
    input: wire.Text | list[Item] = Field(default_factory=list)
    instructions: wire.Text | None = None
    tools: Annotated[list[dict[str, Any]] | None, wire.ToolCount] = None
    tool_choice: Literal["auto", "none", "required"] | NamedChoice | None = None
    parallel_tool_calls: bool | None = None
    text: TextConfig | None = None
    reasoning: Reasoning | None = None
    previous_response_id: str | None = None
    include: list[str] | None = None
    truncation: Literal["disabled", "auto"] | None = None

    @field_validator("input", mode="before")
    @classmethod
    def _known_items(cls, value: Any) -> Any:
        """An item of a kind localllm does not take is named, with the kinds it does."""
        for i, item in enumerate(value if isinstance(value, list) else ()):
            kind = item.get("type", "message") if isinstance(item, dict) else None
            if kind is not None and kind not in _KINDS:
                raise ValueError(
                    f"input item {i} has type {str(kind)[:40]!r}, which localllm does not "
                    "take; it takes " + ", ".join(_KINDS)
                )
        return value

    @functools.cached_property
    def offered(self) -> list[tuple[FunctionTool, str | None]]:
        """The function tools the model sees, each with the namespace it came in (Codex
        groups some in a `namespace` tool; a call names its namespace). Hosted tools are
        left out; any other kind is a 400 naming it. Read once per request."""
        out: list[tuple[FunctionTool, str | None]] = []
        for i, raw in enumerate(self.tools or ()):
            kind = raw.get("type")
            if kind in HOSTED:
                continue
            if kind == "namespace":
                inner = _tool(NamespaceTool, raw, f"tools[{i}]")
                out += [
                    (_tool(FunctionTool, t, f"tools[{i}].tools[{j}]"), inner.name)
                    for j, t in enumerate(inner.tools)
                    if not isinstance(t, dict) or t.get("type") not in HOSTED
                ]
                continue
            if kind != "function":
                raise InvalidRequest(
                    f"tools of type {kind!r} are not supported; localllm offers function "
                    f"and namespace tools (and leaves out hosted ones: "
                    f"{', '.join(sorted(HOSTED))})",
                    param="tools",
                )
            out.append((_tool(FunctionTool, raw, f"tools[{i}]"), None))
        return out

    def namespaces(self) -> dict[str, str]:
        """Each namespaced function's namespace, by the function's name."""
        return {tool.name: space for tool, space in self.offered if space is not None}

    def tool_spec(self) -> ToolSpec | None:
        """The function tools offered (hosted ones left out) and the choice among them."""
        functions = [
            tool.model_dump(exclude_none=True, exclude={"type"}) for tool, _ in self.offered
        ]
        choice = self.tool_choice
        parallel = self.parallel_tool_calls is True
        if isinstance(choice, NamedChoice):
            picked = ToolChoice("function", choice.name, parallel)
        else:
            picked = ToolChoice(choice or "auto", None, parallel)
        if not functions and picked.mode == "auto":
            return None
        return wire.tool_spec(functions, picked)

    def template_vars(self) -> dict[str, Any] | None:
        if self.reasoning is None or self.reasoning.effort is None:
            return None
        effort = self.reasoning.effort
        return {"enable_thinking": effort != "none", "reasoning_effort": effort}

    def grammar(self) -> str | None:
        fmt = self.text.format if self.text else None
        if fmt is None or fmt.type == "text":
            return None
        if fmt.type == "json_object":
            return grammar.any_json_object()
        return grammar.from_json_schema(fmt.schema_ or {"type": "object"})

    def check_include(self) -> None:
        unknown = sorted(set(self.include or ()) - INCLUDABLE)
        if unknown:
            raise InvalidRequest(
                f"include {unknown[0]!r} is not supported (supported: "
                f"{', '.join(sorted(INCLUDABLE))})",
                param="include",
            )

    def items(self) -> list[Item]:
        if isinstance(self.input, str):
            return [MessageItem(role="user", content=self.input)]
        return list(self.input)


class CreateBody(ResponsesBody):
    stream: bool = False
    store: bool = True
    max_output_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    background: bool = False  # true (answer later, poll for it) is not offered: a 400
    service_tier: Literal["auto", "default"] | None = None
    # extension: how long an on-demand model stays loaded after this request
    keep_alive: wire.KeepAlive = None

    @field_validator("background")
    @classmethod
    def _no_background(cls, v: bool) -> bool:
        if v:
            raise ValueError("background responses are not supported; leave background unset")
        return v

    def sampling(self) -> SamplingParams:
        return SamplingParams.asked(
            temperature=self.temperature,
            top_p=self.top_p,
            max_tokens=self.max_output_tokens,
            grammar=self.grammar(),
        )


def dumped(items: list[Item]) -> list[dict[str, Any]]:
    """Input items as JSON (stored with a response, listed by /input_items)."""
    return [json.loads(i.model_dump_json(by_alias=True, exclude_none=True)) for i in items]
