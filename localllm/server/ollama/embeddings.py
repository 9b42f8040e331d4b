"""Ollama's embeddings: `/api/embed` (many inputs) and the older `/api/embeddings` (one)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from pydantic import Field, field_validator

from localllm.server import wire
from localllm.server.ollama.schemas import model_name
from localllm.server.serving import embed

router = APIRouter()


class OllamaEmbedBody(wire.Wire):
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


class OllamaEmbeddingsBody(wire.Wire):
    """The older /api/embeddings: one prompt, one vector."""

    model: wire.Name
    prompt: wire.Text
    keep_alive: wire.KeepAlive = None


@router.post("/api/embed")
async def ollama_embed(body: OllamaEmbedBody, request: Request) -> JSONResponse:
    inputs: list[str | list[int]] = [body.input] if isinstance(body.input, str) else []
    if isinstance(body.input, list):
        inputs = list(body.input)
    if not inputs or inputs == [""]:
        return JSONResponse({"model": model_name(body.model), "embeddings": []})
    vectors, tokens, name = await embed(
        request, model_name(body.model), inputs, None, body.keep_alive
    )
    return JSONResponse({"model": name, "embeddings": vectors, "prompt_eval_count": tokens})


@router.post("/api/embeddings")
async def ollama_embeddings(body: OllamaEmbeddingsBody, request: Request) -> JSONResponse:
    vectors, _, _ = await embed(
        request, model_name(body.model), [body.prompt], None, body.keep_alive
    )
    return JSONResponse({"embedding": vectors[0]})
