"""Embeddings on the llama.cpp backend: a second context on the loaded weights that
returns pooled vectors (one context per pooling kind, made on first use), inputs batched
as many to a call as fit."""

from __future__ import annotations

from typing import Any

import numpy as np

from localllm.backends.base import ModelInfo
from localllm.backends.llama_api import LlamaApi
from localllm.errors import InvalidRequest, LocalLLMError

EMBED_CTX = 4096  # tokens an embedding context holds (at most the trained context)
EMBED_SEQS = 8  # inputs embedded in one call
_POOLING = {"mean": 1, "cls": 2, "last": 3}  # llama.h's LLAMA_POOLING_TYPE_*


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
        ll = self._ll
        ctx, n_ctx = self._context(pooling, info.n_ctx_train)
        n_vocab = info.n_vocab
        for i, row in enumerate(rows, start=first):
            if not row:
                raise InvalidRequest(f"input {i} is empty", param="input")
            bad = next((t for t in row if not 0 <= t < n_vocab), None)
            if bad is not None:
                raise InvalidRequest(
                    f"input {i} has token {bad}, which is not in the vocabulary "
                    f"(ids 0 to {n_vocab - 1})",
                    param="input",
                )
            if len(row) > n_ctx:
                raise InvalidRequest(
                    f"input {i} is {len(row)} tokens; embeddings take at most {n_ctx}",
                    param="input",
                    code="context_length_exceeded",
                )
        n_embd = int(ll.llama_model_n_embd(self._model))
        mem = ll.llama_get_memory(ctx)
        batch = ll.llama_batch_init(n_ctx, 0, EMBED_SEQS)
        out: list[list[float]] = []
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
                    raise LocalLLMError(f"llama_decode failed with code {rc} for embeddings")
                for seq in range(len(group)):
                    ptr = ll.llama_get_embeddings_seq(ctx, seq)
                    vec = np.ctypeslib.as_array(ptr, shape=(n_embd,)).astype(np.float64)
                    norm = float(np.linalg.norm(vec))
                    out.append((vec / norm if norm > 0 else vec).tolist())
        finally:
            ll.llama_batch_free(batch)
            ll.llama_memory_clear(mem, True)
        return out, sum(len(r) for r in rows)

    def close(self) -> None:
        for ctx, _ in self._ctxs.values():
            self._ll.llama_free(ctx)
        self._ctxs = {}
