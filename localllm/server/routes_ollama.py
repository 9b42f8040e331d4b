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
from typing import Any, Literal

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse
from pydantic import Field

from localllm import __version__
from localllm.backends import reasoning
from localllm.backends.base import (
    Chunk,
    GenerationStats,
    Message,
    ModelRef,
    SamplingParams,
    ToolCall,
)
from localllm.backends.chat_template import CHATML
from localllm.backends.tools import ReplyReader, ToolChoice, ToolSpec, new_call_id
from localllm.config import Settings
from localllm.engine import grammar
from localllm.engine.client import EngineClient
from localllm.engine.stream import ChunkStream
from localllm.engine.worker import Request as EngineRequest
from localllm.errors import InvalidRequest, LocalLLMError, ModelNotFound
from localllm.models.gguf import ModelMeta
from localllm.models.sampling import recommended
from localllm.server import protocol as wire
from localllm.server.errors import stream_error
from localllm.server.model_facts import capabilities, meta_of
from localllm.server.routes_openai import _collect, _who, start
from localllm.units import format_params

router = APIRouter()

# The Ollama version /api/version reports: clients gate features on it (VS Code Copilot
# refuses anything below 0.6.4). localllm's own version is reported beside it.
OLLAMA_VERSION = "0.12.0"


# -- requests -----------------------------------------------------------------------


class Options(wire._Wire):
    """Ollama's `options`: the sampling ones localllm honours. Others (mirostat, num_gpu,
    ...) are a 400 naming them, as every unknown field is."""

    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    top_k: int | None = Field(default=None, ge=0)
    min_p: float | None = Field(default=None, ge=0.0, le=1.0)
    num_predict: int | None = Field(default=None, ge=-2)  # -1, -2: until the context ends
    num_ctx: int | None = Field(default=None, ge=16, le=1 << 20)
    stop: list[wire.Text] | None = Field(default=None, max_length=wire.MAX_STOP_STRINGS)
    seed: int | None = None
    repeat_penalty: float | None = Field(default=None, gt=0.0, le=10.0)
    frequency_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    presence_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)

    def sampling(self, grammar_text: str | None) -> SamplingParams:
        limit = self.num_predict if self.num_predict and self.num_predict > 0 else None
        return SamplingParams.asked(
            temperature=self.temperature,
            top_p=self.top_p,
            top_k=self.top_k,
            min_p=self.min_p,
            repeat_penalty=self.repeat_penalty,
            frequency_penalty=self.frequency_penalty,
            presence_penalty=self.presence_penalty,
            seed=self.seed,
            max_tokens=limit,
            stop=tuple(s for s in self.stop or () if s) or None,
            grammar=grammar_text,
        )


class OllamaFunction(wire._Wire):
    name: wire.Text
    arguments: dict[str, Any] = Field(default_factory=dict)
    index: int | None = None  # newer Ollama numbers the calls


class OllamaToolCall(wire._Wire):
    function: OllamaFunction
    id: wire.Text | None = None
    type: Literal["function"] | None = None


class OllamaMessage(wire._Wire):
    role: Literal["system", "user", "assistant", "tool"]
    content: wire.Text = ""
    images: list[str] | None = None
    tool_calls: list[OllamaToolCall] | None = None
    tool_name: wire.Text | None = None
    thinking: wire.Text | None = None  # a thinking model's reasoning, sent back: not rendered

    def to_message(self) -> Message:
        if self.images:
            raise InvalidRequest(
                "This model has no vision support: it cannot read images.",
                param="images",
                code="vision_not_supported",
            )
        calls = tuple(
            ToolCall(
                c.id or new_call_id(),
                c.function.name,
                json.dumps(c.function.arguments, ensure_ascii=False),
            )
            for c in self.tool_calls or ()
        )
        name = self.tool_name if self.role == "tool" else None
        return Message(self.role, self.content, tool_calls=calls, name=name)


class _Common(wire._Wire):
    model: wire.Name
    format: Literal["json", ""] | dict[str, Any] | None = None
    options: Options | None = None
    stream: bool = True
    keep_alive: wire.KeepAlive = None
    think: bool | None = None

    def grammar(self) -> str | None:
        if not self.format:
            return None
        if self.format == "json":
            return grammar.any_json_object()
        assert isinstance(self.format, dict)
        return grammar.from_json_schema(self.format, param="format")

    def sampling(self) -> SamplingParams:
        return (self.options or Options()).sampling(self.grammar())

    def engine_fields(self, request: Request) -> dict[str, Any]:
        options = self.options or Options()
        return {
            "model": model_name(self.model),
            "keep_alive": self.keep_alive,
            "min_ctx": options.num_ctx,
            "template_vars": None if self.think is None else {"enable_thinking": self.think},
            **_who(request),
        }


class ChatBody(_Common):
    messages: list[OllamaMessage] = Field(default_factory=list)
    tools: list[wire.ToolDef] | None = None

    def tool_spec(self) -> ToolSpec | None:
        functions = [t.function.model_dump(exclude_none=True) for t in self.tools or ()]
        return wire.tool_spec(functions, ToolChoice())


class GenerateBody(_Common):
    prompt: wire.Text = ""
    suffix: wire.Text | None = None
    system: wire.Text | None = None
    raw: bool = False
    images: list[str] | None = None


class NameBody(wire._Wire):
    model: wire.Name | None = None
    name: wire.Name | None = None  # older clients say `name`
    verbose: bool | None = None

    def which(self) -> str:
        chosen = self.model or self.name
        if not chosen:
            raise InvalidRequest("'model' is required", param="model")
        return model_name(chosen)


class PullBody(NameBody):
    stream: bool = True
    insecure: bool | None = None


def model_name(name: str) -> str:
    """Ollama clients add the default tag ":latest" to a bare name; it names the model."""
    return name.removesuffix(":latest")


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
    """One answer in Ollama's shape, for /api/chat (`message`) or /api/generate
    (`response`)."""

    def __init__(
        self,
        model: str,
        chat: bool,
        reader: ReplyReader | None,
        t0: float,
        thinking: str | None = None,
    ) -> None:
        self.model, self.chat, self.reader, self.t0 = model, chat, reader, t0
        # a thinking model's think block goes in message.thinking, as Ollama's does
        self.splitter = reasoning.ReasoningSplitter(thinking) if chat and thinking else None

    def piece(self, text: str, *, done: Chunk | None = None) -> dict[str, Any] | None:
        calls: list[ToolCall] = []
        thought = ""
        if self.splitter is not None:
            thought, text = self.splitter.feed(text)
            if done is not None:
                more_thought, more_text = self.splitter.close()
                thought, text = thought + more_thought, text + more_text
        if self.reader is not None:
            text = self.reader.feed(text)
            if done is not None:
                rest = self.reader.close()
                text, calls = text + rest.content, rest.calls
        if done is None and not text and not thought:
            return None
        body: dict[str, Any] = {"model": self.model, "created_at": _now()}
        if self.chat:
            message: dict[str, Any] = {"role": "assistant", "content": text}
            if thought:
                message["thinking"] = thought.strip() if done is not None else thought
            if calls:
                message["tool_calls"] = _ollama_calls(calls)
            body["message"] = message
        else:
            body["response"] = text
        if done is None:
            body["done"] = False
        else:
            body.update(_done_fields(done, self.t0))
        return body


async def _answer(
    request: Request, engine_request: EngineRequest, stream_it: bool, chat: bool
) -> JSONResponse | StreamingResponse:
    t0 = time.perf_counter()
    stream, started, reader = await start(request, engine_request)
    reply = _Reply(started.model, chat, reader, t0, started.reasoning)
    if not stream_it:
        text, _, final = await _collect(stream, request)
        body = reply.piece(text, done=final)
        return JSONResponse(body)
    settings: Settings = request.app.state.settings
    return StreamingResponse(
        _lines(stream, reply, settings.stream_interval_ms / 1000.0),
        media_type="application/x-ndjson",
    )


async def _lines(stream: ChunkStream, reply: _Reply, interval_s: float) -> AsyncIterator[bytes]:
    last = float("-inf")

    def due_in() -> float:
        return max(0.0, last + interval_s - time.monotonic())

    try:
        async for text, _, final in stream.pieces(due_in):
            body = reply.piece(text, done=final)
            if body is not None:
                yield json.dumps(body, ensure_ascii=False).encode() + b"\n"
                last = time.monotonic()
    except Exception as exc:  # after the first line: the error as the last line
        yield json.dumps(stream_error(exc, "/api/"), ensure_ascii=False).encode() + b"\n"
    finally:
        stream.cancel()


async def _load_only(request: Request, body: _Common, chat: bool) -> JSONResponse:
    """An empty prompt or message list loads the model (keep_alive 0: unloads it)."""
    engine: EngineClient = request.app.state.engine
    settings: Settings = request.app.state.settings
    name = model_name(body.model)
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


@router.get("/", include_in_schema=False)
async def root() -> PlainTextResponse:
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
                "remote_host": engine.remotes.upstreams[m.remote].remote.url,
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
            "capabilities": capabilities(meta, ref.format),
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


@router.post("/api/chat", response_model=None)
async def chat(body: ChatBody, request: Request) -> JSONResponse | StreamingResponse:
    if not body.messages:
        return await _load_only(request, body, chat=True)
    settings: Settings = request.app.state.settings
    req = EngineRequest(
        body.sampling(),
        messages=[m.to_message() for m in body.messages],
        context_policy=settings.context_policy,
        tools=body.tool_spec(),
        **body.engine_fields(request),
    )
    return await _answer(request, req, body.stream, chat=True)


@router.post("/api/generate", response_model=None)
async def generate(body: GenerateBody, request: Request) -> JSONResponse | StreamingResponse:
    if body.images:
        raise InvalidRequest(
            "This model has no vision support: it cannot read images.",
            param="images",
            code="vision_not_supported",
        )
    if not body.prompt and body.suffix is None:
        return await _load_only(request, body, chat=False)
    fields = body.engine_fields(request)
    if body.raw or body.suffix is not None:
        if body.system:
            raise InvalidRequest("system is not used with raw or suffix", param="system")
        req = EngineRequest(body.sampling(), prompt=body.prompt, suffix=body.suffix, **fields)
    else:
        turns = [Message("system", body.system)] if body.system else []
        turns.append(Message("user", body.prompt))
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
