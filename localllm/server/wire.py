"""The wire types every API shares: validated text and names, the strict base model,
function definitions, durations, the tools check, ids and the error shapes of each API.

Each API's own request schemas and response builders live in its package
(server/openai, server/ollama, server/anthropic, server/llamacpp).
"""

from __future__ import annotations

import math
import time
import uuid
from collections.abc import Sequence
from typing import Annotated, Any, ClassVar, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    model_validator,
)

from localllm.backends.tools import ToolChoice, ToolSpec
from localllm.config import MAX_KEEP_ALIVE_S
from localllm.engine import grammar
from localllm.errors import InvalidRequest

MAX_STOP_STRINGS = 16
MAX_TOOLS = 1024  # functions in one request (Claude Code sends about 20, with MCP servers 100s)
MAX_NAME_BYTES = 255  # a model or draft model name
MAX_TOKEN_ID = 2**31 - 1  # token ids are int32 in both backends
FUNCTION_NAME = r"^[A-Za-z0-9_.-]{1,64}$"


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


class Wire(BaseModel):
    # A field we do not know is refused by name (a 400), never ignored: a client that sends
    # `tools` or `response_format` must not get an answer that silently went without them.
    # The exception is a client's bookkeeping, listed by name in `IGNORED` from
    # server/tolerance.py (with who sends it and why it cannot change the answer).
    # Strict types: 0 is not false and false is not a token id (integers still pass as floats).
    model_config = ConfigDict(extra="forbid", strict=True)
    IGNORED: ClassVar[frozenset[str]] = frozenset()

    @model_validator(mode="before")
    @classmethod
    def _drop_bookkeeping(cls, data: Any) -> Any:
        if cls.IGNORED and isinstance(data, dict) and not cls.IGNORED.isdisjoint(data):
            return {k: v for k, v in data.items() if k not in cls.IGNORED}
        return data


class FunctionDef(Wire):
    name: str = Field(pattern=FUNCTION_NAME)
    description: Text | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class ToolDef(Wire):
    type: Literal["function"]
    function: FunctionDef


MAX_LORA_SCALE = 100.0  # |scale| of a LoRA adapter (llama-server sets no bound; 1 is usual)


class LoraScale(Wire):
    """One adapter in llama-server's `lora` list (a request's, or POST /lora-adapters)."""

    id: int = Field(ge=0, le=1023)
    scale: float = Field(ge=-MAX_LORA_SCALE, le=MAX_LORA_SCALE, allow_inf_nan=False)


def lora_scales(items: Sequence[LoraScale] | None) -> tuple[tuple[int, float], ...] | None:
    """The engine's form of a `lora` list (None: the request named none)."""
    return None if items is None else tuple((a.id, float(a.scale)) for a in items)


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


def _tool_count(value: Any) -> Any:
    """Refuse a list of more than MAX_TOOLS before its items are validated: 60,000 tools
    in a 3 MB body took 0.7 s to validate on the event loop, every stream waiting."""
    if isinstance(value, list) and len(value) > MAX_TOOLS:
        raise ValueError(f"{len(value):,} tools; at most {MAX_TOOLS:,} are read")
    return value


ToolCount = BeforeValidator(_tool_count)  # Annotated[list[...] | None, wire.ToolCount]


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
    if len(functions) > MAX_TOOLS:  # namespaces' tools counted too
        raise InvalidRequest(
            f"{len(functions):,} tools; at most {MAX_TOOLS:,} are read", param="tools"
        )
    names = [f["name"] for f in functions]
    seen: set[str] = set()
    for name in names:
        if name in seen:
            raise InvalidRequest(f"two tools have the name {name!r}", param="tools")
        seen.add(name)
    if choice.mode == "function" and choice.name not in names:
        raise InvalidRequest(
            f"tool_choice names {choice.name!r}, which is not among the tools ({', '.join(names)})",
            param="tool_choice",
        )
    for f in functions:
        if f.get("parameters") is not None:
            grammar.from_json_schema(f["parameters"], param="tools", lenient=True)
    return ToolSpec(tuple({"type": "function", "function": f} for f in functions), choice)


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:24]}"


def now() -> int:
    return int(time.time())


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
