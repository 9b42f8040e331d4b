"""OpenAI's `/v1/embeddings`: the inputs embedded in pieces between other requests' steps
on the model's embedding context (server/serving.py: embed); vectors come back
L2-normalised."""

from __future__ import annotations

import base64
import struct
from typing import Any, Literal

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from pydantic import field_validator

from localllm.server import wire
from localllm.server.serving import embed

router = APIRouter()

MAX_INPUTS = 2048  # inputs in one request (OpenAI's limit)
Pooling = Literal["mean", "cls", "last"]


class EmbeddingsBody(wire.Wire):
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


def _encoded(vector: list[float], fmt: str) -> list[float] | str:
    if fmt == "float":
        return vector
    return base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode()


@router.post("/v1/embeddings")
async def embeddings(body: EmbeddingsBody, request: Request) -> JSONResponse:
    vectors, tokens, name = await embed(request, body.model, body.inputs(), body.pooling)
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
