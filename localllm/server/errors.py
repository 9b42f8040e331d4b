"""Every failure leaves the endpoint in OpenAI's error shape; no stack trace reaches a client."""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from localllm.errors import LocalLLMError, QuotaExceeded, ServerBusy
from localllm.server.wire import error_for

log = logging.getLogger(__name__)


def error_response(
    status: int,
    message: str,
    err_type: str,
    param: str | None = None,
    code: str | None = None,
    headers: dict[str, str] | None = None,
    path: str = "",
) -> JSONResponse:
    body = error_for(path, status, message, err_type, param, code)
    return JSONResponse(body, status, headers=headers)


def local_error_response(exc: LocalLLMError, path: str = "") -> JSONResponse:
    headers = None
    if isinstance(exc, ServerBusy | QuotaExceeded):
        headers = {"Retry-After": str(exc.retry_after)}
    return error_response(
        exc.status, exc.public_message, exc.error_type, exc.param, exc.code, headers, path
    )


def stream_error(exc: BaseException, path: str = "") -> dict[str, Any]:
    """The body of an error that ends a stream after its first frame (the status line is
    sent by then): the error in the shape of the path's API. A bug is logged here and
    said in one line."""
    if isinstance(exc, LocalLLMError):
        return error_for(path, exc.status, exc.public_message, exc.error_type, exc.param, exc.code)
    log.error("a stream failed", exc_info=exc)
    return error_for(path, 500, f"internal error: {exc}", "server_error", None, None)


def _describe(err: dict[str, Any]) -> tuple[str, str | None]:
    """One readable sentence for a pydantic error, and the field it is about."""
    loc = [str(p) for p in err.get("loc", ()) if p != "body"]
    # drop pydantic's union-branch markers such as 'str' / 'list[TextPart]'
    loc = [p for p in loc if not (p[:1].islower() and ("[" in p or p in ("str", "int")))]
    field = ".".join(loc) or None
    if err.get("type") == "json_invalid":
        ctx = err.get("ctx", {}).get("error", "")
        return f"The request body is not valid JSON: {ctx}".rstrip(": "), None
    msg = str(err.get("msg", "invalid value")).removeprefix("Value error, ")
    if err.get("type") == "missing":
        return f"'{field}' is required", field
    if err.get("type") == "extra_forbidden":
        return (
            f"'{field}' is not supported by localllm; remove it from the request",
            field,
        )
    if field is None:
        return f"The request body is invalid: {msg}", None
    value = err.get("input")
    shown = repr(value) if isinstance(value, (int, float, str, bool)) and value is not None else ""
    suffix = f" (got {shown})" if shown and len(shown) < 80 else ""
    return f"Invalid value for '{field}': {msg}{suffix}", field


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(LocalLLMError)
    async def _local(request: Request, exc: LocalLLMError) -> JSONResponse:
        if exc.status >= 500 or exc.public_message != exc.message:
            log.error("%s", exc.message)
        return local_error_response(exc, request.url.path)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        # a union (str | list[str] | list[int]) fails once per branch: say the specific
        # failure (a bound, a bad character) before "should be a valid string"
        errors = sorted(exc.errors(), key=lambda e: str(e.get("type", "")).endswith("_type"))
        message, field = _describe(errors[0]) if errors else ("invalid request", None)
        if len(errors) > 1:
            message += f" (and {len(errors) - 1} more problem(s))"
        first = errors[0].get("type") if errors else None
        code = {"json_invalid": "invalid_json", "extra_forbidden": "unsupported_parameter"}.get(
            str(first), "invalid_value"
        )
        return error_response(
            400, message, "invalid_request_error", field, code, path=request.url.path
        )

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code)
        return error_response(
            exc.status_code,
            str(exc.detail),
            "invalid_request_error",
            None,
            code,
            headers=dict(exc.headers or {}),  # a 405's Allow
            path=request.url.path,
        )

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error")
        message = f"Internal error: {type(exc).__name__}"
        return error_response(500, message, "server_error", path=request.url.path)
