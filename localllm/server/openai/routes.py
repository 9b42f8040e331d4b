"""/v1/chat/completions, /v1/completions, /v1/models and /health."""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, StreamingResponse

from localllm.backends.base import Message
from localllm.backends.tools import ToolSpec
from localllm.engine.client import EngineClient
from localllm.engine.output import Delta
from localllm.engine.request import Request as EngineRequest
from localllm.engine.request import Started
from localllm.engine.stream import ChunkStream
from localllm.models import projector
from localllm.server.errors import stream_error
from localllm.server.framing import SSE_COMMENT, SSE_DONE, paced, sse, streaming
from localllm.server.media import off_loop, prefetch
from localllm.server.model_facts import capabilities, damage_of, meta_of
from localllm.server.openai import shapes
from localllm.server.openai.schemas import ChatCompletionRequest, CompletionRequest, SamplingFields
from localllm.server.serving import collect, engine_of, pace, start, start_streamed, who
from localllm.server.wire import now as wire_now

router = APIRouter()


async def _respond(
    request: Request,
    body: SamplingFields,
    req: EngineRequest,
    kind: type[shapes.Shapes],
) -> JSONResponse | StreamingResponse:
    """Run a request; answer with one JSON body or an SSE stream in `kind`'s wire shape."""
    blank = body.prompt_only()  # llama-server's n_predict 0: the prompt is read, no answer

    def shaped(started: Started) -> shapes.Shapes:
        logprobs = req.params.logprobs is not None
        out = kind(started.model, started.prompt_tokens, logprobs=logprobs)
        if started.dropped_messages:
            out.truncated = {
                "dropped_messages": started.dropped_messages,
                "prompt_tokens_before": started.prompt_tokens_before,
            }
        if started.fallback_from is not None:
            out.fallback = fallback_field(started)
        if started.quota_max_tokens is not None:  # the key's quota for today cut the limit
            out.quota = {"max_tokens": started.quota_max_tokens}
        return out

    if not body.stream:
        stream, started = await start(request, req)
        whole = await collect(stream, request)
        out = shaped(started)
        return JSONResponse(shapes.whole(out, Delta(final=whole.final) if blank else whole))
    include_usage = bool(body.stream_options and body.stream_options.include_usage)

    def answer(stream: ChunkStream, started: Started) -> StreamingResponse:
        out = shaped(started)

        def encode(delta: Delta) -> list[bytes]:
            delta = Delta(final=delta.final) if blank else delta
            return [sse(f) for f in shapes.frames(out, delta, include_usage=include_usage)]

        frames = paced(
            stream,
            encode,
            pace=pace(request),
            on_error=lambda exc: sse(stream_error(exc)),
            tail=(SSE_DONE,),
            keep_alive=SSE_COMMENT,
        )
        return streaming(frames)

    return await start_streamed(
        request,
        req,
        answer,
        keep_alive=SSE_COMMENT,
        on_error=lambda exc: sse(stream_error(exc)) + SSE_DONE,
    )


@router.post("/v1/chat/completions", response_model=None)
async def chat_completions(
    body: ChatCompletionRequest, request: Request
) -> JSONResponse | StreamingResponse:
    fetched = await prefetch(request, [u for m in body.messages for u in m.image_urls()])
    messages = await off_loop(
        lambda: [m.to_message(fetched) for m in body.messages], request, body.model
    )
    tools = await off_loop(body.tool_spec)  # a thousand tools' schemas compiled
    policy = request.app.state.settings.context_policy
    req = chat_request(body, messages, tools, context_policy=policy, **who(request))
    return await _respond(request, body, req, shapes.ChatShapes)


def chat_request(
    body: ChatCompletionRequest,
    messages: list[Message],
    tools: ToolSpec | None = None,
    **extra: Any,
) -> EngineRequest:
    """The engine's request for a chat completion body (its messages and tools already
    read; tools None: read here): what the route submits, and what the exactness matrix
    test replays in-process."""
    return EngineRequest(
        body.sampling(),
        messages=messages,
        model=body.model,
        tools=tools if tools is not None else body.tool_spec(),
        template_vars=body.chat_template_kwargs,
        response_format=body.wire_response_format(),
        **body.extensions(),
        **extra,
    )


@router.post("/v1/completions", response_model=None)
async def completions(
    body: CompletionRequest, request: Request
) -> JSONResponse | StreamingResponse:
    prompt = body.prompt
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], int):
        tokens = [int(t) for t in prompt]
        req = EngineRequest(
            body.sampling(),
            prompt_tokens=tokens,
            model=body.model,
            **body.extensions(),
            **who(request),
        )
    else:
        text = prompt[0] if isinstance(prompt, list) else prompt
        req = EngineRequest(
            body.sampling(),
            prompt=str(text),
            suffix=body.suffix,
            model=body.model,
            **body.extensions(),
            **who(request),
        )
    return await _respond(request, body, req, shapes.TextShapes)


@router.get("/v1/models")
async def list_models(request: Request) -> JSONResponse:
    """Local models, with extension fields: `context_length` (the trained context, which a
    longer prompt may use when memory allows), `loaded_context_length` (what it is loaded
    with now, or null) and `capabilities`."""
    engine = engine_of(request)
    body = await asyncio.to_thread(_model_rows, engine)
    for m in await engine.remotes.models():
        body["data"].append(
            {
                "id": m.name,
                "object": "model",
                "created": body["data"][0]["created"] if body["data"] else wire_now(),
                "owned_by": f"remote:{m.remote}",
                "context_length": m.n_ctx,
                "loaded_context_length": m.n_ctx,
                "capabilities": ["completion", "tools"],
            }
        )
    return JSONResponse(body)


def fallback_field(started: Started) -> dict[str, str | None]:
    """The extension field of an answer the local fallback gave for a remote model."""
    return {"requested": started.fallback_from, "model": started.model, "reason": started.note}


def _model_rows(engine: EngineClient) -> dict[str, Any]:
    loaded = {row["model"]: row for row in engine.status().resident() if not row["draft_for"]}
    created = wire_now()
    rows: list[dict[str, Any]] = []
    seen = set()
    for ref in engine.models():
        if ref.name in seen:
            continue
        seen.add(ref.name)
        row = {"id": ref.name, "object": "model", "created": created, "owned_by": "local"}
        damage = damage_of(ref)
        if damage is not None:  # listed, marked, so the others still show
            rows.append({**row, "damaged": damage})
            continue
        meta = meta_of(ref)
        now = loaded.get(ref.name)
        row["context_length"] = meta.n_ctx_train
        row["loaded_context_length"] = now["n_ctx"] if now else None
        # a projector beside it, or the one it was loaded with (--mmproj)
        media = projector.kinds(ref.path) | frozenset(now["media"] if now else ())
        row["capabilities"] = capabilities(meta, ref.format, media)
        rows.append(row)
    for name, now in loaded.items():  # a model loaded by path is listed too
        if name not in seen:
            rows.insert(
                0,
                {
                    "id": name,
                    "object": "model",
                    "created": created,
                    "owned_by": "local",
                    "loaded_context_length": now["n_ctx"],
                },
            )
    return {"object": "list", "data": rows}


@router.get("/health")
async def health(request: Request) -> JSONResponse:
    engine = engine_of(request)
    status = engine.status()
    ref = status.model_ref
    body = {
        "status": "ok" if status.state == "ready" else status.state,
        "model": ref.name if ref else None,
        "queued": status.queued,
        "activity": dict(status.activity),
        "totals": dict(status.totals),
        "prompt_cache": dict(status.prompt_cache),
        "models": status.resident(),
        "remotes": engine.remotes.status(),
    }
    if status.dead is not None:
        body["error"] = f"the engine stopped: {status.dead}; restart localllm"
    elif status.last_error and status.state == "ready":
        body["last_load_error"] = status.last_error  # another model failed; this one serves
    elif status.last_error:
        body["error"] = status.last_error
    return JSONResponse(body, status_code=200 if status.state == "ready" else 503)
