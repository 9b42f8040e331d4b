"""/openapi.json as the server behaves: its error statuses and shape, and streamed answers.

FastAPI documents a 422 for every body, but the server answers bad input with 400 (see
errors.py), and it has statuses FastAPI cannot know of: 401 (keys), 403 (Host, Origin),
413 (body size), 415 (content type), 429 (quotas), 503 (queue full, no model yet).
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

_ERROR = {
    "type": "object",
    "required": ["error"],
    "properties": {
        "error": {
            "type": "object",
            "required": ["message", "type"],
            "properties": {
                "message": {"type": "string"},
                "type": {"type": "string"},
                "param": {"type": ["string", "null"]},
                "code": {"type": ["string", "null"]},
            },
        }
    },
}
_OLLAMA_ERROR = {
    "type": "object",
    "required": ["error"],
    "properties": {"error": {"type": "string"}},
}
_ANTHROPIC_ERROR = {
    "type": "object",
    "required": ["type", "error"],
    "properties": {
        "type": {"const": "error"},
        "error": {
            "type": "object",
            "required": ["type", "message"],
            "properties": {"type": {"type": "string"}, "message": {"type": "string"}},
        },
    },
}
_WHY = {
    "400": "The request is invalid: the message names the field and the numbers",
    "401": "An API key is required and missing or wrong",
    "403": "The Host or Origin is not allowed",
    "404": "No such model or route",
    "413": "The body is larger than max_body_bytes",
    "415": "The body is not sent as application/json",
    "429": "The key's quota is spent; see Retry-After",
    "503": "The queue is full (see Retry-After) or no model is loaded",
}
_ALWAYS = ("401", "403", "404", "429")
_WITH_BODY = ("400", "413", "415", "503")
_STREAMED = ("/v1/chat/completions", "/v1/completions", "/v1/messages", "/v1/responses")
_NDJSON = ("/api/chat", "/api/generate", "/api/pull")


def _error_ref(path: str) -> str:
    if path.startswith("/api/"):
        return "#/components/schemas/OllamaError"
    if path.startswith("/v1/messages"):
        return "#/components/schemas/AnthropicError"
    return "#/components/schemas/Error"


def install_openapi(app: FastAPI) -> None:
    def build() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = describe(
                get_openapi(title=app.title, version=app.version, routes=app.routes)
            )
        return app.openapi_schema

    app.openapi = build  # type: ignore[method-assign]


def describe(doc: dict[str, Any]) -> dict[str, Any]:
    components = doc.setdefault("components", {})
    schemas = components.setdefault("schemas", {})
    schemas["Error"] = _ERROR
    schemas["OllamaError"] = _OLLAMA_ERROR
    schemas["AnthropicError"] = _ANTHROPIC_ERROR
    for name in ("HTTPValidationError", "ValidationError"):
        components.get("schemas", {}).pop(name, None)
    components["securitySchemes"] = {
        "bearer": {
            "type": "http",
            "scheme": "bearer",
            "description": "Needed once a key exists (`localllm keys add NAME`); "
            "Anthropic's x-api-key header is accepted too",
        }
    }
    for path, operations in doc.get("paths", {}).items():
        for method, op in operations.items():
            responses = op.setdefault("responses", {})
            responses.pop("422", None)
            codes = list(_ALWAYS)
            if method in ("post", "put", "patch", "delete"):
                codes += _WITH_BODY
            elif any(p.get("in") == "query" for p in op.get("parameters", [])):
                codes.append("400")  # a query parameter out of range
            if path == "/health":
                codes = ["403", "503"]
            else:
                op["security"] = [{}, {"bearer": []}]
            for code in codes:
                responses.setdefault(
                    code,
                    {
                        "description": _WHY[code],
                        "content": {"application/json": {"schema": {"$ref": _error_ref(path)}}},
                    },
                )
            if path in _STREAMED and "200" in responses:
                content = responses["200"].setdefault("content", {})
                content["text/event-stream"] = {
                    # one server-sent event (OpenAPI 3.1: `schema` describes each event)
                    "schema": {
                        "type": "object",
                        "required": ["data"],
                        "properties": {
                            "data": {
                                "type": "string",
                                "description": "a chunk as JSON, or [DONE] last",
                            }
                        },
                    },
                }
            if path in _NDJSON and "200" in responses:
                content = responses["200"].setdefault("content", {})
                # one line of the stream: a JSON object (the last says "done")
                content["application/x-ndjson"] = {"schema": {"type": "object"}}
    return doc
