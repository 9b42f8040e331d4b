"""Embeddings on the llama.cpp backend: a second context on the loaded weights that
returns pooled vectors (one context per pooling kind, made on first use), inputs batched
as many to a call as fit."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from localllm.backends.base import ModelInfo
from localllm.backends.llama_api import LlamaApi
from localllm.errors import InvalidRequest, LocalLLMError

EMBED_CTX = 4096  # tokens an embedding context holds (at most the trained context)
EMBED_SEQS = 8  # inputs embedded in one call
_POOLING = {"mean": 1, "cls": 2, "last": 3, "rank": 4}  # llama.h's LLAMA_POOLING_TYPE_*


class Embedder:
    """The embedding contexts of one loaded model."""

    def __init__(self, ll: LlamaApi, model: Any, threads: int) -> None:
        self._ll = ll
        self._model = model
        self._threads = threads
        self._ctxs: dict[str | None, tuple[Any, int]] = {}  # pooling -> context

    def _context(self, pooling: str | None, n_ctx_train: int) -> tuple[Any, int]:
        """A second context on the same weights that returns pooled embeddings (one per
        pooling kind, made on first use), and its size in tokens."""
        ll = self._ll
        cached = self._ctxs.get(pooling)
        if cached is not None:
            return cached
        n_ctx = min(n_ctx_train or EMBED_CTX, EMBED_CTX)
        params = ll.llama_context_default_params()
        params.n_ctx = n_ctx
        params.n_batch = params.n_ubatch = n_ctx  # a non-causal model reads an input whole
        params.n_seq_max = EMBED_SEQS
        params.kv_unified = True
        params.embeddings = True
        params.n_threads = params.n_threads_batch = self._threads
        params.no_perf = True
        params.pooling_type = _POOLING.get(pooling or "", ll.LLAMA_POOLING_TYPE_UNSPECIFIED)
        ctx = ll.llama_init_from_model(self._model, params)
        if ctx and ll.llama_pooling_type(ctx) == ll.LLAMA_POOLING_TYPE_NONE:
            ll.llama_free(ctx)  # a chat model has no pooling of its own: mean
            params.pooling_type = ll.LLAMA_POOLING_TYPE_MEAN
            ctx = ll.llama_init_from_model(self._model, params)
        if not ctx:
            raise LocalLLMError(f"could not create an embedding context of {n_ctx} tokens")
        self._ctxs[pooling] = (ctx, n_ctx)
        return ctx, n_ctx

    def embed(
        self, rows: list[list[int]], info: ModelInfo, pooling: str | None, first: int = 0
    ) -> tuple[list[list[float]], int]:
        """L2-normalised vectors of the token rows, and how many tokens they were (an input
        is named by its index in the request: rows[0] is input `first`)."""
        out = []
        for vec in self._pooled(rows, info, pooling, first, "input"):
            norm = float(np.linalg.norm(vec))
            out.append((vec / norm if norm > 0 else vec).tolist())
        return out, sum(len(r) for r in rows)

    def rank(self, rows: list[list[int]], info: ModelInfo, first: int = 0) -> list[float]:
        """The classifier head's first output for each row (a query and a document laid
        out by rank_row): the reranker's relevance score."""
        return [float(v[0]) for v in self._pooled(rows, info, "rank", first, "document")]

    def rank_limit(self, info: ModelInfo) -> int:
        """Tokens one query-document pair may take."""
        return self._context("rank", info.n_ctx_train)[1]

    def _pooled(
        self, rows: list[list[int]], info: ModelInfo, pooling: str | None, first: int, what: str
    ) -> list[Any]:
        """What the context pools for each row: n_embd floats, or the classifier's outputs
        for pooling "rank" (rows checked first, each named `what` and its index)."""
        ll = self._ll
        ctx, n_ctx = self._context(pooling, info.n_ctx_train)
        n_vocab = info.n_vocab
        for i, row in enumerate(rows, start=first):
            if not row:
                raise InvalidRequest(f"{what} {i} is empty", param=what)
            bad = next((t for t in row if not 0 <= t < n_vocab), None)
            if bad is not None:
                raise InvalidRequest(
                    f"{what} {i} has token {bad}, which is not in the vocabulary "
                    f"(ids 0 to {n_vocab - 1})",
                    param=what,
                )
            if len(row) > n_ctx:
                task = "reranking takes" if pooling == "rank" else "embeddings take"
                fix = " (send `truncate: true` to cut it to fit)" if pooling == "rank" else ""
                raise InvalidRequest(
                    f"{what} {i} is {len(row)} tokens; {task} at most {n_ctx}{fix}",
                    param=what,
                    code="context_length_exceeded",
                )
        width = (
            int(ll.llama_model_n_cls_out(self._model))
            if pooling == "rank"
            else int(ll.llama_model_n_embd(self._model))
        )
        mem = ll.llama_get_memory(ctx)
        batch = ll.llama_batch_init(n_ctx, 0, EMBED_SEQS)
        out: list[Any] = []
        try:
            i = 0
            while i < len(rows):  # as many inputs per call as fit in the batch
                group: list[list[int]] = []
                used = 0
                while i < len(rows) and len(group) < EMBED_SEQS and used + len(rows[i]) <= n_ctx:
                    group.append(rows[i])
                    used += len(rows[i])
                    i += 1
                k = 0
                for seq, row in enumerate(group):
                    for pos, tok in enumerate(row):
                        batch.token[k], batch.pos[k] = tok, pos
                        batch.n_seq_id[k], batch.seq_id[k][0] = 1, seq
                        batch.logits[k] = True
                        k += 1
                batch.n_tokens = k
                ll.llama_memory_clear(mem, True)
                rc = ll.llama_decode(ctx, batch)
                if rc != 0:
                    raise LocalLLMError(f"llama_decode failed with code {rc} for {what}s")
                for seq in range(len(group)):
                    ptr = ll.llama_get_embeddings_seq(ctx, seq)
                    out.append(np.ctypeslib.as_array(ptr, shape=(width,)).astype(np.float64))
        finally:
            ll.llama_batch_free(batch)
            ll.llama_memory_clear(mem, True)
        return out

    def close(self) -> None:
        for ctx, _ in self._ctxs.values():
            self._ll.llama_free(ctx)
        self._ctxs = {}


@dataclass(frozen=True, slots=True)
class RankLayout:
    """How a reranker reads a query and a document: its GGUF `rerank` template (with
    {query} and {document}), or llama-server's default: [BOS] query [EOS] [SEP] doc [EOS],
    each special token where the vocabulary adds it."""

    template: str | None
    head: tuple[int, ...]  # before the query
    middle: tuple[int, ...]  # between query and document
    tail: tuple[int, ...]  # after the document


def rank_row(
    tokenize: Callable[[str, bool], list[int]],
    layout: RankLayout,
    query: str,
    doc: str,
    *,
    limit: int,
    cut: str | None,
) -> list[int]:
    """One query-document pair's tokens. Longer than `limit`: the document's tokens cut
    from its end (cut "right") or its start ("left") to fit, or kept whole (cut None: the
    pair is refused by its length where it is read)."""
    if layout.template is not None:
        whole = tokenize(layout.template.replace("{query}", query).replace("{document}", doc), True)
        if cut is None or len(whole) <= limit:
            return whole
        before, _, after = layout.template.partition("{document}")
        head = tokenize(before.replace("{query}", query), True)
        tail = tokenize(after.replace("{query}", query), True)
    else:
        head = [*layout.head, *tokenize(query, False), *layout.middle]
        tail = list(layout.tail)
    body = tokenize(doc, False)
    room = limit - len(head) - len(tail)
    if cut is not None and len(body) > room > 0:
        body = body[:room] if cut == "right" else body[len(body) - room :]
    return head + body + tail


def rank_layout(ll: LlamaApi, model: Any, info: ModelInfo) -> RankLayout:
    """The layout a loaded reranker reads its pairs in."""
    vocab = ll.llama_model_get_vocab(model)
    template = ll.llama_model_chat_template(model, b"rerank")
    eos = int(ll.llama_vocab_eos(vocab))
    if eos < 0:
        eos = int(ll.llama_vocab_sep(vocab))
    with_eos = (eos,) if ll.llama_vocab_get_add_eos(vocab) and eos >= 0 else ()
    sep = int(ll.llama_vocab_sep(vocab))
    with_sep = (sep,) if ll.llama_vocab_get_add_sep(vocab) and sep >= 0 else ()
    bos = info.bos_id
    return RankLayout(
        template=template.decode("utf-8", "replace") if template else None,
        head=(bos,) if info.add_bos and bos is not None else (),
        middle=with_eos + with_sep,
        tail=with_eos,
    )
