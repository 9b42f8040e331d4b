"""A request's life on a model: admitted (prompt, drafter, exactness), placed in a sequence
(the prompt cache's best state), ended (counted, told to the observers, answered).

`Lifecycle` is the one writer of the engine's totals and the one caller of its
observers; every write happens on the worker thread (a remote request's end is posted
there too), and readers see them in the status snapshot the worker publishes.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import time
from collections.abc import Iterator

from localllm.backends import reasoning
from localllm.backends.base import Chunk, LoadedModel, ModelRef
from localllm.backends.common import check_request
from localllm.config import Settings
from localllm.engine.adapters import applied
from localllm.engine.client import Budget, Observer
from localllm.engine.prompt import fit_prompt, with_tool_grammar
from localllm.engine.prompt_cache import PromptCache
from localllm.engine.request import Job, Request, Started
from localllm.engine.sequence import Admission, Running, no_drafts
from localllm.engine.speculative import Speculation

log = logging.getLogger(__name__)


class Lifecycle:
    """The engine's totals and observers, and the scheduler hooks of each loaded model."""

    def __init__(self, settings: Settings, cache: PromptCache) -> None:
        self.settings = settings
        self.cache = cache
        self.totals = {
            "requests": 0,
            "cancelled": 0,
            "prompt_tokens": 0,
            "generated_tokens": 0,
            "loads": 0,
            "unloads": 0,
        }
        # told of each finished request (on the worker thread; keep them quick): the
        # request, the model that answered, its final chunk and the seconds since submit
        self.observers: list[Observer] = []
        # API keys' daily token quotas (engine/accounting.py), when a server has keys
        self.budget: Budget | None = None

    def hooks(
        self, model: LoadedModel, ref: ModelRef, cache_key: str, speculation: Speculation
    ) -> ModelHooks:
        """The scheduler hooks of a newly loaded model (its drafts from `speculation`)."""
        return ModelHooks(self, model, ref, cache_key, speculation)

    def reserve(self, job: Job, prompt_tokens: int) -> int | None:
        """Hold the tokens a request may use against its API key's quota (the budget
        settles when the job ends); the answer's new token limit when the quota cut it."""
        job.request, job.reserved, capped = self.hold(job.request, prompt_tokens)
        return capped

    def hold(self, request: Request, prompt_tokens: int) -> tuple[Request, int, int | None]:
        """`reserve` for any request (a remote engine's too; any thread: the budget locks):
        the request with its max_tokens cut to what is left, the tokens held (give them
        back with `release`), and the cut limit (None: not cut)."""
        budget = self.budget
        if budget is None or not request.client:
            return request, 0, None
        asked = request.params.max_tokens
        granted, reserved = budget.reserve(request.client, prompt_tokens, asked)
        if granted == asked:
            return request, reserved, None
        params = dataclasses.replace(request.params, max_tokens=granted)
        return dataclasses.replace(request, params=params), reserved, granted

    def release(self, client: str, reserved: int) -> None:
        if reserved and self.budget is not None:
            self.budget.settle(client, reserved)

    def settle(self, job: Job) -> None:
        self.release(job.request.client, job.reserved)
        job.reserved = 0

    def deterministic(self, request: Request) -> bool:
        if request.deterministic is None:
            return self.settings.deterministic
        return request.deterministic

    def finished(self, request: Request, model: str, final: Chunk, seconds: float) -> None:
        """A request that ran to its final chunk: counted, and told to the observers."""
        stats = final.stats
        assert stats is not None
        self.totals["prompt_tokens"] += stats.prompt_tokens
        self.totals["generated_tokens"] += stats.generated_tokens
        self.totals["cancelled"] += final.finish_reason == "cancelled"
        for observe in self.observers:
            with logged("a request observer"):
                observe(request, model, final, seconds)

    def finished_remote(self, request: Request, model: str, final: Chunk, seconds: float) -> None:
        """A remote engine's request, counted as a local one is (on the worker)."""
        self.totals["requests"] += 1
        self.finished(request, model, final, seconds)


class ModelHooks:
    """The scheduler's hooks for one loaded model (scheduler.Hooks)."""

    def __init__(
        self,
        life: Lifecycle,
        model: LoadedModel,
        ref: ModelRef,
        cache_key: str,
        speculation: Speculation,
    ) -> None:
        self._life = life
        self._model = model
        self._ref = ref
        self._key = cache_key  # its prompt-cache identity
        self._speculation = speculation

    def admit(self, job: Job) -> Admission:
        model = self._model
        if job.prompt is None:  # not read ahead on a tokenizer thread
            job.request, job.tool_format = with_tool_grammar(model, job.request)
            job.prompt = fit_prompt(model, job.request)
        request = job.request
        tokens, dropped, before = job.prompt
        check_request(len(tokens), model.info.n_ctx, request.params, model.info.n_vocab)
        adapters = applied(model.adapters, request.lora)
        capped = self._life.reserve(job, len(tokens))
        request = job.request
        thinking = None
        if request.messages is not None:  # a chat: the template may think
            tail = model.detokenize(tokens[-8:])
            thinking = reasoning.mode_for(model.info.chat_template, tail)
        ref = self._ref
        names = tuple(request.tools.names()) if request.tools is not None else ()
        started = Started(
            ref.name,
            len(tokens),
            dropped,
            before,
            job.tool_format,
            tool_names=names,
            reasoning=thinking,
            quota_max_tokens=capped,
        )
        exact = bool(request.deterministic)  # the setting's when the request is silent
        off = no_drafts(request.params, tokens)
        drafter = None if off else self._speculation.drafter(request, ref, model)
        off = off if self._speculation.mode(request) != "off" else ""  # said where it was on
        self._life.totals["requests"] += 1
        return Admission(tokens, started, drafter, exact, adapters, draft_off=off)

    def prepare(self, prompt: list[int], seq: int, exact: bool, tag: str = "") -> None:
        self._life.cache.prepare(self._key, prompt, seq, exact=exact, tag=tag)

    def ended(self, job: Job, run: Running, final: Chunk | None) -> None:
        life = self._life
        self._speculation.finished(self._ref, run.drafter)
        if final is None:
            life.cache.finished(self._key, run.seq, 0)
            return
        final = self._speculation.with_speedup(final, run.drafter)
        stats = final.stats
        assert stats is not None
        life.cache.finished(self._key, run.seq, stats.cached_tokens)
        life.finished(job.request, self._ref.name, final, time.monotonic() - job.submitted)
        if run.started is not None:
            job.emit(run.started)
        job.emit(final)


@contextlib.contextmanager
def logged(what: str) -> Iterator[None]:
    """Log an exception from `what` and go on (cleanup that must reach its end)."""
    try:
        yield
    except Exception:
        log.exception("%s failed", what)
