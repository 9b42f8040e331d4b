"""The llama.cpp model's second job: serving as a draft model and scoring text.

A `LlamaCppModel` decodes for the engine's scheduler through `step`. Apart from that it
can propose greedy drafts for another model's speculative decoding (`draft_greedy`, on
sequence 0), say once whether a batched step gives the same logits as tokens read one
at a time (`exact_batches`, which speculation needs to keep its output unchanged), and
give the log probabilities of a text (`logprobs`, for `localllm eval`). These read the
model's context as the one-sequence path does, so they live here, mixed into the model.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from localllm.backends.common import (
    KVLedger,
    batch_bounds,
    check_scoring,
    pick_logprobs,
    reusable_prefix,
)
from localllm.errors import LocalLLMError

if TYPE_CHECKING:
    from localllm.backends.base import Adapter, ModelInfo, Scales
    from localllm.backends.llama_api import LlamaApi

log = logging.getLogger(__name__)

SCORING_BATCH = 512  # tokens per llama_decode while scoring


class DraftAndScoring:
    """Methods of `LlamaCppModel` that use sequence 0 outside the scheduler's steps."""

    if TYPE_CHECKING:  # what the model itself provides
        _ll: LlamaApi
        _ctx: Any
        _kv: KVLedger
        _one: Any
        _exact: bool | None
        info: ModelInfo
        adapters: list[Adapter]

        def tokenize(self, text: str, *, special: bool = False) -> list[int]: ...
        def _reset_kv(self, seq: int = 0) -> None: ...
        def _clear_all(self) -> None: ...
        def _truncate(self, n: int, seq: int = 0) -> bool: ...
        def use_adapters(self, scales: Scales) -> None: ...

    def _decode(self, tokens: Sequence[int], should_stop: Callable[[], bool]) -> bool:
        """Evaluate tokens after the cached ones (see common.ALIGN); False when cancelled."""
        ll = self._ll
        start = len(self._kv.tokens)
        for lo, hi in itertools.pairwise(batch_bounds(start, len(tokens))):
            if lo and should_stop():
                return False
            part = tokens[lo:hi]
            arr = (ll.llama_token * len(part))(*part)
            rc = ll.llama_decode(self._ctx, ll.llama_batch_get_one(arr, len(part)))
            if rc != 0:
                self._reset_kv()
                raise LocalLLMError(f"llama_decode failed with code {rc} at prompt token {lo}")
            self._kv.evaluated(part, start, lo, hi)
        return True

    def _decode_one(self, tok: int) -> None:
        ll, one = self._ll, self._one
        one[0] = tok
        rc = ll.llama_decode(self._ctx, ll.llama_batch_get_one(one, 1))
        if rc != 0:
            self._reset_kv()
            raise LocalLLMError(f"llama_decode failed with code {rc} while generating")
        self._kv.tokens.append(tok)

    def exact_batches(self) -> bool:
        if self._exact is None:
            self._exact = self._probe_batches()
            log.info("%s: batched logits exact: %s", self.info.id, self._exact)
        return self._exact

    def _probe_batches(self) -> bool:
        """Evaluate two tokens after the cache, alone and as a batch; compare the logits."""
        ll, base = self._ll, len(self._kv.tokens)
        pair = [*self.tokenize("Hello world"), 0, 0][:2]
        if base + 2 > self.info.n_ctx:
            return False
        n_vocab = self.info.n_vocab
        self._decode_one(pair[0])
        alone = np.ctypeslib.as_array(ll.llama_get_logits_ith(self._ctx, -1), (n_vocab,)).copy()
        self._truncate(base)
        batch = ll.llama_batch_init(2, 0, 1)
        try:
            for i, t in enumerate(pair):
                batch.token[i], batch.pos[i] = t, base + i
                batch.n_seq_id[i], batch.seq_id[i][0], batch.logits[i] = 1, 0, True
            batch.n_tokens = 2
            rc = ll.llama_decode(self._ctx, batch)
        finally:
            ll.llama_batch_free(batch)
        self._kv.tokens.extend(pair)
        if rc != 0:
            self._truncate(base)
            return False
        together = np.ctypeslib.as_array(ll.llama_get_logits_ith(self._ctx, 0), (n_vocab,))
        exact = bool(np.array_equal(alone, together))
        self._truncate(base)
        return exact

    def draft_greedy(self, context: Sequence[int], n: int) -> list[int]:
        """Greedy tokens after `context`, reusing the cached prefix (this model as a draft)."""
        ll = self._ll
        # the last context token is evaluated again, for its logits
        self._truncate(reusable_prefix(self._kv.tokens, context[:-1]))
        if not self._decode(context[len(self._kv.tokens) :], lambda: False):
            return []
        out: list[int] = []
        room = self.info.n_ctx - len(self._kv.tokens)
        n_vocab = self.info.n_vocab
        for _ in range(min(n, room)):
            logits = ll.llama_get_logits_ith(self._ctx, -1)
            best = int(np.argmax(np.ctypeslib.as_array(logits, (n_vocab,))))
            out.append(best)
            if len(out) < n:
                self._decode_one(best)
        return out

    def logprobs(self, tokens: Sequence[int], *, start: int = 1) -> list[float]:
        """The log probability of each of tokens[start:] after those before it (from an
        empty cache, which is left empty)."""
        from localllm.backends.base import global_scales

        ll = self._ll
        check_scoring(len(tokens), start, self.info.n_ctx)
        self._clear_all()
        self.use_adapters(global_scales(self.adapters))
        n_batch = min(self.info.n_ctx, SCORING_BATCH)
        n_vocab = self.info.n_vocab
        batch = ll.llama_batch_init(n_batch, 0, 1)
        out: list[float] = []
        try:
            for lo in range(0, len(tokens) - 1, n_batch):
                part = tokens[lo : min(lo + n_batch, len(tokens) - 1)]
                wanted = 0
                for i, tok in enumerate(part):
                    pos = lo + i
                    batch.token[i], batch.pos[i] = tok, pos
                    batch.n_seq_id[i], batch.seq_id[i][0] = 1, 0
                    batch.logits[i] = pos >= start - 1  # the logits that predict tokens[start:]
                    wanted += pos >= start - 1
                batch.n_tokens = len(part)
                rc = ll.llama_decode(self._ctx, batch)
                if rc != 0:
                    raise LocalLLMError(f"llama_decode failed with code {rc} at token {lo}")
                if wanted:
                    logits = np.ctypeslib.as_array(
                        ll.llama_get_logits(self._ctx), (wanted, n_vocab)
                    )
                    first = max(lo + 1, start)
                    out.extend(pick_logprobs(logits, tokens[first : lo + len(part) + 1]))
        finally:
            ll.llama_batch_free(batch)
            self._clear_all()
        return out
