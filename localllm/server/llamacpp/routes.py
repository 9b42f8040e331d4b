"""llama.cpp server's own routes that editor plugins use: `/infill` (llama.vim,
llama.vscode), `/tokenize`, `/detokenize` and `/props`.

`/infill` lays out a repo-level fill-in-the-middle prompt as llama.cpp does (engine
`infill_tokens`): the extra context chunks first (with file separators where the
vocabulary has them), then prefix, suffix and the text typed so far. The chunks lead
the prompt, so the prompt cache keeps them across requests (`tokens_cached`).
The answer is llama-server's completion object; `response_fields` picks fields from it,
with nested ones named by path (`"timings/predicted_n"`) and returned flattened.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, Literal

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from pydantic import Field

from localllm import __version__
from localllm.backends.base import SamplingParams
from localllm.config import Settings
from localllm.engine.client import EngineClient
from localllm.engine.request import Infill
from localllm.engine.request import Request as EngineRequest
from localllm.errors import InvalidRequest
from localllm.server import wire
from localllm.server.serving import IDLE_WAKE_S, cancel_on_disconnect, start, who

router = APIRouter()

# the names in llama-server's `samplers` that localllm honours: a filter left out of the
# list is off; they run in localllm's order. "infill" (llama.cpp's end-of-fill handling)
# is taken as a name llama.vim always sends: the fill ends at the model's end token.
SAMPLERS = {"top_k", "top_p", "min_p", "temperature", "penalties", "infill"}


class ExtraChunk(wire.Wire):
    text: wire.Text
    filename: wire.Text = ""


class InfillBody(wire.Wire):
    input_prefix: wire.Text = ""
    input_suffix: wire.Text = ""
    input_extra: list[ExtraChunk] = Field(default_factory=list, max_length=1024)
    prompt: wire.Text = ""
    model: wire.Name | None = None
    n_predict: int = Field(default=-1, ge=-1)
    stop: list[wire.Text] = Field(default_factory=list, max_length=wire.MAX_STOP_STRINGS)
    n_indent: int = Field(default=0, ge=0)
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_k: int | None = Field(default=None, ge=0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    min_p: float | None = Field(default=None, ge=0.0, le=1.0)
    repeat_penalty: float | None = Field(default=None, gt=0.0, le=10.0)
    seed: int | None = None
    samplers: list[str] | None = None
    stream: Literal[False] = False
    cache_prompt: Literal[True] = True  # false: a 400 (the prompt cache is always used)
    # llama.vim sends it on every request; llama-server parses it and does nothing with it
    # (a TODO in its source), so an editor's first request with a large context is read
    # whole there. Accepted here for the same behaviour; cutting the prompt short would
    # answer such requests with nothing.
    t_max_prompt_ms: int | None = Field(default=None, ge=0)
    t_max_predict_ms: int | None = Field(default=None, ge=0)
    response_fields: list[str] | None = None
    id_slot: int | None = None  # accepted: sequences are chosen by their cached prefix

    def sampling(self) -> SamplingParams:
        unknown = sorted(set(self.samplers or ()) - SAMPLERS)
        if unknown:
            raise InvalidRequest(
                f"unknown sampler {unknown[0]!r}; known: {', '.join(sorted(SAMPLERS))}",
                param="samplers",
            )
        # n_predict 0 reads the prompt only (llama.vim warms the cache with it)
        limit = None if self.n_predict < 0 else max(self.n_predict, 1)
        listed = set(SAMPLERS if self.samplers is None else self.samplers)
        return SamplingParams(temperature=0.0).with_overrides(
            temperature=self.temperature,
            top_k=self.top_k if "top_k" in listed else 0,
            top_p=self.top_p if "top_p" in listed else 1.0,
            min_p=self.min_p if "min_p" in listed else 0.0,
            repeat_penalty=self.repeat_penalty,
            seed=self.seed,
            max_tokens=limit,
            stop=tuple(s for s in self.stop if s) or None,
        )


class TokenizeBody(wire.Wire):
    content: wire.Text
    add_special: bool = False
    parse_special: bool = True
    with_pieces: bool = False
    model: wire.Name | None = None


class DetokenizeBody(wire.Wire):
    tokens: list[wire.TokenId] = Field(max_length=1 << 20)
    model: wire.Name | None = None


def _ended_line(text: str, n_indent: int) -> int | None:
    """Where the answer should end under `n_indent`: at the start of a finished line that
    is indented less than the cursor's line (the block the completion belongs to is over)."""
    start = 0
    while (nl := text.find("\n", start)) >= 0:
        line_start = nl + 1
        end = text.find("\n", line_start)
        if end < 0:
            return None  # the next line is not finished yet
        line = text[line_start:end]
        if line.strip() and len(line) - len(line.lstrip(" \t")) < n_indent:
            return nl
        start = line_start
    return None


def flatten(body: dict[str, Any], fields: list[str]) -> dict[str, Any]:
    """The fields asked for, nested ones by path ("timings/predicted_n"), flattened; a
    path that names nothing is left out, as llama-server does."""
    out: dict[str, Any] = {}
    for path in fields:
        value: Any = body
        for part in path.split("/"):
            if not isinstance(value, dict) or part not in value:
                break
            value = value[part]
        else:
            out[path] = value
    return out


@router.post("/infill")
async def infill(body: InfillBody, request: Request) -> JSONResponse:
    t0 = time.perf_counter()
    spec = Infill(
        prefix=body.input_prefix,
        suffix=body.input_suffix,
        extra=tuple((c.filename, c.text) for c in body.input_extra),
        typed=body.prompt,
    )
    req = EngineRequest(body.sampling(), infill=spec, model=body.model, **who(request))
    stream, started = await start(request, req)
    watcher = asyncio.create_task(cancel_on_disconnect(stream, request))
    parts: list[str] = []
    final = None
    t_first = 0.0
    truncated = started.dropped_messages > 0  # extra chunks that did not fit
    try:
        while True:
            try:
                chunk = await stream.next(IDLE_WAKE_S)
            except StopAsyncIteration:
                break
            if chunk is None:
                continue
            parts.append(chunk.text)
            if chunk.finish_reason is not None:
                final = chunk
                continue
            t_first = t_first or time.perf_counter()
            text = "".join(parts)
            cut = _ended_line(text, body.n_indent) if body.n_indent else None
            late = body.t_max_predict_ms is not None and "\n" in text
            late = late and (time.perf_counter() - t_first) * 1000 > (body.t_max_predict_ms or 0)
            if cut is not None or late:
                parts = [text[:cut] if cut is not None else text]
                truncated = True
                stream.cancel()
    finally:
        watcher.cancel()
        stream.cancel()
    assert final is not None
    stats = final.stats
    content = "".join(parts) if body.n_predict != 0 else ""
    predicted = stats.generated_tokens if stats else 0
    prompt_n = (stats.prompt_tokens - stats.cached_tokens) if stats else 0
    prompt_ms = (stats.ttft_s * 1000) if stats else 0.0
    predicted_ms = (time.perf_counter() - t0) * 1000 - prompt_ms
    stop_type = {"length": "limit", "stop": "eos"}.get(str(final.finish_reason), "word")
    if final.stop_sequence is not None:
        stop_type = "word"
    out: dict[str, Any] = {
        "index": 0,
        "content": content,
        "tokens": [],
        "id_slot": body.id_slot if body.id_slot is not None else -1,
        "stop": True,
        "model": started.model,
        "tokens_predicted": predicted,
        "tokens_evaluated": stats.prompt_tokens if stats else 0,
        "tokens_cached": stats.cached_tokens if stats else 0,
        "truncated": truncated,
        "stop_type": "limit" if truncated else stop_type,
        "stopping_word": final.stop_sequence or "",
        "timings": {
            "prompt_n": prompt_n,
            "prompt_ms": prompt_ms,
            "prompt_per_token_ms": prompt_ms / prompt_n if prompt_n else 0.0,
            "prompt_per_second": prompt_n / prompt_ms * 1000 if prompt_ms else 0.0,
            "predicted_n": predicted,
            "predicted_ms": predicted_ms,
            "predicted_per_token_ms": predicted_ms / predicted if predicted else 0.0,
            "predicted_per_second": predicted / predicted_ms * 1000 if predicted_ms > 0 else 0.0,
        },
    }
    if body.response_fields:
        return JSONResponse(flatten(out, body.response_fields))
    return JSONResponse(out)


@router.post("/tokenize")
async def tokenize(body: TokenizeBody, request: Request) -> JSONResponse:
    engine: EngineClient = request.app.state.engine
    settings: Settings = request.app.state.settings

    def work(model: Any) -> dict[str, Any]:
        tokens = model.tokenize(body.content, special=body.parse_special)
        info = model.info
        if body.add_special and info.add_bos and info.bos_id is not None:
            tokens = [info.bos_id, *tokens]
        if not body.with_pieces:
            return {"tokens": tokens}
        pieces = []
        for tok in tokens:
            raw = model.piece(tok) or model.detokenize([tok]).encode()
            try:
                piece: str | list[int] = raw.decode("utf-8")
            except UnicodeDecodeError:
                piece = list(raw)  # part of a character: its bytes, as llama-server does
            pieces.append({"id": tok, "piece": piece})
        return {"tokens": pieces}

    out = await asyncio.to_thread(
        engine.with_model, body.model, work, allow_paths=settings.allow_model_paths
    )
    return JSONResponse(out)


@router.post("/detokenize")
async def detokenize(body: DetokenizeBody, request: Request) -> JSONResponse:
    engine: EngineClient = request.app.state.engine
    settings: Settings = request.app.state.settings

    def work(model: Any) -> dict[str, Any]:
        n_vocab = model.info.n_vocab
        bad = [t for t in body.tokens if n_vocab and t >= n_vocab]
        if bad:
            raise InvalidRequest(
                f"token {bad[0]} is not in the vocabulary (ids 0 to {n_vocab - 1})",
                param="tokens",
            )
        return {"content": model.detokenize(body.tokens)}

    out = await asyncio.to_thread(
        engine.with_model, body.model, work, allow_paths=settings.allow_model_paths
    )
    return JSONResponse(out)


@router.get("/props")
async def props(request: Request) -> JSONResponse:
    """What llama.vim and llama.vscode read: the context size, the model, its template."""
    engine: EngineClient = request.app.state.engine
    settings: Settings = request.app.state.settings

    def work(model: Any) -> dict[str, Any]:
        info = model.info
        defaults = SamplingParams()
        return {
            "default_generation_settings": {
                "n_ctx": info.n_ctx,
                "model": info.id,
                "params": {
                    "temperature": defaults.temperature,
                    "top_k": defaults.top_k,
                    "top_p": defaults.top_p,
                    "min_p": defaults.min_p,
                    "n_predict": -1,
                },
            },
            "total_slots": model.n_seq,
            "model_path": info.id,
            "chat_template": info.chat_template or "",
            "modalities": {"vision": False, "audio": False},
            "infill": info.fim is not None,
            "build_info": f"localllm {__version__}",
        }

    out = await asyncio.to_thread(
        engine.with_model, None, work, allow_paths=settings.allow_model_paths
    )
    return JSONResponse(out)
