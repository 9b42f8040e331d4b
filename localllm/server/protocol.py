"""OpenAI wire shapes: request schemas (pydantic) and response builders.

This is the only module that knows what the JSON on the wire looks like.
Responses are built as plain dicts: one is built per streamed token, so they
must be cheap.
"""

from __future__ import annotations

import math
import time
import uuid
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator

from localllm.backends.base import Chunk, FinishReason, GenerationStats, Message, SamplingParams
from localllm.config import MAX_KEEP_ALIVE_S

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
    # Clients send many optional OpenAI fields (user, logprobs=false, ...): ignore unknown keys.
    # Strict types: 0 is not false and false is not a token id (integers still pass as floats).
    model_config = ConfigDict(extra="ignore", strict=True)


class TextPart(_Wire):
    type: Literal["text"]
    text: Text


class ChatMessage(_Wire):
    role: Literal["system", "developer", "user", "assistant"]
    content: Text | list[TextPart] | None = None

    def to_message(self) -> Message:
        if isinstance(self.content, list):
            text = "".join(part.text for part in self.content)
        else:
            text = self.content or ""
        role = "system" if self.role == "developer" else self.role
        return Message(role=role, content=text)


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
    # extension: how long an on-demand model stays loaded after this request, like
    # Ollama's keep_alive: seconds, or a duration "30s" / "5m" / "1h"; negative: forever
    keep_alive: float | None = None
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

    @field_validator("keep_alive", mode="before")
    @classmethod
    def _parse_keep_alive(cls, v: object) -> object:
        return parse_duration(v) if isinstance(v, str) else v  # numbers: pydantic checks

    @field_validator("keep_alive")
    @classmethod
    def _check_keep_alive(cls, v: float | None) -> float | None:
        return None if v is None else check_keep_alive(v)

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

    def token_limit(self) -> int | None:
        return self.max_tokens

    def sampling(self) -> SamplingParams:
        stop = self.stop if isinstance(self.stop, list) else [self.stop] if self.stop else []
        return SamplingParams().with_overrides(
            temperature=self.temperature,
            top_p=self.top_p,
            top_k=self.top_k,
            min_p=self.min_p,
            repeat_penalty=self.repeat_penalty,
            seed=self.seed,
            max_tokens=self.token_limit(),
            stop=tuple(s for s in stop if s),
        )


class ChatCompletionRequest(SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)

    def token_limit(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens


class CompletionRequest(SamplingFields):
    prompt: Text | list[Text] | list[TokenId]
    suffix: Text | None = None
    echo: bool = False

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
    keep_alive: float | None = None

    @field_validator("keep_alive", mode="before")
    @classmethod
    def _parse_keep_alive(cls, v: object) -> object:
        return parse_duration(v) if isinstance(v, str) else v

    @field_validator("keep_alive")
    @classmethod
    def _check_keep_alive(cls, v: float | None) -> float | None:
        return None if v is None else check_keep_alive(v)


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


class Shapes:
    """The JSON bodies of one response: whole, or as stream frames."""

    object_full = ""
    object_chunk = ""
    prefix = ""

    def __init__(self, model: str, prompt_tokens: int) -> None:
        self.id = new_id(self.prefix)
        self.created = now()
        self.model = model
        self.prompt_tokens = prompt_tokens
        # set when the truncate-oldest policy dropped messages: said in the final bodies
        self.truncated: dict[str, int] | None = None

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
        return body

    def _choice(self, text: str, finish: FinishReason | None, *, whole: bool) -> dict:
        raise NotImplementedError

    def full(self, text: str, final: Chunk) -> dict:
        choice = self._choice(text, final.finish_reason, whole=True)
        use = usage(final.stats, self.prompt_tokens)
        return self._said(self._body(self.object_full, [choice], use))

    def delta(self, text: str) -> dict:
        return self._body(self.object_chunk, [self._choice(text, None, whole=False)])

    def closing(self, final: Chunk, text: str, *, include_usage: bool) -> list[dict]:
        out = [
            self._said(
                self._body(
                    self.object_chunk, [self._choice(text, final.finish_reason, whole=False)]
                )
            )
        ]
        if include_usage:
            out.append(self._body(self.object_chunk, [], usage(final.stats, self.prompt_tokens)))
        return out


class ChatShapes(Shapes):
    object_full, object_chunk, prefix = "chat.completion", "chat.completion.chunk", "chatcmpl"

    def __init__(self, model: str, prompt_tokens: int) -> None:
        super().__init__(model, prompt_tokens)
        self._first = True

    def _choice(self, text: str, finish: FinishReason | None, *, whole: bool) -> dict:
        if whole:
            return {
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "logprobs": None,
                "finish_reason": wire_finish(finish),
            }
        delta: dict[str, str] = {"content": text} if text or self._first else {}
        if self._first:
            delta["role"] = "assistant"
            self._first = False
        return {"index": 0, "delta": delta, "logprobs": None, "finish_reason": wire_finish(finish)}


class TextShapes(Shapes):
    object_full = object_chunk = "text_completion"
    prefix = "cmpl"

    def _choice(self, text: str, finish: FinishReason | None, *, whole: bool) -> dict:
        return {"index": 0, "text": text, "logprobs": None, "finish_reason": wire_finish(finish)}


def model_list(names: list[str], created: int) -> dict:
    return {
        "object": "list",
        "data": [
            {"id": n, "object": "model", "created": created, "owned_by": "local"} for n in names
        ],
    }


def error_body(message: str, err_type: str, param: str | None, code: str | None) -> dict:
    return {"error": {"message": message, "type": err_type, "param": param, "code": code}}
