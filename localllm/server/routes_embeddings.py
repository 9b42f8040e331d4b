"""Embeddings: OpenAI's `/v1/embeddings` and Ollama's `/api/embed` and `/api/embeddings`.

Every input of a request is embedded in one batched call on the model's embedding
context (backends: `LoadedModel.embed`); vectors come back L2-normalised.
"""

from __future__ import annotations

import asyncio
import base64
import struct
from typing import Any, Literal

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from pydantic import Field, field_validator

from localllm.config import Settings
from localllm.engine.client import EngineClient
from localllm.server import protocol as wire
from localllm.server.routes_ollama import model_name

router = APIRouter()

MAX_INPUTS = 2048  # inputs in one request (OpenAI's limit)
Pooling = Literal["mean", "cls", "last"]


class EmbeddingsBody(wire._Wire):
    model: wire.Name | None = None
    input: wire.Text | list[wire.Text] | list[wire.TokenId] | list[list[wire.TokenId]]
    encoding_format: Literal["float", "base64"] = "float"
    user: wire.Text | None = None  # an end user's id, for the caller's own records: not used
    pooling: Pooling | None = None  # extension: override the model's pooling

    @field_validator("input")
    @classmethod
    def _bounded(cls, v: Any) -> Any:
        if isinstance(v, list):
            if not v:
                raise ValueError("input is an empty list")
            if len(v) > MAX_INPUTS:
                raise ValueError(f"at most {MAX_INPUTS} inputs, got {len(v)}")
        return v

    def inputs(self) -> list[str | list[int]]:
        value = self.input
        if isinstance(value, str):
            return [value]
        if value and isinstance(value[0], int):
            return [list(value)]
        return list(value)  # type: ignore[arg-type]


class OllamaEmbedBody(wire._Wire):
    model: wire.Name
    input: wire.Text | list[wire.Text] = Field(default="")
    truncate: bool | None = None
    keep_alive: wire.KeepAlive = None
    options: dict[str, Any] | None = None
    dimensions: int | None = None

    @field_validator("truncate")
    @classmethod
    def _no_truncation(cls, v: bool | None) -> bool | None:
        if v:
            raise ValueError(
                "truncate=true is not supported: an input longer than the context is refused "
                "with the numbers, never cut"
            )
        return v

    @field_validator("options", "dimensions")
    @classmethod
    def _unused(cls, v: Any) -> Any:
        if v:
            raise ValueError("not supported for embeddings")
        return v


class OllamaEmbeddingsBody(wire._Wire):
    """The older /api/embeddings: one prompt, one vector."""

    model: wire.Name
    prompt: wire.Text
    keep_alive: wire.KeepAlive = None


async def _embed(
    request: Request,
    model: str | None,
    inputs: list[str | list[int]],
    pooling: str | None,
    keep_alive: float | None = None,
) -> tuple[list[list[float]], int, str]:
    engine: EngineClient = request.app.state.engine
    settings: Settings = request.app.state.settings

    def work(loaded: Any) -> tuple[list[list[float]], int, str]:
        vectors, tokens = loaded.embed(inputs, pooling=pooling)
        return vectors, tokens, loaded.info.id

    result: tuple[list[list[float]], int, str] = await asyncio.to_thread(
        engine.with_model,
        model,
        work,
        allow_paths=settings.allow_model_paths,
        keep_alive=keep_alive,
    )
    return result


def _encoded(vector: list[float], fmt: str) -> list[float] | str:
    if fmt == "float":
        return vector
    return base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode()


@router.post("/v1/embeddings")
async def embeddings(body: EmbeddingsBody, request: Request) -> JSONResponse:
    vectors, tokens, name = await _embed(request, body.model, body.inputs(), body.pooling)
    return JSONResponse(
        {
            "object": "list",
            "data": [
                {"object": "embedding", "index": i, "embedding": _encoded(v, body.encoding_format)}
                for i, v in enumerate(vectors)
            ],
            "model": name,
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
        }
    )


@router.post("/api/embed")
async def ollama_embed(body: OllamaEmbedBody, request: Request) -> JSONResponse:
    inputs: list[str | list[int]] = [body.input] if isinstance(body.input, str) else []
    if isinstance(body.input, list):
        inputs = list(body.input)
    if not inputs or inputs == [""]:
        return JSONResponse({"model": model_name(body.model), "embeddings": []})
    vectors, tokens, name = await _embed(
        request, model_name(body.model), inputs, None, body.keep_alive
    )
    return JSONResponse({"model": name, "embeddings": vectors, "prompt_eval_count": tokens})


@router.post("/api/embeddings")
async def ollama_embeddings(body: OllamaEmbeddingsBody, request: Request) -> JSONResponse:
    vectors, _, _ = await _embed(
        request, model_name(body.model), [body.prompt], None, body.keep_alive
    )
    return JSONResponse({"embedding": vectors[0]})
