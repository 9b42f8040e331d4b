"""Many requests on one model at once: continuous batching with chunked prefill.

Each loaded model has a `Scheduler` with `n_seq` slots (the `parallel` setting).
A request joins at the next step and leaves when it ends; none waits for another
to finish. One step is one batched call of the backend (`Decoding.step`):

- every sequence that is decoding contributes its next token (and, when it is the
  only sequence, the drafts that speculative decoding proposes for it);
- sequences still reading their prompts share what is left of the step's token
  budget, interactive ones first. While others decode, a prompt is read in chunks
  of `PREFILL_CHUNK` tokens, so running streams keep flowing while it is read;
- each sequence is then sampled by its own sampler chain (its own temperature,
  seed and penalties), its text checked for stop strings, and its chunks sent.

Interactive requests (`"priority": "high"`, or a raw completion with a small
`max_tokens`, which is what editor autocomplete sends) are admitted first and
prefilled first; every decoding sequence still gets its token each step, so a
long stream is slowed, never starved.

Requests that run with different LoRA adapters (engine/adapters.py) are not batched
together: a llama.cpp context applies one set of adapters per decode, so each step takes
the requests of one set, the sets taking turns step by step.

A deterministic request runs alone: it waits for the running ones to finish and
holds back the rest until it ends, reads its prompt in aligned blocks and reuses
only exact prefixes, so its output does not depend on the cache or other clients.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import numpy as np

from localllm.backends.base import Chunk, Decoding, FinishReason, SeqWork
from localllm.backends.common import (
    BATCH,
    aligned_part,
    common_prefix,
    final_chunk,
    keep_matching,
    token_logprob,
)
from localllm.backends.media import has_media, whole_runs
from localllm.backends.textstream import TextAssembler
from localllm.engine.grammar import Constraint
from localllm.engine.request import END, Job, end_unstarted, interactive
from localllm.engine.sequence import Hooks, Running, kept_prefix, paused, stalled
from localllm.errors import LocalLLMError, ReaderStalled

log = logging.getLogger(__name__)

PREFILL_CHUNK = 128  # prompt tokens per step while other sequences decode
KEEP_RATIO = 4  # a request may take over a sequence if it loses at most 1/KEEP_RATIO of its state
# alone, a prompt's last part shorter than this is read in one step, its last token with it
# (the step 6-18% shorter here for 4-16 new tokens); a longer one leaves that token for a
# step of its own (2% of its time or less). A rerun reads the last part again (see _start)
WHOLE_BELOW = 64


class Scheduler:
    """The running batch of one model. Owned by the engine's worker thread; `hooks` are
    told when a request is admitted, placed in a sequence and ended (Hooks above)."""

    def __init__(self, model: Decoding, hooks: Hooks) -> None:
        self.model = model
        self._hooks = hooks
        self._ended: list[tuple[Job, Any]] = []  # (job, END or its error), sent by flush()
        self.waiting: list[Job] = []
        self.active: dict[int, Running] = {}
        self._last_used = [0.0] * model.n_seq
        self._arrivals = 0
        self._steps = 0
        self._turn = 0  # which set of adapters steps next, when requests want several
        self._tags = [""] * model.n_seq  # the adapters each sequence's KV was computed under
        self.changes = 0  # requests added, started and ended so far (the worker's status)

    # -- the queue ---------------------------------------------------------------------
    @property
    def busy(self) -> bool:
        """Something to step: a running request whose reader keeps up, or a waiting one
        that can start (or has been cancelled). A request whose prompt is still being read,
        or whose reader has fallen behind, keeps its place without making the worker spin."""
        if any(not paused(r) or r.job.cancel.is_set() for r in self.active.values()):
            return True
        if self._stalled() is not None:
            return True
        if len(self.active) < self.model.n_seq:
            return self._startable()
        return False

    @property
    def ending(self) -> bool:
        """Requests ended in the last step that have not heard so yet (flush tells them)."""
        return bool(self._ended)

    @property
    def paused(self) -> int:
        """Running requests whose readers have fallen behind (the worker looks again soon)."""
        return sum(paused(r) for r in self.active.values())

    def _stalled(self) -> Running | None:
        """The running request to end for its reader: the first whose reader took nothing
        for longer than its bound (whether or not another waits: a deterministic one holds
        back everything behind it), else, while a priority request waits for a sequence
        and none is free, the first ordinary one whose reader has fallen behind."""
        by_arrival = sorted(self.active.values(), key=lambda r: r.arrival)
        first = next((r for r in by_arrival if stalled(r)), None)
        if first is not None or len(self.active) < self.model.n_seq:
            return first
        if any(interactive(j.request) and j.ready for j in self.waiting):
            return next((r for r in by_arrival if not r.high and paused(r)), None)
        return None

    def _startable(self) -> bool:
        """A waiting request the next step would start or end: in admission order, a
        cancelled or ready one, unless a deterministic one still being read comes first
        (it holds back those behind it, so they give the worker nothing to do yet)."""
        for job in sorted(self.waiting, key=lambda j: (not interactive(j.request), j.arrival)):
            if job.cancel.is_set() or job.ready:
                return True
            if job.request.deterministic:
                return False
        return False

    def add(self, job: Job) -> None:
        self._arrivals += 1
        job.arrival = self._arrivals
        self.waiting.append(job)
        self.changes += 1

    def progress(self) -> list[dict[str, Any]]:
        """Each running request, for /health and `localllm ps` (read from other threads)."""
        return [r.row() for r in list(self.active.values())]

    def cancel_all(self, error: LocalLLMError) -> None:
        """End every request with an error (the model is going away)."""
        for r in list(self.active.values()):
            self._drop(r, error)
        self._ended += [(job, error) for job in self.waiting]
        self.waiting.clear()
        self.flush()

    def flush(self) -> None:
        """Tell the requests that ended that they have (after a step: see Engine._run)."""
        ended, self._ended = self._ended, []
        self.changes += len(ended)
        for job, item in ended:
            job.end(item)

    # -- admission ---------------------------------------------------------------------
    def _admit(self) -> None:
        if any(r.exact for r in self.active.values()):
            return  # a deterministic request runs alone
        self.waiting.sort(key=lambda j: (not interactive(j.request), j.arrival))
        i = 0
        while i < len(self.waiting):
            job = self.waiting[i]
            if job.cancel.is_set():
                self.waiting.pop(i)
                end_unstarted(job, job.ref.name if job.ref else "")
                self._ended.append((job, END))
                continue
            deterministic = bool(job.request.deterministic)
            if not job.ready:  # its prompt is still being read
                if deterministic:
                    return  # it holds back those behind it meanwhile too
                i += 1
                continue
            free = [s for s in range(self.model.n_seq) if s not in self.active]
            if not free or (deterministic and self.active):
                return  # a deterministic request also holds back those behind it
            self.waiting.pop(i)
            try:
                self._start(job, free)
            except Exception as exc:  # this request fails, the others go on
                self._ended.append((job, _failure(exc, "could not start a request")))
                continue
            if deterministic:
                return

    def _start(self, job: Job, free: list[int]) -> None:
        adm = self._hooks.admit(job)
        model, prompt, tag = self.model, adm.prompt, adm.adapters.tag

        # the sequence the prompt carries on (its conversation's, or the one that read this
        # very prompt: a rerun), then an empty one, then the least recently used: a state
        # mostly thrown away would cost a park and a restore
        def reuse(s: int) -> tuple[bool, int, float]:
            live = model.seq_tokens(s)
            shared = common_prefix(live, prompt) if self._tags[s] == tag else 0
            carried = shared == len(prompt) or (len(live) - shared) * KEEP_RATIO <= len(live)
            return carried, shared if carried else 0, -self._last_used[s]

        seq = max(free, key=reuse)
        self._hooks.prepare(prompt, seq, adm.exact, tag)
        self._tags[seq] = tag
        params = job.request.params
        cached = kept_prefix(model, seq, prompt, params, exact=adm.exact)
        limit = model.info.n_ctx - len(prompt)
        if params.max_tokens is not None:
            limit = min(params.max_tokens, limit)
        constraint = Constraint(model, params.grammar) if params.grammar else None
        r = self.active[seq] = Running(
            job=job,
            seq=seq,
            prompt=prompt,
            done=cached,
            cached=cached,
            limit=limit,
            # the penalties' history: the prompt's end, or nothing (the answer's own only)
            sampler=model.new_sampler(params, prompt if params.penalize_prompt else ()),
            text=TextAssembler(params.stop + params.end_markers),
            exact=adm.exact,
            high=interactive(job.request),
            started=adm.started,
            drafter=adm.drafter,
            arrival=job.arrival,
            t0=time.perf_counter(),
            constraint=constraint,
            logprobs=params.logprobs,
            adapters=adm.adapters,
            pictures=has_media(prompt),
        )
        r.counts.off = adm.draft_off
        self.changes += 1
        if cached == len(prompt):  # its first token now, from the kept logits: nothing to read
            try:
                self._sampled(r, self._pick(r, 0), 0)
            except Exception as exc:
                if self.active.get(seq) is r:
                    self._drop(r, _failure(exc, "sampling failed"))

    # -- one step ----------------------------------------------------------------------
    def step(self) -> None:
        """Admit what fits, evaluate one batch, sample and send what it gave."""
        self._evict_stalled()
        self._admit()
        for r in list(self.active.values()):
            if r.job.cancel.is_set():
                self._finish(r, "cancelled")
        work, plans = self._plan()
        if not work:
            return
        t = time.perf_counter()
        try:
            self.model.use_adapters(self.active[work[0].seq].adapters.scales)
            self.model.step(work)
        except Exception as exc:  # the sequences in the batch end; the others go on
            error = _failure(exc, "a batched step failed")
            for w in work:
                self.model.seq_keep(w.seq, 0)  # what the failed step wrote is unknown
                self._drop(self.active[w.seq], error)
            return
        seconds = time.perf_counter() - t
        for w, draft in zip(work, plans, strict=True):
            r = self.active[w.seq]
            try:
                if r.prefilling:
                    r.done += len(w.tokens)
                    if w.logits:
                        self._sampled(r, self._pick(r, 0), 0)
                else:
                    self._verified(r, draft, seconds, alone=len(work) == 1)
            except Exception as exc:  # its grammar gave up, say: it ends, the others go on
                if self.active.get(w.seq) is r:
                    self._drop(r, _failure(exc, "sampling failed"))

    def _evict_stalled(self) -> None:
        """A request whose reader stopped reading past its bound ends (its sequence free
        for the next); one that has fallen behind gives its sequence up to a priority
        request that waits for one."""
        victim = self._stalled()
        if victim is None:
            return
        behind = victim.job.reader() if victim.job.reader is not None else None
        error = ReaderStalled(
            behind or 0.0, victim.job.stall_s, len(self.waiting), priority=not stalled(victim)
        )
        log.warning("request %s: %s", victim.job.request.request_id or "-", error)
        self._drop(victim, error)

    def _plan(self) -> tuple[list[SeqWork], list[list[int]]]:
        """The batch: each decoding sequence's token (and drafts, when it is alone), then
        prompt chunks, interactive and earlier requests first. While an interactive request
        decodes, the others sit out every other step: a step of one sequence costs about
        two thirds of a step of two here, so autocomplete gets most of the machine for its
        few tokens and a long answer runs at half speed meanwhile, never stopped."""
        running = sorted(self.active.values(), key=lambda r: (not r.high, r.arrival))
        self._steps += 1
        if self._steps % 2 and any(r.high and not r.prefilling for r in running):
            running = [r for r in running if r.high]
        running = self._one_adapter_set(running)
        decoding = [r for r in running if not r.prefilling and not paused(r)]
        work: list[SeqWork] = []
        plans: list[list[int]] = []
        budget = BATCH
        for r in decoding:
            assert r.pending is not None
            draft = self._draft(r) if len(running) == 1 else []
            work.append(SeqWork(r.seq, [r.pending, *draft], logits=1 + len(draft)))
            plans.append(draft)
            budget -= 1 + len(draft)
        if decoding:
            budget = min(budget, PREFILL_CHUNK)
        for r in running:
            if not r.prefilling or budget <= 0:
                continue
            left = len(r.prompt) - r.done
            n = min(left - 1 if left >= WHOLE_BELOW and len(running) == 1 else left, budget)
            if r.exact:
                n = aligned_part(r.done, len(r.prompt))
            if r.pictures:
                n = whole_runs(r.prompt, r.done, r.done + n) - r.done  # a picture read whole
            last = r.done + n == len(r.prompt)
            part = r.prompt[r.done : r.done + n]
            # the part that gives the prompt's logits, alone in its step, is recorded: a
            # repeatable rerun reads it again for the same answer (see _start)
            final = last and len(running) == 1
            work.append(SeqWork(r.seq, part, int(last), exact=r.exact, final=final, last=last))
            plans.append([])
            budget -= n
        return work, plans

    def _one_adapter_set(self, running: list[Running]) -> list[Running]:
        """The requests of one set of adapters, when they want several: each set in turn,
        earliest first (a step applies one set)."""
        sets = list(dict.fromkeys(r.adapters.scales for r in running))
        if len(sets) < 2:
            return running
        self._turn += 1
        chosen = sets[self._turn % len(sets)]
        return [r for r in running if r.adapters.scales == chosen]

    def _draft(self, r: Running) -> list[int]:
        if r.drafter is None or r.pending is None:  # none for a grammar (sequence.no_drafts)
            return []
        kv = self.model.seq_tokens(r.seq)
        room = min(r.limit - r.generated, self.model.info.n_ctx - len(kv) - 1)
        return r.drafter.propose([*kv, r.pending], room) if room > 0 else []

    def _verified(self, r: Running, draft: list[int], seconds: float, *, alone: bool) -> None:
        """After a decode step: keep the drafts the model itself samples, send them and the
        next token."""
        sampled, n_ok = keep_matching(draft, lambda i: self._pick(r, i))
        if draft:  # the rejected drafts leave the cache
            self.model.seq_keep(r.seq, len(self.model.seq_tokens(r.seq)) - len(draft) + n_ok)
            r.counts.proposed += len(draft)
            r.counts.accepted += n_ok
        if r.drafter is not None and alone:
            r.drafter.observe(len(draft), n_ok, seconds)
        for kept in draft[:n_ok]:
            if not self._sampled(r, kept, 1):
                return
        self._sampled(r, sampled, 0)

    def _pick(self, r: Running, row: int) -> int:
        """Sample `r`'s next token from a row of the last step's logits, within its grammar,
        noting its log probability when the request asked for them."""
        logits = self.model.logits(r.seq, row) if r.logprobs is not None else None
        allowed = r.constraint.allowed() if r.constraint is not None else None
        if r.generated + row < r.job.request.params.min_tokens:
            allowed = self._no_end(allowed)
        tok = self.model.sample(r.sampler, r.seq, row, allowed)
        if r.constraint is not None:
            r.constraint.accept(tok)
        if logits is not None:
            r.picked = token_logprob(logits, tok, r.logprobs or 0, self.model.piece)
        return tok

    def _no_end(self, allowed: np.ndarray | None) -> np.ndarray:
        """`allowed` (None: every token) without the end-of-generation tokens, unless
        nothing else would be left."""
        info = self.model.info
        mask = np.ones(info.n_vocab, dtype=np.bool_) if allowed is None else allowed.copy()
        ends = [t for t in info.eog_ids if t < len(mask)]
        mask[ends] = False
        return mask if mask.any() else (allowed if allowed is not None else ~mask)

    def _sampled(self, r: Running, tok: int, from_draft: int) -> bool:
        """Send one generated token; False when the request ended with it."""
        if r.job.cancel.is_set():
            self._finish(r, "cancelled")
            return False
        if tok in self.model.info.eog_ids:
            self._finish(r, "stop")
            return False
        r.generated += 1
        if r.generated == 1:
            r.t_first = time.perf_counter()
        picked = () if r.picked is None else (r.picked,)
        text = r.text.push(self.model.piece(tok))
        self._send(r, Chunk(text, (tok,), from_draft=from_draft, logprobs=picked))
        if r.text.stopped or (r.constraint is not None and r.constraint.done):
            self._finish(r, "stop")
            return False
        if r.spent(text):
            self._finish(r, "length")
            return False
        r.pending = tok
        return True

    def _send(self, r: Running, chunk: Chunk) -> None:
        if r.started is not None:
            r.job.emit(r.started)
            r.started = None
        r.job.emit(chunk)

    def _finish(self, r: Running, finish: FinishReason) -> None:
        tail = "" if r.text.stopped else r.text.flush()
        t_first = r.t_first or r.t0
        chunk = final_chunk(
            tail,
            finish,
            len(r.prompt),
            r.cached,
            r.generated,
            r.t0,
            t_first,
            time.perf_counter(),
            proposed=r.counts.proposed,
            accepted=r.counts.accepted,
            draft_off=r.counts.off,
            stop_sequence=r.text.matched if r.text.matched in r.job.request.params.stop else None,
        )
        self._release(r)
        self._hooks.ended(r.job, r, chunk)
        self._ended.append((r.job, END))

    def _drop(self, r: Running, error: LocalLLMError) -> None:
        self._release(r)
        self._hooks.ended(r.job, r, None)
        self._ended.append((r.job, error))

    def _release(self, r: Running) -> None:
        self.active.pop(r.seq, None)
        self._last_used[r.seq] = time.monotonic()
        self.model.free_sampler(r.sampler)


def _failure(exc: Exception, what: str) -> LocalLLMError:
    """What a request that failed is told: our own errors as they are; anything else is
    a bug, logged, and an internal error."""
    if isinstance(exc, LocalLLMError):
        return exc
    log.exception(what)
    return LocalLLMError(f"internal error: {exc}")
