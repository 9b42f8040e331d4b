"""`/v1/rerank` (and `/rerank`, `/v1/reranking`, `/reranking`, as llama-server names
them): a query's relevance to each of several documents, from a reranker's classifier
head (llama.cpp rank pooling), in pieces between other requests' steps
(server/serving.py: rerank).

Two request shapes, as llama-server takes them:
- Jina/Cohere (`documents`; llama-server, vLLM, litellm, Open WebUI): `results` of
  `index` and `relevance_score`, best first, `top_n` of them, each with its `document`
  when `return_documents` is true. The score is the head's raw output, as llama-server
  gives it (a logit for the BGE and Jina rerankers: higher is more relevant).
- Hugging Face TEI (`texts`; Continue's `huggingface-tei` reranker): a bare list of
  `index` and `score`, the score through a sigmoid unless `raw_scores`, `text` when
  `return_text`; `truncate` cuts a document that does not fit from the side
  `truncation_direction` names (without it, such a document is a 400).

A request that names no model is ranked by the default model if it is a reranker, else
by the one reranker in the store (`_unnamed`).
"""

from __future__ import annotations

import asyncio
import math
from typing import Literal

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from pydantic import Field, model_validator

from localllm.backends.base import ModelRef
from localllm.engine.client import EngineClient
from localllm.errors import InvalidRequest
from localllm.server import wire
from localllm.server.model_facts import damage_of, meta_of
from localllm.server.serving import engine_of, rerank

router = APIRouter()

MAX_DOCUMENTS = 1000  # documents in one request (Cohere's bound)


class TextDocument(wire.Wire):
    text: wire.Text


class RerankBody(wire.Wire):
    model: wire.Name | None = None
    query: wire.Text
    documents: list[wire.Text | TextDocument] | None = Field(default=None, max_length=MAX_DOCUMENTS)
    texts: list[wire.Text] | None = Field(default=None, max_length=MAX_DOCUMENTS)  # TEI
    top_n: int | None = Field(default=None, ge=1)
    return_documents: bool = False
    return_text: bool = False  # TEI
    raw_scores: bool = False  # TEI
    truncate: bool | None = None  # TEI
    truncation_direction: Literal["Right", "Left", "right", "left"] = "Right"  # TEI

    @model_validator(mode="after")
    def _one_list(self) -> RerankBody:
        if (self.documents is None) == (self.texts is None):
            raise ValueError("give the documents to rank as `documents` (or TEI's `texts`)")
        if not self.docs():
            raise ValueError("`documents` is empty: give at least one document to rank")
        return self

    def docs(self) -> list[str]:
        if self.texts is not None:
            return list(self.texts)
        return [d if isinstance(d, str) else d.text for d in self.documents or ()]


@router.post("/v1/rerank")
@router.post("/rerank")
@router.post("/v1/reranking")
@router.post("/reranking")
async def rerank_route(body: RerankBody, request: Request) -> JSONResponse:
    docs = body.docs()
    cut = body.truncation_direction.lower() if body.truncate else None
    model = body.model or await asyncio.to_thread(_unnamed, engine_of(request))
    scores, tokens, name = await rerank(request, model, body.query, docs, cut)
    order = sorted(range(len(docs)), key=lambda i: -scores[i])[: body.top_n or len(docs)]
    if body.texts is not None:  # TEI: a bare list
        rows: list[dict[str, object]] = []
        for i in order:
            score = scores[i] if body.raw_scores else _sigmoid(scores[i])
            rows.append(
                {"index": i, "score": score} | ({"text": docs[i]} if body.return_text else {})
            )
        return JSONResponse(rows)
    results = [
        {"index": i, "relevance_score": scores[i]}
        | ({"document": {"text": docs[i]}} if body.return_documents else {})
        for i in order
    ]
    return JSONResponse(
        {
            "id": wire.new_id("rerank"),
            "object": "list",
            "model": name,
            "results": results,
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
        }
    )


def _unnamed(engine: EngineClient) -> str | None:
    """The model a request that names none is ranked by (Continue's TEI body names none):
    the default model when it is a reranker, else the one reranker in the store; with
    several, the client must choose."""
    default = engine.status().model_ref
    if default is not None and _ranks(default):
        return None
    names = sorted({ref.name for ref in engine.models() if _ranks(ref)})
    if len(names) > 1:
        raise InvalidRequest(
            f"name the reranker in `model`: this server has {len(names)} ({', '.join(names)})",
            param="model",
        )
    return names[0] if names else None  # none: the default model says it cannot rank


def _ranks(ref: ModelRef) -> bool:
    return damage_of(ref) is None and meta_of(ref).reranker


def _sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x)) if x >= 0 else math.exp(x) / (1.0 + math.exp(x))
