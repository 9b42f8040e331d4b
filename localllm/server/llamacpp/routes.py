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
from dataclasses import replace
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
from localllm.server import samplers, tolerance, wire
from localllm.server.samplers import deadline
from localllm.server.serving import IDLE_WAKE_S, cancel_on_disconnect, start, who

router = APIRouter()
MAX_COMPLETIONS = 8  # n_cmpl's bound (llama-server's is its slot count)
ALTERNATIVE_TEMPERATURE = 0.8  # n_cmpl's other completions, when none was asked


class ExtraChunk(wire.Wire):
    IGNORED = tolerance.names(tolerance.INFILL_CHUNK)

    text: wire.Text
    filename: wire.Text = ""


class InfillBody(wire.Wire):
    IGNORED = tolerance.names(tolerance.INFILL)

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
    cache_prompt: bool = True  # the answer is the same either way; the cache is always kept
    t_max_predict_ms: int | None = Field(default=None, ge=0)
    response_fields: list[str] | None = None
    # llama-server's number of completions for one prompt (llama.vscode asks for 3):
    # answered as a list of that many results (see _alternative)
    n_cmpl: int = Field(default=1, ge=1, le=MAX_COMPLETIONS)
    lora: list[wire.LoraScale] | None = Field(default=None, max_length=64)

    def sampling(self) -> SamplingParams:
        # n_predict 0 reads the prompt only (llama.vim warms the cache with it)
        limit = None if self.n_predict < 0 else max(self.n_predict, 1)
        filters = samplers.chosen(self.samplers, self.top_k, self.top_p, self.min_p)
        return SamplingParams(temperature=0.0).with_overrides(
            temperature=self.temperature,
            top_k=filters.top_k,
            top_p=filters.top_p,
            min_p=filters.min_p,
            repeat_penalty=self.repeat_penalty,
            seed=self.seed,
            max_tokens=limit,
            stop=tuple(s for s in self.stop if s) or None,
            newline_deadline_s=deadline(self.t_max_predict_ms),
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


@router.post("/infill", response_model=None)
async def infill(body: InfillBody, request: Request) -> JSONResponse:
    spec = Infill(
        prefix=body.input_prefix,
        suffix=body.input_suffix,
        extra=tuple((c.filename, c.text) for c in body.input_extra),
        typed=body.prompt,
    )
    params = body.sampling()
    if body.n_cmpl == 1:
        return JSONResponse(_shaped(await _fill(body, request, spec, params), body))
    results = await asyncio.gather(
        *(_fill(body, request, spec, _alternative(params, body, i)) for i in range(body.n_cmpl))
    )
    return JSONResponse([_shaped(r | {"index": i}, body) for i, r in enumerate(results)])


def _alternative(params: SamplingParams, body: InfillBody, index: int) -> SamplingParams:
    """The sampling of the `index`th of n_cmpl completions. The first is the request's
    own; the others are alternatives, so with greedy decoding by default (no temperature
    asked) they sample at ALTERNATIVE_TEMPERATURE, each with its own seed, where
    llama-server samples every one."""
    if index == 0:
        return params
    seed = None if params.seed is None else params.seed + index
    if body.temperature is None:
        return replace(params, temperature=ALTERNATIVE_TEMPERATURE, seed=seed)
    return replace(params, seed=seed)


def _shaped(out: dict[str, Any], body: InfillBody) -> dict[str, Any]:
    return flatten(out, body.response_fields) if body.response_fields else out


async def _fill(
    body: InfillBody, request: Request, spec: Infill, params: SamplingParams
) -> dict[str, Any]:
    """One completion of the fill, in llama-server's shape. The answer ends early, as
    llama-server's does, at a line indented less than `n_indent` and, once
    `t_max_predict_ms` has passed since the first token, at the next newline (the
    engine's `newline_deadline_s`, reported as stop type "limit")."""
    t0 = time.perf_counter()
    req = EngineRequest(
        params, infill=spec, model=body.model, lora=wire.lora_scales(body.lora), **who(request)
    )
    stream, started = await start(request, req)
    watcher = asyncio.create_task(cancel_on_disconnect(stream, request))
    text = ""
    final = None
    cut_short = False
    truncated = started.dropped_messages > 0  # extra chunks that did not fit
    try:
        while True:
            try:
                chunk = await stream.next(IDLE_WAKE_S)
            except StopAsyncIteration:
                break
            if chunk is None:
                continue
            if chunk.finish_reason is not None:
                final = chunk
                if not cut_short:
                    text += chunk.text
                continue
            if cut_short:
                continue  # already queued when the answer was cut: not part of it
            text += chunk.text
            cut = _ended_line(text, body.n_indent) if body.n_indent else None
            if cut is not None:
                text = text[:cut]
                cut_short = True
                stream.cancel()
    finally:
        watcher.cancel()
        stream.cancel()
    assert final is not None
    stats = final.stats
    content = text if body.n_predict != 0 else ""
    predicted = stats.generated_tokens if stats else 0
    prompt_n = (stats.prompt_tokens - stats.cached_tokens) if stats else 0
    prompt_ms = (stats.ttft_s * 1000) if stats else 0.0
    predicted_ms = (time.perf_counter() - t0) * 1000 - prompt_ms
    stop_type = {"length": "limit", "stop": "eos"}.get(str(final.finish_reason), "word")
    if final.stop_sequence is not None:
        stop_type = "word"
    return {
        "index": 0,
        "content": content,
        "tokens": [],
        "id_slot": -1,
        "stop": True,
        "model": started.model,
        "tokens_predicted": predicted,
        "tokens_evaluated": stats.prompt_tokens if stats else 0,
        "tokens_cached": stats.cached_tokens if stats else 0,
        "truncated": truncated,
        "stop_type": "limit" if cut_short else stop_type,
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
        engine.with_model, body.model, work, allow_paths=settings.allow_model_paths, beside=True
    )
    return await asyncio.to_thread(JSONResponse, out)  # 7 MB of text: 2 M ids to write


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
        engine.with_model, body.model, work, allow_paths=settings.allow_model_paths, beside=True
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
