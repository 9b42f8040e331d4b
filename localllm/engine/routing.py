"""The rules of `model: "auto"` ([[routes]] in the config): the first rule whose
conditions a request meets names its model, local or a remote engine's NAME/MODEL."""

from __future__ import annotations

import dataclasses

from localllm.config import RouteRule
from localllm.engine.request import Request
from localllm.errors import InvalidRequest

AUTO = "auto"  # the model name that asks the routing table to choose


def prompt_chars(request: Request) -> int:
    if request.messages is not None:
        return sum(len(m.content) for m in request.messages)
    return len(request.prompt or "") + len(request.suffix or "")


def matches(rule: RouteRule, request: Request) -> bool:
    chars = prompt_chars(request)
    checks = (
        rule.min_prompt_chars is None or chars >= rule.min_prompt_chars,
        rule.max_prompt_chars is None or chars <= rule.max_prompt_chars,
        rule.tools is None or rule.tools == (request.tools is not None),
        rule.json_schema is None or rule.json_schema == (request.params.grammar is not None),
        rule.priority is None or rule.priority == (request.priority or "normal"),
        rule.client is None or rule.client == request.client,
    )
    return all(checks)


def route(rules: tuple[RouteRule, ...], request: Request) -> Request:
    """The request with `model: "auto"` replaced by the first rule's model that matches."""
    if request.model != AUTO:
        return request
    if not rules:
        raise InvalidRequest(
            'model "auto" needs routing rules: add [[routes]] tables to the config '
            "(see the README's Remote engines section)",
            param="model",
            code="model_not_found",
        )
    for rule in rules:
        if matches(rule, request):
            return dataclasses.replace(request, model=rule.model)
    raise InvalidRequest(
        f"no routing rule matches this request ({len(rules)} rules; prompt of "
        f"{prompt_chars(request)} characters, tools {'yes' if request.tools else 'no'}); "
        "end the table with a rule that has only a model, to catch the rest",
        param="model",
    )
