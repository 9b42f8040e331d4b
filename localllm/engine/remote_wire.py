"""A request as a remote engine reads it: an OpenAI chat or completion body, with what a
remote model cannot take refused by name (engine/remote_route.py sends it)."""

from __future__ import annotations

import base64
from typing import Any

from localllm.backends.base import MEDIA_MARKER, Message
from localllm.engine.request import Request
from localllm.errors import InvalidRequest


def _content(m: Message) -> list[dict[str, Any]]:
    """A message with images or audio as OpenAI's content parts, each where it was."""
    parts: list[dict[str, Any]] = []
    for i, text in enumerate(m.content.split(MEDIA_MARKER)):
        if text:
            parts.append({"type": "text", "text": text})
        if i < len(m.media):
            item = m.media[i]
            encoded = base64.b64encode(item.source).decode()
            if item.kind == "image":
                url = f"data:{item.mime};base64,{encoded}"
                parts.append({"type": "image_url", "image_url": {"url": url}})
            else:
                fmt = item.mime.removeprefix("audio/")
                parts.append(
                    {"type": "input_audio", "input_audio": {"data": encoded, "format": fmt}}
                )
    return parts


def _message(m: Message) -> dict[str, Any]:
    out: dict[str, Any] = {"role": m.role, "content": _content(m) if m.media else m.content}
    if m.tool_calls:
        out["tool_calls"] = [
            {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
            for c in m.tool_calls
        ]
    if m.tool_call_id is not None:
        out["tool_call_id"] = m.tool_call_id
    if m.name is not None and m.role == "tool":
        out["name"] = m.name
    return out


def body_of(request: Request, model_id: str) -> tuple[str, dict[str, Any]]:
    """The path and JSON body of the engine request; InvalidRequest naming what a remote
    model cannot take."""
    p = request.params
    refuse = [
        ("prompt_tokens", request.prompt_tokens is not None, "token ids are this machine's"),
        ("infill", request.infill is not None, "/infill is answered by local models"),
        ("logprobs", p.logprobs is not None, "log probabilities are not passed through"),
        # localllm's own decoding options: the engine decodes as it is set up to
        ("speculate", request.speculate is not None, "the engine does its own decoding"),
        ("draft_model", request.draft_model is not None, "the engine does its own decoding"),
        ("deterministic", bool(request.deterministic), "the engine schedules its own batches"),
        ("lora", request.lora is not None, "adapters are this machine's (serve them by name)"),
    ]
    for field, present, why in refuse:
        if present:
            raise InvalidRequest(
                f"{field} cannot be sent to the remote model {request.model}: {why}",
                param=field,
                code="unsupported_for_remote",
            )
    body: dict[str, Any] = {
        "model": model_id,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    # the sampling the client set; what it left unset is the engine's own default (vLLM's
    # is the model's generation_config.json); top_k and min_p are extensions that vLLM,
    # SGLang and llama-server take
    for name in ("temperature", "top_p", "top_k", "min_p"):
        if p.given is None or name in p.given:
            body[name] = getattr(p, name)
    if p.max_tokens is not None:
        body["max_tokens"] = p.max_tokens
    if p.stop:
        body["stop"] = list(p.stop)
    if p.seed is not None:
        body["seed"] = p.seed
    if p.frequency_penalty:
        body["frequency_penalty"] = p.frequency_penalty
    if p.presence_penalty:
        body["presence_penalty"] = p.presence_penalty
    if p.repeat_penalty != 1.0:
        body["repetition_penalty"] = p.repeat_penalty
    if p.logit_bias:
        body["logit_bias"] = {str(t): b for t, b in p.logit_bias}
    if p.grammar is not None:
        if request.response_format is None:
            raise InvalidRequest(
                f"this constraint cannot be sent to the remote model {request.model}; "
                "use response_format",
                param="format",
                code="unsupported_for_remote",
            )
        body["response_format"] = dict(request.response_format)
    if request.messages is None:
        body["prompt"] = request.prompt or ""
        if request.suffix is not None:
            body["suffix"] = request.suffix
        return "/completions", body
    body["messages"] = [_message(m) for m in request.messages]
    if request.tools is not None:
        body["tools"] = list(request.tools.tools)
        choice = request.tools.choice
        body["tool_choice"] = (
            {"type": "function", "function": {"name": choice.name}}
            if choice.mode == "function"
            else choice.mode
        )
        if not choice.parallel:
            body["parallel_tool_calls"] = False
    if request.template_vars:
        body["chat_template_kwargs"] = dict(request.template_vars)
    return "/chat/completions", body
