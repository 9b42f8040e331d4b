"""Pieces every backend's generation loop shares: request checks, prompt batching
that keeps cache hits exact, chat rendering to tokens, and the final chunk.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from localllm.backends import chat_template
from localllm.backends.base import (
    Chunk,
    FinishReason,
    GenerationStats,
    KVSnapshot,
    Media,
    Message,
    SamplingParams,
    TokenLogprob,
)
from localllm.backends.media import lost_media
from localllm.errors import ContextOverflow, InvalidRequest

# Prompt batches start at multiples of ALIGN positions and the last prompt token is
# evaluated alone; reused prefixes are cut to a multiple of ALIGN. A token's KV then
# never depends on where a reused prefix ended, so a cache hit gives bit for bit the
# output of a cold run (batched and one-token evaluation round differently).
ALIGN = 64
BATCH = 512  # the most tokens one batched step evaluates (llama.cpp's n_batch)


def penalties(params: SamplingParams) -> bool:
    """Whether a request penalizes repeats (repeat, frequency or presence penalty)."""
    return (
        params.repeat_penalty != 1.0
        or params.frequency_penalty != 0.0
        or params.presence_penalty != 0.0
    )


def check_request(n_prompt: int, n_ctx: int, params: SamplingParams, n_vocab: int = 0) -> None:
    """Raise before any compute when a request cannot run."""
    if n_prompt == 0:
        raise InvalidRequest("The prompt is empty (0 tokens).", param="prompt")
    if n_prompt >= n_ctx:
        raise ContextOverflow(n_prompt, n_ctx)
    if params.logit_bias and n_vocab:
        bad = [tok for tok, _ in params.logit_bias if not 0 <= tok < n_vocab]
        if bad:
            raise InvalidRequest(
                f"logit_bias names token {bad[0]}, which is not in the vocabulary "
                f"(ids 0 to {n_vocab - 1})",
                param="logit_bias",
            )
    if params.max_tokens is not None and params.max_tokens < 1:
        raise InvalidRequest(
            f"max_tokens must be at least 1, got {params.max_tokens}", param="max_tokens"
        )


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """The length of the longest common prefix of two token lists."""
    n, limit = 0, min(len(a), len(b))
    while n < limit and a[n] == b[n]:
        n += 1
    return n


def reusable_prefix(cached: Sequence[int], prompt: Sequence[int], *, exact: bool = True) -> int:
    """How many cached tokens a prompt can keep: the common prefix, cut to ALIGN when the
    reuse must be exact. The last prompt token is always evaluated (its logits pick the
    first answer token)."""
    n = common_prefix(cached, prompt[:-1])
    return n - n % ALIGN if exact else n


def aligned_part(done: int, n_prompt: int) -> int:
    """How many prompt tokens a deterministic request reads next: up to the next multiple of
    ALIGN, and the last prompt token alone (as a cold run does; see ALIGN above)."""
    if n_prompt - done <= 1:
        return n_prompt - done
    return min((done // ALIGN + 1) * ALIGN, n_prompt - 1) - done


def extends_canonical(canonical: int, start: int, lo: int, hi: int) -> int:
    """The new length of the exactly-reusable KV prefix after evaluating the batch
    [start+lo, start+hi): it grows only by whole aligned blocks that follow it."""
    if start + lo == canonical and canonical % ALIGN == 0 and hi - lo == ALIGN:
        return canonical + ALIGN
    return canonical


class KVLedger:
    """The tokens a backend's live KV cache holds, and how many lead it exactly: the
    `canonical` prefix, evaluated in whole aligned prompt blocks as a cold run evaluates
    them (only that part is ever reused). Each backend keeps one beside its native cache.

    `finals` are the batches [start, end) that read a prompt's last token alone in their
    step, kept while the cache holds that prompt (up to its last token, which a rerun
    reads again anyway): a rerun of that prompt reads the same batch again and gets the
    same logits (batched and one-token evaluation round differently), so a repeatable
    request gives the same answer twice.

    `kept` is the last prompt's end and the logits its last token gave (a backend's own
    copy of the row), while the cache holds that prompt: a rerun samples from them and
    reads nothing (`resume`). A snapshot in RAM carries them; one on disk does not."""

    __slots__ = ("canonical", "finals", "kept", "tokens")

    def __init__(self) -> None:
        self.tokens: list[int] = []  # generation appends to this list in place
        self.canonical = 0
        self.finals: list[tuple[int, int]] = []
        self.kept: tuple[int, Any] | None = None

    def clear(self) -> None:
        self.tokens.clear()
        self.canonical = 0
        self.finals.clear()
        self.kept = None

    def prefix(self) -> list[int]:
        """The exactly reusable tokens."""
        return self.tokens[: self.canonical]

    def view(self, *, exact: bool) -> list[int]:
        """A copy of the tokens a request may reuse: the exact prefix, or all of them."""
        return self.prefix() if exact else list(self.tokens)

    def reusable(self, prompt: Sequence[int]) -> int:
        return reusable_prefix(self.prefix(), prompt)

    def reread(self, prompt: Sequence[int]) -> int:
        """Where a rerun of `prompt` starts reading: the start of the batch that read its
        last token, when this cache holds that run; else anywhere (len(prompt))."""
        for start, end in self.finals:
            if end == len(prompt) and self.tokens[: end - 1] == list(prompt[:-1]):
                return start
        return len(prompt)

    def resume(self, prompt: Sequence[int]) -> Any | None:
        """The logits kept for `prompt` when this cache holds all of it (its answer after
        it, if any, is the caller's to cut); None when it holds another prompt."""
        if self.kept is None or self.kept[0] != len(prompt):
            return None
        end, row = self.kept
        return row if self.tokens[:end] == list(prompt) else None

    def evaluated(self, part: Sequence[int], start: int, lo: int, hi: int) -> None:
        """A prompt batch [start+lo, start+hi) went into the cache."""
        self.tokens.extend(part)
        self.canonical = extends_canonical(self.canonical, start, lo, hi)

    def cut(self, n: int) -> None:
        """The native cache now keeps only its first n positions."""
        del self.tokens[n:]
        self.canonical = min(self.canonical, n)
        self.finals[:] = [f for f in self.finals if f[1] <= n + 1]
        if self.kept is not None and self.kept[0] > n:
            self.kept = None

    def saved(self, nbytes: int, payload: Any) -> KVSnapshot:
        """A snapshot of this cache, its native state being `payload`."""
        return KVSnapshot(
            tuple(self.tokens), nbytes, payload, self.canonical, tuple(self.finals), self.kept
        )

    def restored(self, snapshot: KVSnapshot) -> None:
        """A saved state replaced the cache."""
        self.tokens[:] = snapshot.tokens
        self.canonical = len(snapshot.exact_tokens)
        self.finals[:] = [f for f in snapshot.finals if f[1] <= len(self.tokens) + 1]
        self.kept = snapshot.kept

    def append(
        self, part: Sequence[int], *, exact: bool, final: bool = False, row: Any = None
    ) -> None:
        """A batched step evaluated `part` after the cache; with `exact`, a whole aligned
        block that a cold run evaluates the same way extends the canonical prefix; with
        `final`, it read a prompt's last token alone in its step; `row`: the logits that
        token gave, kept for a rerun (`resume`)."""
        if exact and len(part) == ALIGN and self.canonical == len(self.tokens):
            self.canonical = extends_canonical(self.canonical, len(self.tokens), 0, ALIGN)
        if final:  # from the text after its last picture (a picture is read on its own)
            after = next((i + 1 for i in range(len(part) - 1, -1, -1) if part[i] < 0), 0)
            self.finals.append((len(self.tokens) + after, len(self.tokens) + len(part)))
        self.tokens.extend(part)
        if row is not None:
            self.kept = (len(self.tokens), row)

    def copied(self, other: KVLedger, n: int) -> None:
        """The cache now holds the first n tokens of another sequence's."""
        self.tokens[:] = other.tokens[:n]
        self.canonical = min(other.canonical, n)
        self.finals[:] = [f for f in other.finals if f[1] <= n + 1]
        self.kept = other.kept if other.kept is not None and other.kept[0] <= n else None


def check_scoring(n_tokens: int, start: int, n_ctx: int) -> None:
    """Raise InvalidRequest unless `logprobs` can score tokens[start:] in one context."""
    if n_tokens > n_ctx:
        raise InvalidRequest(f"scoring needs {n_tokens} tokens in one context of {n_ctx}")
    if not 1 <= start < n_tokens:
        raise InvalidRequest(f"scoring starts at token {start}; it must be 1 to {n_tokens - 1}")


def token_logprob(logits: Any, token: int, top: int, piece: Callable[[int], bytes]) -> TokenLogprob:
    """A token's log probability under raw logits, and the `top` most likely tokens'."""
    import numpy as np

    x = np.asarray(logits, dtype=np.float64)
    peak = x.max()
    norm = peak + np.log(np.exp(x - peak).sum())
    best: tuple[tuple[int, float, bytes], ...] = ()
    if top > 0:
        ids = np.argpartition(-x, top - 1)[:top]
        ids = ids[np.argsort(-x[ids], kind="stable")]
        best = tuple((int(i), float(x[i] - norm), piece(int(i))) for i in ids)
    return TokenLogprob(token, float(x[token] - norm), piece(token), best)


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
    variables: Mapping[str, Any] | None = None,
    media_tokenize: Callable[[str, Sequence[Media]], list[int]] | None = None,
) -> list[int]:
    """Render the chat template and tokenize it, with BOS exactly once when the model wants it.
    The messages' images and audio are laid out by `media_tokenize` (the model's
    projector: backends/media.py); a model without one reads text only."""
    text = chat_template.render(
        template, messages, bos_token=bos_text, eos_token=eos_text, variables=variables
    )
    media = [m for msg in messages for m in msg.media]
    if not media:
        lost_media(text)
        tokens = tokenize_special(text)
    elif media_tokenize is None:  # engine/prompt.py says why first, naming the fix
        kind = media[0].kind
        raise InvalidRequest(
            f"this model reads text only, not {'images' if kind == 'image' else 'audio'}",
            param="messages",
            code="vision_not_supported" if kind == "image" else "audio_not_supported",
        )
    else:
        tokens = media_tokenize(text, media)
    if add_bos and bos_id is not None and (not tokens or tokens[0] != bos_id):
        tokens = [bos_id, *tokens]
    return tokens


@dataclass
class DraftCounts:
    """Drafted tokens a generation proposed and kept, for its final stats."""

    proposed: int = 0
    accepted: int = 0
    off: str = ""  # why a request that could draft did not (its sampler cannot be exact)


def keep_matching(draft: Sequence[int], sample_at: Callable[[int], int]) -> tuple[int, int]:
    """The target samples position 0, 1, ... of a verified batch; drafts are kept while
    they equal its samples. Returns the first sample that is not a kept draft (a
    correction, or the token after a fully kept draft) and how many drafts were kept."""
    n_ok = 0
    while True:
        sampled = sample_at(n_ok)
        if n_ok == len(draft) or sampled != draft[n_ok]:
            return sampled, n_ok
        n_ok += 1


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
    draft_off: str = "",
    stop_sequence: str | None = None,
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
        draft_off=draft_off,
    )
    return Chunk(tail, (), finish_reason=finish, stats=stats, stop_sequence=stop_sequence)


# -- vocabularies ------------------------------------------------------------------------

_FIM_NAMES = (
    ("<fim_prefix>", "<fim_suffix>", "<fim_middle>"),
    ("<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"),
    ("<\uff5cfim\u2581begin\uff5c>", "<\uff5cfim\u2581hole\uff5c>", "<\uff5cfim\u2581end\uff5c>"),
    ("<PRE>", "<SUF>", "<MID>"),
)


def fim_ids_from_tokens(tokens: list[str]) -> tuple[int, int, int] | None:
    """Fill-in-the-middle token ids found by their usual names in a vocabulary."""
    index = {t: i for i, t in enumerate(tokens)}
    for names in _FIM_NAMES:
        if all(n in index for n in names):
            return (index[names[0]], index[names[1]], index[names[2]])
    return None


def vocab_fingerprint(tokens: list[str]) -> str:
    """Identifies a vocabulary: two models with the same one can share drafts and caches."""
    return hashlib.sha256("\x00".join(tokens).encode("utf-8")).hexdigest()[:16]
