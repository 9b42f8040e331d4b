"""Pieces every backend's generation loop shares: request checks, prompt batching
that keeps cache hits exact, chat rendering to tokens, and the final chunk.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from localllm.backends import chat_template
from localllm.backends.base import Chunk, FinishReason, GenerationStats, Message, SamplingParams
from localllm.errors import ContextOverflow, InvalidRequest

# Prompt batches start at multiples of ALIGN positions and the last prompt token is
# evaluated alone; reused prefixes are cut to a multiple of ALIGN. A token's KV then
# never depends on where a reused prefix ended, so a cache hit gives bit for bit the
# output of a cold run (batched and one-token evaluation round differently).
ALIGN = 64


def check_request(n_prompt: int, n_ctx: int, params: SamplingParams) -> None:
    """Raise before any compute when a request cannot run."""
    if n_prompt == 0:
        raise InvalidRequest("The prompt is empty (0 tokens).", param="prompt")
    if n_prompt >= n_ctx:
        raise ContextOverflow(n_prompt, n_ctx)
    if params.max_tokens is not None and params.max_tokens < 1:
        raise InvalidRequest(
            f"max_tokens must be at least 1, got {params.max_tokens}", param="max_tokens"
        )


def reusable_prefix(cached: Sequence[int], prompt: Sequence[int]) -> int:
    """How many cached tokens a prompt can keep: the common prefix, cut to ALIGN.

    The last prompt token is always evaluated (its logits pick the first answer token).
    """
    n, limit = 0, min(len(cached), len(prompt) - 1)
    while n < limit and cached[n] == prompt[n]:
        n += 1
    return n - n % ALIGN


def extends_canonical(canonical: int, start: int, lo: int, hi: int) -> int:
    """The new length of the exactly-reusable KV prefix after evaluating the batch
    [start+lo, start+hi): it grows only by whole aligned blocks that follow it."""
    if start + lo == canonical and canonical % ALIGN == 0 and hi - lo == ALIGN:
        return canonical + ALIGN
    return canonical


class KVLedger:
    """The tokens a backend's live KV cache holds, and how many lead it exactly: the
    `canonical` prefix, evaluated in whole aligned prompt blocks as a cold run evaluates
    them (only that part is ever reused). Each backend keeps one beside its native cache."""

    __slots__ = ("canonical", "tokens")

    def __init__(self) -> None:
        self.tokens: list[int] = []  # generation appends to this list in place
        self.canonical = 0

    def clear(self) -> None:
        self.tokens.clear()
        self.canonical = 0

    def prefix(self) -> list[int]:
        """The exactly reusable tokens."""
        return self.tokens[: self.canonical]

    def reusable(self, prompt: Sequence[int]) -> int:
        return reusable_prefix(self.prefix(), prompt)

    def evaluated(self, part: Sequence[int], start: int, lo: int, hi: int) -> None:
        """A prompt batch [start+lo, start+hi) went into the cache."""
        self.tokens.extend(part)
        self.canonical = extends_canonical(self.canonical, start, lo, hi)

    def cut(self, n: int) -> None:
        """The native cache now keeps only its first n positions."""
        del self.tokens[n:]
        self.canonical = min(self.canonical, n)

    def restored(self, tokens: Sequence[int]) -> None:
        """A saved state, all of it canonical, replaced the cache."""
        self.tokens[:] = tokens
        self.canonical = len(self.tokens)


def check_scoring(n_tokens: int, start: int, n_ctx: int) -> None:
    """Raise InvalidRequest unless `logprobs` can score tokens[start:] in one context."""
    if n_tokens > n_ctx:
        raise InvalidRequest(f"scoring needs {n_tokens} tokens in one context of {n_ctx}")
    if not 1 <= start < n_tokens:
        raise InvalidRequest(f"scoring starts at token {start}; it must be 1 to {n_tokens - 1}")


def pick_logprobs(logits: Any, targets: Sequence[int]) -> list[float]:
    """ln softmax(logits[j])[targets[j]] for each row j of a (rows x vocab) array."""
    import numpy as np

    x = np.asarray(logits, dtype=np.float64)
    top = x.max(axis=1)
    norm = top + np.log(np.exp(x - top[:, None]).sum(axis=1))
    picked = x[np.arange(len(targets)), np.asarray(targets)]
    return [float(v) for v in picked - norm]


def batch_bounds(start: int, n_tokens: int) -> list[int]:
    """Cut points for evaluating `n_tokens` prompt tokens that follow `start` cached ones."""
    if n_tokens <= 1:
        return [0, n_tokens]
    cuts = [i for i in range(1, n_tokens - 1) if (start + i) % ALIGN == 0]
    return [0, *cuts, n_tokens - 1, n_tokens]


def chat_tokens(
    template: str | None,
    messages: Sequence[Message],
    *,
    bos_text: str,
    eos_text: str,
    tokenize_special: Callable[[str], list[int]],
    add_bos: bool,
    bos_id: int | None,
) -> list[int]:
    """Render the chat template and tokenize it, with BOS exactly once when the model wants it."""
    text = chat_template.render(template, messages, bos_token=bos_text, eos_token=eos_text)
    tokens = tokenize_special(text)
    if add_bos and bos_id is not None and (not tokens or tokens[0] != bos_id):
        tokens = [bos_id, *tokens]
    return tokens


def final_chunk(
    tail: str,
    finish: FinishReason,
    n_prompt: int,
    cached: int,
    generated: int,
    t0: float,
    t_first: float,
    t_end: float,
    *,
    proposed: int = 0,
    accepted: int = 0,
) -> Chunk:
    """The chunk that ends every stream: the last text, the finish reason and the stats."""
    tps = (generated - 1) / (t_end - t_first) if generated > 1 and t_end > t_first else 0.0
    stats = GenerationStats(
        prompt_tokens=n_prompt,
        cached_tokens=cached,
        generated_tokens=generated,
        ttft_s=(t_first - t0) if generated else 0.0,
        decode_tps=tps,
        draft_accepted=accepted,
        draft_proposed=proposed,
    )
    return Chunk(tail, (), finish_reason=finish, stats=stats)
