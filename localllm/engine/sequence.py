"""What the scheduler keeps for each request it runs (`Running`), what the engine works
out before one starts (`Admission`), the hooks it calls at the points of a request's life
(`Hooks`), how much of its sequence's KV a request keeps (`kept_prefix`), and how it treats
a request whose reader has stopped reading (`paused`, `stalled`)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from localllm.backends.base import Chunk, Decoding, Drafter, SamplingParams, TokenLogprob
from localllm.backends.common import DraftCounts, reusable_prefix
from localllm.backends.media import has_media
from localllm.backends.textstream import TextAssembler
from localllm.engine.adapters import BASE, Applied
from localllm.engine.grammar import Constraint
from localllm.engine.request import Job, Started


@dataclass(eq=False)
class Running:
    """One admitted request: its sequence, its prompt read so far, its output so far."""

    job: Job
    seq: int
    prompt: list[int]
    done: int  # prompt tokens in the KV cache (cached ones included)
    cached: int
    limit: int  # the most tokens it may generate
    sampler: Any
    text: TextAssembler
    exact: bool
    high: bool
    started: Started | None  # sent with the first chunk
    drafter: Drafter | None
    arrival: int
    t0: float
    t_first: float = 0.0
    generated: int = 0
    pending: int | None = None  # sampled and sent, not yet evaluated
    counts: DraftCounts = field(default_factory=DraftCounts)
    constraint: Constraint | None = None  # the grammar its output must follow
    logprobs: int | None = None  # report log probabilities, with this many alternatives
    picked: TokenLogprob | None = None  # the last sampled token's, when reported
    held: bool = False  # paused at the last step: its reader is behind (see `paused`)
    adapters: Applied = BASE  # the LoRA adapters its steps run with
    pictures: bool = False  # its prompt holds images or audio: each read whole in a step

    @property
    def prefilling(self) -> bool:
        return self.pending is None

    def spent(self, text: str) -> bool:
        """Its token limit is reached, or its time bound (llama-server's t_max_predict_ms,
        which ends an answer only at a newline) is spent and this piece ends a line."""
        bound = self.job.request.params.newline_deadline_s
        late = bound is not None and time.perf_counter() - (self.t_first or self.t0) > bound
        return self.generated >= self.limit or (late and "\n" in text)

    def row(self) -> dict[str, Any]:
        """Its progress, for /health and `localllm ps` (read from other threads)."""
        return {
            "seq": self.seq,
            "state": "prefill" if self.prefilling else "paused" if self.held else "decode",
            "prompt_tokens": len(self.prompt),
            "prefilled": self.done,
            "cached": self.cached,
            "generated": self.generated,
            "priority": "high" if self.high else "normal",
            "deterministic": self.exact,
        }


@dataclass(frozen=True, slots=True)
class Admission:
    """What the engine works out for a request before it can run on a model."""

    prompt: list[int]
    started: Started
    drafter: Drafter | None
    exact: bool
    adapters: Applied = BASE  # the LoRA adapters it runs with (engine/adapters.py)
    draft_off: str = ""  # why a request drafting was on for runs without drafts


def no_drafts(params: SamplingParams, prompt: Sequence[int]) -> str:
    """Why a request cannot be drafted for ("" when it can): a grammar or log
    probabilities go token by token (verified drafts would bypass them), and a draft
    model could not read a prompt's pictures."""
    if params.grammar is not None:
        return "a grammar constrains the answer"
    if params.logprobs is not None:
        return "logprobs asked"
    return "the prompt has a picture" if has_media(prompt) else ""


class Hooks(Protocol):
    """What a model's scheduler asks of the engine at the three points of a request's
    life (engine/lifecycle.py is the one implementation)."""

    def admit(self, job: Job) -> Admission:
        """The request made ready to run, or the typed error it fails with."""
        ...

    def prepare(self, prompt: list[int], seq: int, exact: bool, tag: str = "") -> None:
        """Put the best cached KV state for `prompt` into sequence `seq`, among the states
        computed under the adapters `tag` names ("": none)."""
        ...

    def ended(self, job: Job, run: Running, final: Chunk | None) -> None:
        """The request ended: with its final chunk, or None when it failed."""
        ...


def kept_prefix(
    model: Decoding, seq: int, prompt: Sequence[int], params: SamplingParams, *, exact: bool
) -> int:
    """How many of its prompt's tokens a request finds in sequence `seq`, which then holds
    just those. All of them: a rerun of the prompt the sequence last read, whose first
    token is drawn from the logits kept from that read (model.seq_resume; not for a
    deterministic request, which reads as a cold run does). Else the reusable prefix,
    which a repeatable request cuts back to the first run's last batch (seq_reread)."""
    if not exact and model.seq_resume(seq, prompt):
        return len(prompt)
    cached = reusable_prefix(model.seq_tokens(seq, exact=exact), prompt, exact=exact)
    if params.temperature <= 0 or params.seed is not None:  # the same answer each time
        cached = min(cached, model.seq_reread(seq, prompt))
    return cached if model.seq_keep(seq, cached) else 0


def paused(r: Running) -> bool:
    """Its reader has fallen behind (engine/stream.py's `ChunkStream.reader`): it sits out
    the decode steps, keeping its sequence, until the reader catches up. The answer is
    kept in `r.held` for the progress rows (on the worker thread only)."""
    reader = r.job.reader
    r.held = reader is not None and not r.prefilling and reader() is not None
    return r.held


def stalled(r: Running) -> bool:
    """Its reader has taken nothing for longer than its bound: it may be ended to free its
    sequence for a request that waits for one."""
    behind = r.job.reader() if r.job.reader is not None else None
    return behind is not None and behind > r.job.stall_s
