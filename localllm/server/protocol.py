"""OpenAI wire shapes: request schemas (pydantic) and response builders.

This is the only module that knows what the JSON on the wire looks like.
Responses are built as plain dicts: one is built per streamed token, so they
must be cheap.
"""

from __future__ import annotations

import math
import time
import uuid
from collections.abc import Sequence
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, field_validator

from localllm.backends.base import (
    Chunk,
    FinishReason,
    GenerationStats,
    Message,
    SamplingParams,
    TokenLogprob,
    ToolCall,
)
from localllm.backends.tools import ToolChoice, ToolSpec
from localllm.config import MAX_KEEP_ALIVE_S
from localllm.engine import grammar
from localllm.errors import InvalidRequest

MAX_STOP_STRINGS = 16
MAX_NAME_BYTES = 255  # a model or draft model name
MAX_TOKEN_ID = 2**31 - 1  # token ids are int32 in both backends


def _unicode(text: str) -> str:
    """Refuse a lone UTF-16 surrogate (JSON allows "\\ud800"; no tokenizer can encode it)."""
    try:
        text.encode()
    except UnicodeEncodeError as exc:
        raise ValueError(
            f"the text has a lone UTF-16 surrogate (U+{ord(text[exc.start]):04X}) at character "
            f"{exc.start}, which is not valid Unicode"
        ) from None
    return text


def _name(text: str) -> str:
    if not text.strip():
        raise ValueError("a model name is not empty")
    size = len(_unicode(text).encode())
    if size > MAX_NAME_BYTES:
        raise ValueError(f"a model name is at most {MAX_NAME_BYTES} bytes, got {size}")
    return text


Text = Annotated[str, AfterValidator(_unicode)]
Name = Annotated[str, AfterValidator(_name)]
TokenId = Annotated[int, Field(ge=0, le=MAX_TOKEN_ID)]


class _Wire(BaseModel):
    # A field we do not know is refused by name (a 400), never ignored: a client that sends
    # `tools` or `response_format` must not get an answer that silently went without them.
    # Strict types: 0 is not false and false is not a token id (integers still pass as floats).
    model_config = ConfigDict(extra="forbid", strict=True)


class TextPart(_Wire):
    type: Literal["text"]
    text: Text


class ImagePart(_Wire):
    type: Literal["image_url"]
    image_url: dict[str, Any]


class FunctionCall(_Wire):
    name: Text
    arguments: Text


class ToolCallIn(_Wire):
    id: Text
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(_Wire):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: Text | list[TextPart | ImagePart] | None = None
    name: Text | None = None
    tool_calls: list[ToolCallIn] | None = None
    tool_call_id: Text | None = None

    def to_message(self) -> Message:
        if isinstance(self.content, list):
            if any(isinstance(part, ImagePart) for part in self.content):
                raise InvalidRequest(
                    "This model has no vision support: it cannot read image_url parts. "
                    "Send text, or load a model that reads images.",
                    param="messages",
                    code="vision_not_supported",
                )
            text = "".join(part.text for part in self.content if isinstance(part, TextPart))
        else:
            text = self.content or ""
        role = "system" if self.role == "developer" else self.role
        calls = tuple(
            ToolCall(c.id, c.function.name, c.function.arguments) for c in self.tool_calls or ()
        )
        name = self.name if role == "tool" else None
        return Message(role, text, tool_calls=calls, tool_call_id=self.tool_call_id, name=name)


_FUNCTION_NAME = r"^[A-Za-z0-9_.-]{1,64}$"


class FunctionDef(_Wire):
    name: str = Field(pattern=_FUNCTION_NAME)
    description: Text | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class ToolDef(_Wire):
    type: Literal["function"]
    function: FunctionDef


class NamedFunction(_Wire):
    name: str = Field(pattern=_FUNCTION_NAME)


class NamedToolChoice(_Wire):
    type: Literal["function"]
    function: NamedFunction


class JsonSchemaFormat(_Wire):
    name: str = Field(default="response", pattern=_FUNCTION_NAME)
    description: Text | None = None
    schema_: dict[str, Any] = Field(default_factory=dict, alias="schema")
    strict: bool | None = None


class ResponseFormat(_Wire):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None

    def grammar(self) -> str | None:
        """The grammar for this format (None: free text); InvalidRequest for a schema the
        grammar engine cannot honour, naming what it is."""
        if self.type == "text":
            return None
        if self.type == "json_object":
            return grammar.any_json_object()
        if self.json_schema is None:
            raise InvalidRequest(
                "response_format of type json_schema needs a json_schema object",
                param="response_format",
            )
        return grammar.from_json_schema(self.json_schema.schema_ or {"type": "object"})


_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}


def parse_duration(value: str) -> float:
    """Seconds from a duration such as "90s", "5m", "1h" or a bare number "-1" (not yet
    checked for range: see `check_keep_alive`)."""
    text = value.strip().lower()
    for unit in sorted(_UNITS, key=len, reverse=True):
        if text.endswith(unit):
            number = text[: -len(unit)]
            break
    else:
        unit, number = "s", text
    try:
        return float(number) * _UNITS[unit]
    except ValueError:
        raise ValueError(
            f"keep_alive must be seconds or a duration like '5m', got {value!r}"
        ) from None


def check_keep_alive(seconds: float) -> float:
    """A keep-alive in seconds within range: negative means forever (any negative number
    is kept as -1), at most MAX_KEEP_ALIVE_S otherwise; not a number or infinite: refused."""
    if not math.isfinite(seconds):
        raise ValueError(f"keep_alive must be a finite number of seconds, got {seconds}")
    if seconds < 0:
        return -1.0
    if seconds > MAX_KEEP_ALIVE_S:
        raise ValueError(
            f"keep_alive is at most {MAX_KEEP_ALIVE_S} s (366 days; a negative value keeps "
            f"the model loaded for good), got {seconds:.0f} s"
        )
    return seconds


def _duration(value: object) -> object:
    return parse_duration(value) if isinstance(value, str) else value  # numbers: pydantic


def _in_range(seconds: float | None) -> float | None:
    return None if seconds is None else check_keep_alive(seconds)


# seconds or a duration ("10m"), in range (check_keep_alive); None: the setting's
KeepAlive = Annotated[float | None, BeforeValidator(_duration), AfterValidator(_in_range)]


class StreamOptions(_Wire):
    include_usage: bool = False


class SamplingFields(_Wire):
    model: Name | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    top_k: int | None = Field(default=None, ge=0)
    min_p: float | None = Field(default=None, ge=0.0, le=1.0)
    repeat_penalty: float | None = Field(default=None, gt=0.0, le=10.0)
    seed: int | None = None
    stop: Text | list[Text] | None = None
    n: int | None = Field(default=None, ge=1)
    frequency_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    presence_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    logit_bias: dict[str, float] | None = None
    user: Text | None = None  # an end user's id, for the caller's own records: not used
    # OpenAI's hints for its own routing, caching and records; nothing to do here (the
    # prompt cache keys by prefix on its own), so accepted rather than refused
    safety_identifier: Text | None = None
    prompt_cache_key: Text | None = None
    service_tier: Literal["auto", "default"] | None = None
    metadata: dict[str, Text] | None = None
    store: bool | None = None
    # extension: how long an on-demand model stays loaded after this request, like
    # Ollama's keep_alive: seconds, or a duration "30s" / "5m" / "1h"; negative: forever
    keep_alive: KeepAlive = None
    # extension: speculative decoding for this request, and its draft model
    speculate: Literal["off", "lookup", "draft", "auto"] | None = None
    draft_model: Name | None = None
    # extension: "high" runs ahead of other requests (autocomplete, an interactive client)
    priority: Literal["high", "normal"] | None = None
    # extension: run alone, output independent of the prompt cache and other clients
    deterministic: bool | None = None

    def extensions(self) -> dict[str, Any]:
        """The engine request's fields that come from localllm's extension fields."""
        return {
            "keep_alive": self.keep_alive,
            "speculate": self.speculate,
            "draft_model": self.draft_model,
            "priority": self.priority,
            "deterministic": self.deterministic,
        }

    @field_validator("stop")
    @classmethod
    def _check_stop(cls, v: str | list[str] | None) -> str | list[str] | None:
        if isinstance(v, list) and len(v) > MAX_STOP_STRINGS:
            raise ValueError(f"at most {MAX_STOP_STRINGS} stop strings are allowed, got {len(v)}")
        return v

    @field_validator("n")
    @classmethod
    def _check_n(cls, v: int | None) -> int | None:
        if v is not None and v != 1:
            raise ValueError(f"only n=1 is supported, got n={v}")
        return v

    @field_validator("store")
    @classmethod
    def _no_store(cls, v: bool | None) -> bool | None:
        if v:
            raise ValueError("store=true (keeping completions on the server) is not supported")
        return v

    @field_validator("logit_bias")
    @classmethod
    def _check_bias(cls, v: dict[str, float] | None) -> dict[str, float] | None:
        for key, bias in (v or {}).items():
            if not key.isdigit() or int(key) > MAX_TOKEN_ID:
                raise ValueError(f"logit_bias keys are token ids, got {key!r}")
            if not -100.0 <= bias <= 100.0:
                raise ValueError(f"a logit bias is from -100 to 100, got {bias} for token {key}")
        return v

    def token_limit(self) -> int | None:
        return self.max_tokens

    def report_logprobs(self) -> int | None:
        """How many alternatives to report with each token's log probability (None: none)."""
        return None

    def grammar(self) -> str | None:
        return None

    def sampling(self) -> SamplingParams:
        stop = self.stop if isinstance(self.stop, list) else [self.stop] if self.stop else []
        return SamplingParams.asked(
            temperature=self.temperature,
            top_p=self.top_p,
            top_k=self.top_k,
            min_p=self.min_p,
            repeat_penalty=self.repeat_penalty,
            frequency_penalty=self.frequency_penalty,
            presence_penalty=self.presence_penalty,
            logit_bias=tuple((int(k), v) for k, v in (self.logit_bias or {}).items()) or None,
            seed=self.seed,
            max_tokens=self.token_limit(),
            stop=tuple(s for s in stop if s) or None,
            grammar=self.grammar(),
            logprobs=self.report_logprobs(),
        )


class ChatCompletionRequest(SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    tools: list[ToolDef] | None = None
    tool_choice: Literal["auto", "none", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None
    response_format: ResponseFormat | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    # extension (vLLM, SGLang and llama-server take it too): values for the chat template,
    # such as {"enable_thinking": false}
    chat_template_kwargs: dict[str, Any] | None = None

    def token_limit(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens

    def report_logprobs(self) -> int | None:
        if self.top_logprobs is not None and not self.logprobs:
            raise InvalidRequest("top_logprobs needs logprobs: true", param="top_logprobs")
        return (self.top_logprobs or 0) if self.logprobs else None

    def grammar(self) -> str | None:
        return self.response_format.grammar() if self.response_format else None

    def wire_response_format(self) -> dict[str, Any] | None:
        """response_format as sent, for a remote engine (None: free text)."""
        rf = self.response_format
        if rf is None or rf.type == "text":
            return None
        return rf.model_dump(by_alias=True, exclude_none=True)

    def tool_spec(self) -> ToolSpec | None:
        """The tools and the choice among them; InvalidRequest when they disagree."""
        choice = self.tool_choice
        parallel = self.parallel_tool_calls is not False
        if isinstance(choice, NamedToolChoice):
            picked = ToolChoice("function", choice.function.name, parallel)
        else:
            picked = ToolChoice(choice or "auto", None, parallel)
        functions = [t.function.model_dump(exclude_none=True) for t in self.tools or ()]
        return tool_spec(functions, picked)


def tool_spec(functions: Sequence[dict[str, Any]], choice: ToolChoice) -> ToolSpec | None:
    """The tools of a request (function definitions in OpenAI's form) and the choice among
    them, checked alike for every API: a call asked for needs tools, names are unique, a
    named choice is among them, and each parameter schema is one the grammar engine reads
    (leniently: see tools.TOOL_OPTIONS). None without tools."""
    if not functions:
        if choice.mode in ("required", "function"):
            raise InvalidRequest(
                "tool_choice asks for a tool call but the request has no tools",
                param="tool_choice",
            )
        return None
    names = [f["name"] for f in functions]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise InvalidRequest(f"two tools have the name {twice[0]!r}", param="tools")
    if choice.mode == "function" and choice.name not in names:
        raise InvalidRequest(
            f"tool_choice names {choice.name!r}, which is not among the tools ({', '.join(names)})",
            param="tool_choice",
        )
    for f in functions:
        if f.get("parameters") is not None:
            grammar.from_json_schema(f["parameters"], param="tools", lenient=True)
    return ToolSpec(tuple({"type": "function", "function": f} for f in functions), choice)


class CompletionRequest(SamplingFields):
    prompt: Text | list[Text] | list[TokenId]
    suffix: Text | None = None
    echo: bool = False
    logprobs: int | None = Field(default=None, ge=0, le=20)

    def report_logprobs(self) -> int | None:
        return self.logprobs

    @field_validator("prompt")
    @classmethod
    def _one_prompt(cls, v: str | list[str] | list[int]) -> str | list[str] | list[int]:
        if isinstance(v, list) and not v:
            raise ValueError("the prompt is an empty list; send a string or token ids")
        if isinstance(v, list) and isinstance(v[0], str) and len(v) != 1:
            raise ValueError(f"exactly one prompt is supported, got {len(v)}")
        return v

    @field_validator("echo")
    @classmethod
    def _no_echo(cls, v: bool) -> bool:
        if v:
            raise ValueError("echo=true is not supported")
        return v


class AdminLoad(_Wire):
    """POST /admin/load: load a model beside the default, for `ttl` idle seconds."""

    model: Name
    n_ctx: int | None = Field(default=None, ge=16, le=1 << 20)
    # seconds or a duration ("10m"); negative: stays loaded for good; None: the setting's
    keep_alive: KeepAlive = None


class AdminUnload(_Wire):
    """POST /admin/unload: one model by name, or all of them."""

    model: Name | None = None
    all: bool = False


# -- responses ------------------------------------------------------------------------


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:24]}"


def now() -> int:
    return int(time.time())


def usage(stats: GenerationStats | None, prompt_tokens: int) -> dict:
    if stats is not None:  # a remote engine's prompt is only counted at its end
        prompt_tokens = stats.prompt_tokens
    completion_tokens = stats.generated_tokens if stats else 0
    out: dict = {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": stats.cached_tokens if stats else 0},
    }
    if stats and stats.draft_proposed:  # extension: speculative decoding's figures
        out["speculative"] = {
            "proposed_tokens": stats.draft_proposed,
            "accepted_tokens": stats.draft_accepted,
            "acceptance": round(stats.draft_accepted / stats.draft_proposed, 4),
            "speedup": round(stats.speedup, 3),
        }
    return out


def wire_finish(reason: FinishReason | None) -> str | None:
    # "cancelled" never reaches a client that is still listening; report it as a stop.
    return "stop" if reason == "cancelled" else reason


Scores = Sequence[TokenLogprob]


def _token_text(piece: bytes) -> str:
    return piece.decode("utf-8", "replace")


class Shapes:
    """The JSON bodies of one response: whole, or as stream frames. `scores` are the log
    probabilities of the tokens in a piece (when the request asked for them, else None)."""

    object_full = ""
    object_chunk = ""
    prefix = ""

    def __init__(self, model: str, prompt_tokens: int, *, logprobs: bool = False) -> None:
        self.id = new_id(self.prefix)
        self.created = now()
        self.model = model
        self.prompt_tokens = prompt_tokens
        self.logprobs = logprobs
        # set when the truncate-oldest policy dropped messages: said in the final bodies
        self.truncated: dict[str, int] | None = None
        # set when a remote model's local fallback answered: said in the final bodies
        self.fallback: dict[str, str | None] | None = None

    def _body(self, obj: str, choices: list[dict], use: dict | None = None) -> dict:
        body: dict[str, Any] = {
            "id": self.id,
            "object": obj,
            "created": self.created,
            "model": self.model,
            "choices": choices,
        }
        if use is not None:
            body["usage"] = use
        return body

    def _said(self, body: dict) -> dict:
        if self.truncated is not None:
            body["truncated"] = self.truncated
        if self.fallback is not None:
            body["fallback"] = self.fallback
        return body

    def _choice(
        self,
        text: str,
        finish: FinishReason | None,
        scores: Scores,
        calls: Sequence[ToolCall],
        *,
        whole: bool,
        reasoning: str = "",
    ) -> dict:
        raise NotImplementedError

    def full(
        self,
        text: str,
        final: Chunk,
        scores: Scores = (),
        calls: Sequence[ToolCall] = (),
        *,
        reasoning: str = "",
    ) -> dict:
        choice = self._choice(
            text, final.finish_reason, scores, calls, whole=True, reasoning=reasoning
        )
        use = usage(final.stats, self.prompt_tokens)
        return self._said(self._body(self.object_full, [choice], use))

    def delta(self, text: str, scores: Scores = (), *, reasoning: str = "") -> dict:
        choice = self._choice(text, None, scores, (), whole=False, reasoning=reasoning)
        return self._body(self.object_chunk, [choice])

    def closing(
        self,
        final: Chunk,
        text: str,
        scores: Scores = (),
        calls: Sequence[ToolCall] = (),
        *,
        include_usage: bool,
        reasoning: str = "",
    ) -> list[dict]:
        choice = self._choice(
            text, final.finish_reason, scores, calls, whole=False, reasoning=reasoning
        )
        out = [self._said(self._body(self.object_chunk, [choice]))]
        if include_usage:
            out.append(self._body(self.object_chunk, [], usage(final.stats, self.prompt_tokens)))
        return out


def _wire_call(call: ToolCall, index: int | None = None) -> dict:
    out: dict[str, Any] = {} if index is None else {"index": index}
    out.update(
        id=call.id,
        type="function",
        function={"name": call.name, "arguments": call.arguments},
    )
    return out


class ChatShapes(Shapes):
    object_full, object_chunk, prefix = "chat.completion", "chat.completion.chunk", "chatcmpl"

    def __init__(self, model: str, prompt_tokens: int, *, logprobs: bool = False) -> None:
        super().__init__(model, prompt_tokens, logprobs=logprobs)
        self._first = True

    def _scores(self, scores: Scores) -> dict | None:
        if not self.logprobs:
            return None
        return {
            "content": [
                {
                    "token": _token_text(s.piece),
                    "logprob": s.logprob,
                    "bytes": list(s.piece),
                    "top_logprobs": [
                        {"token": _token_text(b), "logprob": lp, "bytes": list(b)}
                        for _, lp, b in s.top
                    ],
                }
                for s in scores
            ]
        }

    def _choice(
        self,
        text: str,
        finish: FinishReason | None,
        scores: Scores,
        calls: Sequence[ToolCall],
        *,
        whole: bool,
        reasoning: str = "",
    ) -> dict:
        reason = "tool_calls" if calls else wire_finish(finish)
        if whole:
            message: dict[str, Any] = {"role": "assistant", "content": text or None}
            if reasoning:  # extension (vLLM, SGLang, DeepSeek): the think block, apart
                message["reasoning_content"] = reasoning
            if calls:
                message["tool_calls"] = [_wire_call(c) for c in calls]
            elif not text:
                message["content"] = ""
            return {
                "index": 0,
                "message": message,
                "logprobs": self._scores(scores),
                "finish_reason": reason,
            }
        delta: dict[str, Any] = {"content": text} if text or self._first else {}
        if reasoning:
            delta["reasoning_content"] = reasoning
        if self._first:
            delta["role"] = "assistant"
            self._first = False
        if calls:
            delta["tool_calls"] = [_wire_call(c, i) for i, c in enumerate(calls)]
        logprobs = self._scores(scores) if scores else None
        return {"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": reason}


class TextShapes(Shapes):
    object_full = object_chunk = "text_completion"
    prefix = "cmpl"

    def __init__(self, model: str, prompt_tokens: int, *, logprobs: bool = False) -> None:
        super().__init__(model, prompt_tokens, logprobs=logprobs)
        self._offset = 0  # characters of text before the next token (text_offset)

    def _scores(self, scores: Scores) -> dict | None:
        if not self.logprobs:
            return None
        offsets = []
        for s in scores:
            offsets.append(self._offset)
            self._offset += len(_token_text(s.piece))
        return {
            "tokens": [_token_text(s.piece) for s in scores],
            "token_logprobs": [s.logprob for s in scores],
            "top_logprobs": [{_token_text(b): lp for _, lp, b in s.top} for s in scores],
            "text_offset": offsets,
        }

    def _choice(
        self,
        text: str,
        finish: FinishReason | None,
        scores: Scores,
        calls: Sequence[ToolCall],
        *,
        whole: bool,
        reasoning: str = "",
    ) -> dict:
        logprobs = self._scores(scores) if (whole or scores) else None
        return {
            "index": 0,
            "text": text,
            "logprobs": logprobs,
            "finish_reason": wire_finish(finish),
        }


def error_body(message: str, err_type: str, param: str | None, code: str | None) -> dict:
    return {"error": {"message": message, "type": err_type, "param": param, "code": code}}


_ANTHROPIC_TYPES = {
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
}


def error_for(
    path: str, status: int, message: str, err_type: str, param: str | None, code: str | None
) -> dict:
    """An error in the shape of the API a path belongs to: Ollama's `{"error": message}`
    under /api/, Anthropic's under /v1/messages, OpenAI's everywhere else."""
    if path.startswith("/api/"):
        return {"error": message}
    if path.startswith("/v1/messages"):
        kind = _ANTHROPIC_TYPES.get(
            status, "api_error" if status >= 500 else "invalid_request_error"
        )
        return {"type": "error", "error": {"type": kind, "message": message}}
    return error_body(message, err_type, param, code)
