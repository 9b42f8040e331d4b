"""OpenAI's Responses API: `POST /v1/responses` (whole or streamed), `GET` and `DELETE
/v1/responses/{id}`, `GET /v1/responses/{id}/input_items`, `POST
/v1/responses/input_tokens`. Codex CLI and the OpenAI SDK's `client.responses` speak it.

A request becomes one engine chat: `instructions` as the system message, then the
conversation so far (the stored chain behind `previous_response_id`) and the new input
items. With `store` (the default) the response and its conversation are kept in
SQLite (store.py); the prompt cache holds the previous answer's KV, so a continuation
reads only what is new (`usage.input_tokens_details.cached_tokens`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sqlite3
from collections.abc import AsyncIterator
from typing import Any

import pydantic
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, StreamingResponse

from localllm.backends.base import Message, SamplingParams
from localllm.engine.output import Delta
from localllm.engine.request import Request as EngineRequest
from localllm.engine.request import Started
from localllm.engine.stream import ChunkStream
from localllm.errors import InvalidRequest, LocalLLMError
from localllm.server.errors import stream_error
from localllm.server.framing import SSE_COMMENT, paced, sse_event, streaming
from localllm.server.media import off_loop, prefetch
from localllm.server.responses.output import Answer, item_id
from localllm.server.responses.schemas import (
    CreateBody,
    Item,
    NamedChoice,
    ResponsesBody,
    dumped,
    image_urls,
    messages_of,
)
from localllm.server.responses.store import BrokenChain, ResponseStore
from localllm.server.serving import (
    admin_of,
    collect,
    engine_of,
    pace,
    settings_of,
    start,
    start_streamed,
    who,
)

router = APIRouter()
log = logging.getLogger(__name__)
_ITEMS = pydantic.TypeAdapter(list[Item])


class ResponseNotFound(LocalLLMError):
    status = 404
    error_type = "invalid_request_error"
    code = "response_not_found"

    def __init__(self, response_id: str, param: str | None = None) -> None:
        super().__init__(
            f"No stored response with id {response_id!r} (responses made with store: false "
            "are not kept)."
        )
        self.param = param


def store_of(request: Request) -> ResponseStore:
    """The app's store, opened on first use (so an app that never sees the Responses API
    writes no file); the server closes it when it stops (server/runner.py)."""
    state = request.app.state
    if getattr(state, "responses", None) is None:
        state.responses = ResponseStore(settings_of(request).data_dir / "responses.db")
    store: ResponseStore = state.responses
    return store


def owner_of(request: Request) -> str:
    """Whose stored responses this request may see: its key's name (server/guard.py)."""
    return admin_of(request)[1]


def _with_ids(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    prefixes = {"message": "msg", "function_call": "fc", "function_call_output": "fco"}
    return [
        i if i.get("id") else {**i, "id": item_id(prefixes.get(i["type"], "item"))} for i in items
    ]


async def _conversation(request: Request, body: ResponsesBody) -> tuple[list[Item], list[Item]]:
    """The items before this request (the stored chain) and this request's own."""
    earlier: list[Item] = []
    if body.previous_response_id is not None:
        try:
            found = await asyncio.to_thread(
                store_of(request).conversation, body.previous_response_id, owner_of(request)
            )
        except BrokenChain as exc:
            log.warning("%s", exc)
            found = None
        if found is None:
            raise ResponseNotFound(body.previous_response_id, "previous_response_id")
        earlier = _ITEMS.validate_python(found)
    return earlier, body.items()


async def _engine_request(
    request: Request, body: ResponsesBody, params: SamplingParams, items: list[Item]
) -> EngineRequest:
    body.check_include()
    fetched = await prefetch(request, image_urls(items))
    messages = await off_loop(lambda: messages_of(items, fetched), request, body.model)
    if body.instructions:
        messages.insert(0, Message("system", body.instructions))
    if not messages:
        raise InvalidRequest("The input is empty: send text or input items.", param="input")
    return EngineRequest(
        params,
        messages=messages,
        model=body.model,
        context_policy=settings_of(request).context_policy,
        tools=await off_loop(body.tool_spec),
        template_vars=body.template_vars(),
        keep_alive=getattr(body, "keep_alive", None),
        **who(request),
    )


def _choice_echo(choice: NamedChoice | str | None) -> dict[str, Any] | str:
    if isinstance(choice, NamedChoice):
        return choice.model_dump()
    return choice or "auto"


def _echo(body: CreateBody, spec_tools: list[dict[str, Any]]) -> dict[str, Any]:
    fmt = body.text.format if body.text and body.text.format else None
    return {
        "instructions": body.instructions,
        "max_output_tokens": body.max_output_tokens,
        "parallel_tool_calls": body.parallel_tool_calls is True,
        "previous_response_id": body.previous_response_id,
        "reasoning": body.reasoning.model_dump() if body.reasoning else None,
        "store": body.store,
        "temperature": body.temperature,
        "top_p": body.top_p,
        "text": {
            "format": fmt.model_dump(by_alias=True, exclude_none=True) if fmt else {"type": "text"}
        },
        "tool_choice": _choice_echo(body.tool_choice),
        "tools": spec_tools,
        "truncation": body.truncation or "disabled",
        "metadata": {},
    }


@router.post("/v1/responses", response_model=None)
async def create(body: CreateBody, request: Request) -> JSONResponse | StreamingResponse:
    earlier, items = await _conversation(request, body)
    req = await _engine_request(request, body, body.sampling(), earlier + items)
    offered = [
        {"type": "function", **f, "strict": f.get("strict", False)}
        for f in (req.tools.functions() if req.tools else [])
    ]
    own = _with_ids(dumped(items))

    owner = owner_of(request)

    def keep(response: dict[str, Any]) -> None:
        """Store the response; an answer that was generated is returned even when the
        store cannot take it (its database locked by another program past its timeout):
        with a `store_warning` saying so (a streamed one's last event is sent already,
        so it is logged)."""
        if body.store:
            try:
                store_of(request).put(response, own, owner, body.previous_response_id)
            except sqlite3.Error as exc:
                log.warning("response %s not stored: %s", response.get("id"), exc)
                response["store_warning"] = f"not stored ({exc}): it cannot be continued"

    def answer_for(started: Started) -> Answer:
        return Answer(started.model, started.prompt_tokens, _echo(body, offered), body.namespaces())

    if not body.stream:
        stream, started = await start(request, req)
        response = answer_for(started).whole(await collect(stream, request))
        await asyncio.to_thread(keep, response)
        return JSONResponse(response)

    def failed(exc: Exception) -> bytes:
        error = stream_error(exc)["error"]
        return sse_event(
            "error",
            {
                "type": "error",
                "sequence_number": 0,
                "code": error.get("code"),
                "message": error["message"],
                "param": error.get("param"),
            },
        )

    def streamed(stream: ChunkStream, started: Started) -> StreamingResponse:
        answer = answer_for(started)
        finished: list[dict[str, Any]] = []  # the whole response, once its last delta is framed

        def encode(delta: Delta) -> list[bytes]:
            events = answer.frame(delta)
            if delta.final is not None:
                finished.append(answer.body())
            return [sse_event(e["type"], e) for e in events]

        head = [sse_event(e["type"], e) for e in answer.head()]
        paced_frames = paced(
            stream,
            encode,
            pace=pace(request),
            on_error=failed,
            head=head,
            keep_alive=SSE_COMMENT,
        )

        async def frames() -> AsyncIterator[bytes]:
            # stored (off the event loop) before the client reads response.completed, so a
            # request continuing from it at once finds it
            async with contextlib.aclosing(paced_frames):  # a client that leaves cancels it
                async for frame in paced_frames:
                    if finished:
                        await asyncio.to_thread(keep, finished.pop())
                    yield frame

        return streaming(frames())

    return await start_streamed(request, req, streamed, keep_alive=SSE_COMMENT, on_error=failed)


@router.post("/v1/responses/input_tokens")
async def input_tokens(body: ResponsesBody, request: Request) -> JSONResponse:
    earlier, items = await _conversation(request, body)
    req = await _engine_request(request, body, SamplingParams(), earlier + items)
    tokens = await asyncio.to_thread(engine_of(request).prompt_tokens, req)
    return JSONResponse({"object": "response.input_tokens", "input_tokens": len(tokens)})


@router.api_route("/v1/responses/{response_id}", methods=["GET", "DELETE"])
async def one(response_id: str, request: Request) -> JSONResponse:
    """GET: the stored response; DELETE: forget it."""
    store, owner = store_of(request), owner_of(request)
    if request.method == "DELETE":
        if not await asyncio.to_thread(store.delete, response_id, owner):
            raise ResponseNotFound(response_id)
        return JSONResponse({"id": response_id, "object": "response", "deleted": True})
    found = await asyncio.to_thread(store.body, response_id, owner)
    if found is None:
        raise ResponseNotFound(response_id)
    return JSONResponse(found)


@router.get("/v1/responses/{response_id}/input_items")
async def input_items(
    response_id: str, request: Request, order: str = "desc", limit: int = 20
) -> JSONResponse:
    found = await asyncio.to_thread(store_of(request).input_items, response_id, owner_of(request))
    if found is None:
        raise ResponseNotFound(response_id)
    if order not in ("asc", "desc"):
        raise InvalidRequest(f"order is 'asc' or 'desc', got {order!r}", param="order")
    if not 1 <= limit <= 100:
        raise InvalidRequest(f"limit is from 1 to 100, got {limit}", param="limit")
    rows = found if order == "asc" else list(reversed(found))
    page = rows[:limit]
    return JSONResponse(
        {
            "object": "list",
            "data": page,
            "first_id": page[0]["id"] if page else None,
            "last_id": page[-1]["id"] if page else None,
            "has_more": len(rows) > limit,
        }
    )
