"""create_app(settings, engine): the FastAPI application over a shared engine."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from fastapi import FastAPI, Request
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from localllm import __version__
from localllm.config import Settings
from localllm.engine.accounting import Accounting
from localllm.engine.client import EngineClient
from localllm.server.admin import router as admin_router
from localllm.server.anthropic.routes import router as anthropic_router
from localllm.server.errors import install_error_handlers
from localllm.server.framing import Streams
from localllm.server.guard import Guard, origin_pattern
from localllm.server.llamacpp.lora import router as lora_router
from localllm.server.llamacpp.rerank import router as rerank_router
from localllm.server.llamacpp.routes import router as llamacpp_router
from localllm.server.metrics import Telemetry
from localllm.server.ollama.embeddings import router as ollama_embeddings_router
from localllm.server.ollama.routes import router as ollama_router
from localllm.server.openai.embeddings import router as embeddings_router
from localllm.server.openai.routes import router
from localllm.server.openapi import install_openapi
from localllm.server.responses.routes import router as responses_router
from localllm.server.wire import error_for

log = logging.getLogger(__name__)

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]


class BodyLimit:
    """Refuse request bodies over `limit` bytes with 413 before any of it is parsed, and
    bodies that take longer than `deadline_s` to arrive with 408."""

    def __init__(
        self,
        app: Callable[[Scope, Receive, Send], Awaitable[None]],
        limit: int,
        deadline_s: float = 120.0,
    ) -> None:
        self.app = app
        self.limit = limit
        self.deadline_s = deadline_s

    async def _reject(
        self, send: Send, size: str, path: str, *, status: int = 413, message: str = ""
    ) -> None:
        message = message or f"The request body is {size} bytes; the limit is {self.limit} bytes."
        code = "payload_too_large" if status == 413 else "body_timeout"
        payload = json.dumps(error_for(path, status, message, "invalid_request_error", None, code))
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(payload.encode())).encode()),
                    (b"connection", b"close"),  # the rest of the body is never read
                ],
            }
        )
        await send({"type": "http.response.body", "body": payload.encode()})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] not in ("POST", "PUT", "PATCH"):
            await self.app(scope, receive, send)
            return
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.limit:
            await self._reject(send, declared.decode(), scope["path"])
            return
        # Read the body here (it is small by construction) so chunked uploads are bounded
        # too, in size and in time: a body trickled a byte every few seconds is cut
        chunks: list[bytes] = []
        total = 0

        async def read() -> bool:
            nonlocal total
            while True:
                message = await receive()
                if message["type"] == "http.disconnect":
                    return False
                chunks.append(message.get("body", b""))
                total += len(chunks[-1])
                if total > self.limit or not message.get("more_body", False):
                    return True

        try:
            whole = await asyncio.wait_for(read(), self.deadline_s)
        except asyncio.TimeoutError:
            log.warning("a request body took over %g s (%d bytes came)", self.deadline_s, total)
            message = (
                f"The request body did not arrive within {self.deadline_s:g} s "
                f"(body_timeout_s; {total:,} bytes came)."
            )
            await self._reject(send, "", scope["path"], status=408, message=message)
            return
        if not whole:
            return
        if total > self.limit:
            await self._reject(send, f"more than {self.limit}", scope["path"])
            return
        body = b"".join(chunks)
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)


def create_app(
    settings: Settings, engine: EngineClient, accounting: Accounting | None = None
) -> FastAPI:
    """The endpoint over `engine`; the caller owns the engine's and accounting's lifetime.
    With `accounting`, its keys guard every route but /health and usage is counted."""
    app = FastAPI(title="localllm", version=__version__, docs_url="/docs", redoc_url=None)
    app.state.engine = engine
    app.state.accounting = accounting  # embeddings and rerank count their tokens (serving.py)
    app.state.settings = settings
    app.state.streams = Streams()  # the paced streams open: they share a frame rate
    install_error_handlers(app)
    app.include_router(router)
    app.include_router(admin_router)
    app.include_router(ollama_router)
    app.include_router(anthropic_router)
    app.include_router(embeddings_router)
    app.include_router(ollama_embeddings_router)
    app.include_router(llamacpp_router)
    app.include_router(rerank_router)
    app.include_router(lora_router)
    app.include_router(responses_router)
    install_openapi(app)

    @app.get("/metrics", include_in_schema=False)
    async def metrics(request: Request) -> Response:
        registry = request.app.state.telemetry.registry
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    # the paths metrics are labelled with (FastAPI may keep an included router's routes
    # behind one entry of app.routes, so they are read from the router)
    routers = [
        router,
        admin_router,
        ollama_router,
        anthropic_router,
        embeddings_router,
        ollama_embeddings_router,
        llamacpp_router,
        rerank_router,
        lora_router,
        responses_router,
    ]
    every = [r for each in routers for r in each.routes] + list(app.routes)
    routes = {str(getattr(r, "path", "")) for r in every}
    telemetry = Telemetry(engine, routes)
    app.state.telemetry = telemetry
    # added last = outermost: the guard sees each request first
    app.add_middleware(BodyLimit, limit=settings.max_body_bytes, deadline_s=settings.body_timeout_s)
    app.add_middleware(
        CORSMiddleware,
        allow_origin_regex=origin_pattern(settings.allowed_origins),
        allow_private_network=True,  # only ever said to an allowed origin
        allow_methods=["GET", "POST", "DELETE", "OPTIONS"],
        allow_headers=["*"],
        expose_headers=["X-Request-Id", "Retry-After"],
        max_age=600,
    )
    posts = {
        str(getattr(r, "path", ""))
        for r in every
        if {"POST", "DELETE"} & set(getattr(r, "methods", None) or ())
    }
    app.add_middleware(
        Guard,
        settings=settings,
        accounting=accounting,
        on_done=telemetry.finish,
        json_paths=posts,
    )
    return app


def close_app(app: FastAPI) -> None:
    """Close what the app opened on first use (the Responses API's SQLite store)."""
    store = getattr(app.state, "responses", None)
    if store is not None:
        store.close()
        app.state.responses = None
