"""The Ollama API on the endpoint's port: what VS Code Copilot, Zed, JetBrains AI Assistant
and Continue speak to a local server. `localllm serve --port 11434` stands in for Ollama.

Requests go to the same engine as the OpenAI routes; answers are Ollama's shapes:
NDJSON streams (one JSON object per line, the last with `"done": true` and the
timings in nanoseconds), tool calls with their arguments as objects, and errors as
`{"error": "..."}` (server/errors.py writes that shape for every /api/ path).
"""

from __future__ import annotations

import asyncio
import datetime
import hashlib
import json
import time
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse

from localllm import __version__
from localllm.backends import media
from localllm.backends.base import (
    Chunk,
    GenerationStats,
    Message,
    ModelRef,
    SamplingParams,
    ToolCall,
)
from localllm.backends.chat_template import CHATML
from localllm.backends.remote import shown_url
from localllm.config import Settings
from localllm.engine.client import EngineClient
from localllm.engine.output import Delta
from localllm.engine.request import Request as EngineRequest
from localllm.errors import AdminRequired, InvalidRequest, LocalLLMError, ModelNotFound
from localllm.models import projector
from localllm.models.gguf import ModelMeta
from localllm.models.sampling import recommended
from localllm.server import media as smedia
from localllm.server.errors import stream_error
from localllm.server.framing import ndjson, paced, streaming
from localllm.server.model_facts import capabilities, damage_of, meta_of
from localllm.server.ollama.schemas import (
    ChatBody,
    GenerateBody,
    NameBody,
    PullBody,
    _Common,
    model_name,
)
from localllm.server.serving import admin_of, collect, pace, start
from localllm.units import format_params

router = APIRouter()

# The Ollama version /api/version reports: clients gate features on it (VS Code Copilot
# refuses anything below 0.6.4). localllm's own version is reported beside it.
# what Ollama clients check: Codex CLI --oss refuses one older than 0.13.4
OLLAMA_VERSION = "0.13.5"


# -- model descriptions -------------------------------------------------------------


def _modified(ref: ModelRef) -> str:
    stamp = ref.path.stat().st_mtime
    return datetime.datetime.fromtimestamp(stamp, datetime.timezone.utc).isoformat()


def _digest(ref: ModelRef) -> str:
    """A stable identity for the file (Ollama's is its blob's SHA-256; hashing gigabytes
    for a listing is not worth it: path, size and time stand in)."""
    stat = ref.path.stat()
    text = f"{ref.path}:{stat.st_size}:{stat.st_mtime_ns}"
    return hashlib.sha256(text.encode()).hexdigest()


def details(meta: ModelMeta, fmt: str) -> dict[str, Any]:
    return {
        "parent_model": "",
        "format": fmt,
        "family": meta.arch,
        "families": [meta.arch],
        "parameter_size": format_params(meta.params),
        "quantization_level": meta.quant,
    }


def _tag(ref: ModelRef) -> dict[str, Any]:
    damage = damage_of(ref)
    if damage is not None:  # listed, marked, so the others still show
        return {
            "name": ref.name,
            "model": ref.name,
            "modified_at": _modified(ref),
            "size": ref.size_bytes,
            "digest": _digest(ref),
            "details": {
                "format": ref.format,
                "family": "",
                "parameter_size": "",
                "quantization_level": "",
            },
            "damaged": damage,
        }
    meta = meta_of(ref)
    return {
        "name": ref.name,
        "model": ref.name,
        "modified_at": _modified(ref),
        "size": ref.size_bytes or meta.file_size,
        "digest": _digest(ref),
        "details": details(meta, ref.format),
    }


# -- streaming ----------------------------------------------------------------------


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat().replace("+00:00", "Z")


def _done_fields(final: Chunk, t0: float) -> dict[str, Any]:
    stats = final.stats or GenerationStats(0, 0, 0, 0.0, 0.0)
    decode_s = (stats.generated_tokens - 1) / stats.decode_tps if stats.decode_tps else 0.0
    reason = {"length": "length", "cancelled": "stop"}.get(str(final.finish_reason), "stop")
    return {
        "done": True,
        "done_reason": reason,
        "total_duration": int((time.perf_counter() - t0) * 1e9),
        "load_duration": 0,
        "prompt_eval_count": stats.prompt_tokens,
        "prompt_eval_duration": int(stats.ttft_s * 1e9),
        "eval_count": stats.generated_tokens,
        "eval_duration": int(decode_s * 1e9),
    }


def _ollama_calls(calls: list[ToolCall]) -> list[dict[str, Any]]:
    return [
        {
            "id": c.id,
            "function": {"index": i, "name": c.name, "arguments": json.loads(c.arguments)},
        }
        for i, c in enumerate(calls)
    ]


class _Reply:
    """One answer in Ollama's shape, for /api/chat (`message`, with a thinking model's
    reasoning in `message.thinking`, as Ollama's) or /api/generate (`response`)."""

    def __init__(self, model: str, chat: bool, t0: float) -> None:
        self.model, self.chat, self.t0 = model, chat, t0

    def body(self, delta: Delta) -> dict[str, Any] | None:
        done = delta.final
        if done is None and not delta.text and not delta.reasoning:
            return None
        body: dict[str, Any] = {"model": self.model, "created_at": _now()}
        if self.chat:
            message: dict[str, Any] = {"role": "assistant", "content": delta.text}
            thought = delta.reasoning
            if thought:
                message["thinking"] = thought.strip() if done is not None else thought
            if delta.tool_calls:
                message["tool_calls"] = _ollama_calls(list(delta.tool_calls))
            body["message"] = message
        else:
            body["response"] = delta.text
        if done is None:
            body["done"] = False
        else:
            body.update(_done_fields(done, self.t0))
        return body

    def lines(self, delta: Delta) -> list[bytes]:
        body = self.body(delta)
        return [] if body is None else [ndjson(body)]


async def _answer(
    request: Request, engine_request: EngineRequest, stream_it: bool, chat: bool
) -> JSONResponse | StreamingResponse:
    t0 = time.perf_counter()
    stream, started = await start(request, engine_request)
    reply = _Reply(started.model, chat, t0)
    if not stream_it:
        return JSONResponse(reply.body(await collect(stream, request)))
    frames = paced(
        stream,
        reply.lines,
        pace=pace(request),
        on_error=lambda exc: ndjson(stream_error(exc, "/api/")),
    )
    return streaming(frames, "application/x-ndjson")


async def _load_only(request: Request, body: _Common, chat: bool) -> JSONResponse:
    """An empty prompt or message list loads the model (keep_alive 0: unloads it)."""
    engine: EngineClient = request.app.state.engine
    settings: Settings = request.app.state.settings
    name = model_name(body.model)
    pinning = body.keep_alive is not None and body.keep_alive < 0
    admin, client = admin_of(request)
    if (body.keep_alive == 0 or pinning) and not admin:
        what = "Unloading a model" if body.keep_alive == 0 else "Keeping a model loaded for good"
        raise AdminRequired(f"{what} (keep_alive {body.keep_alive:g})", client)
    if body.keep_alive == 0:
        await asyncio.to_thread(engine.unload, name)
        reason = "unload"
    else:
        await asyncio.to_thread(
            engine.preload,
            name,
            keep_alive=body.keep_alive,
            allow_paths=settings.allow_model_paths,
        )
        reason = "load"
    out: dict[str, Any] = {"model": name, "created_at": _now(), "done": True}
    out["done_reason"] = reason
    if chat:
        out["message"] = {"role": "assistant", "content": ""}
    else:
        out["response"] = ""
    return JSONResponse(out)


# -- routes -------------------------------------------------------------------------


@router.api_route("/", methods=["GET", "HEAD"], include_in_schema=False)
async def root() -> PlainTextResponse:
    """Ollama's and llama-server's liveness answer (Claude Code sends HEAD / first)."""
    return PlainTextResponse("Ollama is running")


@router.get("/api/version")
async def version() -> JSONResponse:
    return JSONResponse({"version": OLLAMA_VERSION, "localllm": __version__})


@router.get("/api/tags")
async def tags(request: Request) -> JSONResponse:
    engine: EngineClient = request.app.state.engine
    refs = await asyncio.to_thread(engine.models)
    rows = await asyncio.to_thread(lambda: [_tag(r) for r in refs])
    for m in await engine.remotes.models():
        rows.append(
            {
                "name": m.name,
                "model": m.name,
                "modified_at": _now(),
                "size": 0,
                "digest": "",
                "remote_host": shown_url(engine.remotes.upstreams[m.remote].remote.url),
                "details": {
                    "format": "remote",
                    "family": "",
                    "parameter_size": "",
                    "quantization_level": "",
                },
            }
        )
    return JSONResponse({"models": rows})


async def _show_remote(engine: EngineClient, name: str) -> JSONResponse | None:
    """/api/show for a remote engine's model: what the engine says of it."""
    if engine.remotes.find(name) is None:
        return None
    known = {m.name: m for m in await engine.remotes.models()}
    m = known.get(name)
    info: dict[str, Any] = {"general.architecture": "remote"}
    if m is not None and m.n_ctx:
        info["remote.context_length"] = m.n_ctx
    return JSONResponse(
        {
            "license": "",
            "modelfile": "",
            "parameters": "",
            "template": "",
            "details": {
                "format": "remote",
                "family": "",
                "parameter_size": "",
                "quantization_level": "",
            },
            "model_info": info,
            "capabilities": ["completion", "tools"],
            "modified_at": _now(),
        }
    )


@router.post("/api/show")
async def show(body: NameBody, request: Request) -> JSONResponse:
    engine: EngineClient = request.app.state.engine
    settings: Settings = request.app.state.settings
    remote = await _show_remote(engine, body.which())
    if remote is not None:
        return remote
    ref = await asyncio.to_thread(engine.resolve, body.which(), paths=False)
    meta = await asyncio.to_thread(meta_of, ref)
    rec = await asyncio.to_thread(recommended, ref)  # the model's own, where it has some
    defaults = SamplingParams.asked().with_defaults(rec.values)
    parameters = "\n".join(
        f"{key} {value}"
        for key, value in (
            ("temperature", defaults.temperature),
            ("top_p", defaults.top_p),
            ("top_k", defaults.top_k),
            ("min_p", defaults.min_p),
            ("num_ctx", settings.n_ctx or _loaded_ctx(engine, ref.name) or meta.n_ctx_train),
        )
    )
    info = {
        "general.architecture": meta.arch,
        # Copilot's Ollama provider names the model by general.basename
        "general.basename": meta.name,
        "general.name": meta.name,
        "general.parameter_count": meta.params,
        "general.file_type": meta.quant,
        f"{meta.arch}.context_length": meta.n_ctx_train,
        f"{meta.arch}.block_count": meta.n_layers,
        f"{meta.arch}.attention.head_count": meta.n_head,
        f"{meta.arch}.attention.head_count_kv": meta.n_head_kv,
    }
    return JSONResponse(
        {
            "license": "",
            "modelfile": "",
            "parameters": parameters,
            "template": meta.chat_template or CHATML,
            "details": details(meta, ref.format),
            "model_info": info,
            "capabilities": capabilities(meta, ref.format, _media(engine, ref)),
            "modified_at": _modified(ref),
        }
    )


def _loaded_ctx(engine: EngineClient, name: str) -> int | None:
    return engine.status().n_ctx_of(name)


@router.get("/api/ps")
async def ps(request: Request) -> JSONResponse:
    engine: EngineClient = request.app.state.engine
    rows = await asyncio.to_thread(_ps_rows, engine)
    return JSONResponse({"models": rows})


def _ps_rows(engine: EngineClient) -> list[dict[str, Any]]:
    """/api/ps's rows (reads each model's header: on a thread)."""
    rows = []
    now = datetime.datetime.now(datetime.timezone.utc)
    forever = now + datetime.timedelta(days=365 * 100)
    for row in engine.status().resident():
        if row["draft_for"]:
            continue
        try:
            ref = engine.resolve(row["model"], paths=False)
            meta = meta_of(ref)
        except (ModelNotFound, OSError):
            continue
        left = row.get("expires_in_s")
        expires = forever if left is None else now + datetime.timedelta(seconds=left)
        on_gpu = not str(row.get("device", "cpu")).startswith("cpu")
        rows.append(
            {
                "name": ref.name,
                "model": ref.name,
                "size": row["memory_bytes"],
                "digest": _digest(ref),
                "details": details(meta, ref.format),
                "expires_at": expires.isoformat(),
                "size_vram": row["memory_bytes"] if on_gpu else 0,
                "context_length": row["n_ctx"],
            }
        )
    return rows


def _media(engine: EngineClient, ref: ModelRef) -> frozenset[str]:
    """What a model reads beside text: its projector's (beside it, or the one it was
    loaded with)."""
    rows = [r for r in engine.status().resident() if r["model"] == ref.name]
    return projector.kinds(ref.path) | frozenset(m for r in rows for m in r["media"])


@router.post("/api/chat", response_model=None)
async def chat(body: ChatBody, request: Request) -> JSONResponse | StreamingResponse:
    if not body.messages:
        return await _load_only(request, body, chat=True)
    settings: Settings = request.app.state.settings
    req = EngineRequest(
        body.sampling(),
        messages=await smedia.off_loop(
            lambda: [m.to_message() for m in body.messages], request, body.model
        ),
        context_policy=settings.context_policy,
        tools=await smedia.off_loop(body.tool_spec),
        **body.engine_fields(request),
    )
    return await _answer(request, req, body.stream, chat=True)


@router.post("/api/generate", response_model=None)
async def generate(body: GenerateBody, request: Request) -> JSONResponse | StreamingResponse:
    if not body.prompt and body.suffix is None and not body.images:
        return await _load_only(request, body, chat=False)
    fields = body.engine_fields(request)
    if body.raw or body.suffix is not None:
        if body.system:
            raise InvalidRequest("system is not used with raw or suffix", param="system")
        if body.images:
            raise InvalidRequest(
                "images are placed by the model's chat template, which raw and suffix "
                "prompts do not use: send them without raw",
                param="images",
            )
        req = EngineRequest(body.sampling(), prompt=body.prompt, suffix=body.suffix, **fields)
    else:
        turns = [Message("system", body.system)] if body.system else []
        images = body.images or ()
        items = await smedia.off_loop(
            lambda: smedia.base64_media(images, param="images"), request, body.model
        )
        text = media.with_markers(smedia.check_text(body.prompt, param="prompt"), items)
        turns.append(Message("user", text, media=items))
        req = EngineRequest(body.sampling(), messages=turns, **fields)
    return await _answer(request, req, body.stream, chat=False)


@router.post("/api/pull", response_model=None)
async def pull(body: PullBody, request: Request) -> JSONResponse | StreamingResponse:
    """Pull from the Hugging Face hub (`org/repo[:quant]`), with Ollama's NDJSON progress:
    a line per file every quarter second, then "success" (or {"error": ...})."""
    from localllm.models import hub

    settings: Settings = request.app.state.settings
    spec = body.model or body.name
    if not spec:
        raise InvalidRequest("'model' is required", param="model")
    plan = await asyncio.to_thread(hub.plan_pull, spec)
    loop = asyncio.get_running_loop()
    events: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue()
    last: dict[str, float] = {}

    def progress(path: str, have: int, size: int | None) -> None:
        now = time.monotonic()
        if size is not None and have < size and now - last.get(path, 0.0) < 0.25:
            return
        last[path] = now
        line = {"status": f"pulling {path}", "digest": path, "total": size or have}
        line["completed"] = have
        loop.call_soon_threadsafe(events.put_nowait, line)

    def work() -> None:
        try:
            loop.call_soon_threadsafe(events.put_nowait, {"status": "pulling manifest"})
            hub.pull(plan, settings.models_dir, progress=progress)
            loop.call_soon_threadsafe(events.put_nowait, {"status": "verifying sha256 digest"})
            loop.call_soon_threadsafe(events.put_nowait, {"status": "success"})
        except LocalLLMError as exc:
            loop.call_soon_threadsafe(events.put_nowait, {"error": exc.public_message})
        finally:
            loop.call_soon_threadsafe(events.put_nowait, None)

    task = asyncio.create_task(asyncio.to_thread(work))

    async def lines() -> AsyncIterator[bytes]:
        while (item := await events.get()) is not None:
            yield json.dumps(item).encode() + b"\n"
        await task

    if body.stream:
        return StreamingResponse(lines(), media_type="application/x-ndjson")
    outcome: dict[str, Any] = {}
    async for raw in lines():
        outcome = json.loads(raw)
    if "error" in outcome:
        return JSONResponse(outcome, status_code=500)
    return JSONResponse({"status": "success"})


@router.delete("/api/delete")
async def delete(body: NameBody, request: Request) -> JSONResponse:
    """Remove a model from localllm's own store (never another tool's files)."""
    engine: EngineClient = request.app.state.engine
    name = body.which()
    ref = await asyncio.to_thread(engine.resolve, name, paths=False)
    await asyncio.to_thread(engine.unload, ref.name)
    await asyncio.to_thread(engine.remove, ref)
    return JSONResponse({})
