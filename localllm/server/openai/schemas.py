"""OpenAI's request bodies: /v1/chat/completions and /v1/completions (pydantic; a field
we do not know is a 400 naming it)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, field_validator

from localllm.backends.base import MEDIA_MARKER, Media, Message, SamplingParams, ToolCall
from localllm.backends.tools import ToolChoice, ToolSpec
from localllm.engine import grammar
from localllm.errors import InvalidRequest
from localllm.server import media as smedia
from localllm.server import samplers, tolerance
from localllm.server.wire import (
    FUNCTION_NAME,
    MAX_STOP_STRINGS,
    MAX_TOKEN_ID,
    KeepAlive,
    LoraScale,
    Name,
    Text,
    TokenId,
    ToolCount,
    ToolDef,
    Wire,
    lora_scales,
    tool_spec,
)


class TextPart(Wire):
    type: Literal["text"]
    text: Text


class ImageUrl(Wire):
    url: str
    # OpenAI's resolution hint: a local model's projector sizes the image itself
    # (llama-server reads it the same way); accepted so clients that send it work
    detail: Literal["auto", "low", "high"] | None = None


class ImagePart(Wire):
    type: Literal["image_url"]
    image_url: ImageUrl


class InputAudio(Wire):
    data: str
    format: Literal["wav", "mp3", "flac"]


class AudioPart(Wire):
    type: Literal["input_audio"]
    input_audio: InputAudio


class FunctionCall(Wire):
    name: Text
    arguments: Text


class ToolCallIn(Wire):
    id: Text
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(Wire):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: Text | list[TextPart | ImagePart | AudioPart] | None = None
    name: Text | None = None
    tool_calls: list[ToolCallIn] | None = None
    tool_call_id: Text | None = None

    def image_urls(self) -> list[str]:
        parts = self.content if isinstance(self.content, list) else []
        return [p.image_url.url for p in parts if isinstance(p, ImagePart)]

    def to_message(self, fetched: smedia.Fetched | None = None) -> Message:
        items: list[Media] = []
        if isinstance(self.content, list):
            pieces = []
            for part in self.content:
                if isinstance(part, TextPart):
                    pieces.append(smedia.check_text(part.text, param="messages"))
                    continue
                if isinstance(part, ImagePart):
                    url = part.image_url.url
                    items.append(
                        smedia.image_from_url(url, param="image_url", fetched=fetched or {})
                    )
                else:
                    audio = part.input_audio
                    items.append(smedia.audio_part(audio.data, audio.format, param="input_audio"))
                pieces.append(MEDIA_MARKER)
            text = "".join(pieces)
        else:
            text = smedia.check_text(self.content or "", param="messages")
        role = "system" if self.role == "developer" else self.role
        calls = tuple(
            ToolCall(c.id, c.function.name, c.function.arguments) for c in self.tool_calls or ()
        )
        name = self.name if role == "tool" else None
        return Message(
            role,
            text,
            tool_calls=calls,
            tool_call_id=self.tool_call_id,
            name=name,
            media=tuple(items),
        )


class NamedFunction(Wire):
    name: str = Field(pattern=FUNCTION_NAME)


class NamedToolChoice(Wire):
    type: Literal["function"]
    function: NamedFunction


class JsonSchemaFormat(Wire):
    name: str = Field(default="response", pattern=FUNCTION_NAME)
    description: Text | None = None
    schema_: dict[str, Any] = Field(default_factory=dict, alias="schema")
    strict: bool | None = None


class ResponseFormat(Wire):
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


class StreamOptions(Wire):
    include_usage: bool = False


class SamplingFields(Wire):
    IGNORED = tolerance.names(tolerance.OPENAI)

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
    service_tier: Literal["auto", "default"] | None = None
    store: bool | None = None
    # llama-server's own fields, as llama.vim and llama.vscode send them on these routes:
    # n_predict is max_tokens (0: read the prompt only, to warm the cache), samplers picks
    # the filters that run, t_max_predict_ms ends the answer at a newline once it is spent
    n_predict: int | None = Field(default=None, ge=-1)
    samplers: list[str] | None = None
    t_max_predict_ms: int | None = Field(default=None, ge=0)
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
    # llama-server's LoRA adapters for this request (ids from GET /lora-adapters; the
    # others off); without it, the adapters' global scales
    lora: list[LoraScale] | None = Field(default=None, max_length=64)

    def extensions(self) -> dict[str, Any]:
        """The engine request's fields that come from localllm's extension fields."""
        return {
            "keep_alive": self.keep_alive,
            "speculate": self.speculate,
            "draft_model": self.draft_model,
            "priority": self.priority,
            "deterministic": self.deterministic,
            "lora": lora_scales(self.lora),
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
        return self.max_tokens or self.predict_limit()

    def predict_limit(self) -> int | None:
        """llama-server's n_predict as a token limit (-1: none; 0 reads the prompt only and
        is served as one token whose text is dropped, see `prompt_only`)."""
        if self.n_predict is None or self.n_predict < 0:
            return None
        return max(self.n_predict, 1)

    def prompt_only(self) -> bool:
        return self.n_predict == 0 and self.max_tokens is None

    def report_logprobs(self) -> int | None:
        """How many alternatives to report with each token's log probability (None: none)."""
        return None

    def grammar(self) -> str | None:
        return None

    def sampling(self) -> SamplingParams:
        stop = self.stop if isinstance(self.stop, list) else [self.stop] if self.stop else []
        filters = samplers.chosen(self.samplers, self.top_k, self.top_p, self.min_p)
        return SamplingParams.asked(
            temperature=self.temperature,
            top_p=filters.top_p,
            top_k=filters.top_k,
            min_p=filters.min_p,
            repeat_penalty=self.repeat_penalty,
            frequency_penalty=self.frequency_penalty,
            presence_penalty=self.presence_penalty,
            logit_bias=tuple((int(k), v) for k, v in (self.logit_bias or {}).items()) or None,
            seed=self.seed,
            max_tokens=self.token_limit(),
            stop=tuple(s for s in stop if s) or None,
            grammar=self.grammar(),
            logprobs=self.report_logprobs(),
            newline_deadline_s=samplers.deadline(self.t_max_predict_ms),
        )


class ChatCompletionRequest(SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    tools: Annotated[list[ToolDef] | None, ToolCount] = None
    tool_choice: Literal["auto", "none", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None
    response_format: ResponseFormat | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    # extension (vLLM, SGLang and llama-server take it too): values for the chat template,
    # such as {"enable_thinking": false}
    chat_template_kwargs: dict[str, Any] | None = None

    def token_limit(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens or self.predict_limit()

    def prompt_only(self) -> bool:
        return super().prompt_only() and self.max_completion_tokens is None

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
        # one call unless asked for more (llama-server's default too): a small model
        # otherwise repeats its call until max_tokens
        parallel = self.parallel_tool_calls is True
        if isinstance(choice, NamedToolChoice):
            picked = ToolChoice("function", choice.function.name, parallel)
        else:
            picked = ToolChoice(choice or "auto", None, parallel)
        functions = [t.function.model_dump(exclude_none=True) for t in self.tools or ()]
        return tool_spec(functions, picked)


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
