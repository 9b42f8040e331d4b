"""One sequence on a loaded model, outside the engine: `stream()` drives the scheduler's
batched step for a single request, so the contract, parity and speculation suites and
`localllm eval` exercise the decode path every request takes (there is no second one).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from localllm.backends.base import Chunk, Decoding, Drafter, SamplingParams
from localllm.backends.common import check_request
from localllm.engine.adapters import applied
from localllm.engine.request import END, Job, Request, Started
from localllm.engine.scheduler import Scheduler
from localllm.engine.sequence import Admission, Running, no_drafts


class _Alone:
    """Scheduler hooks for one request with no prompt cache: the model's own KV state of
    sequence 0 is what a following call may reuse."""

    def __init__(self, model: Decoding, drafter: Drafter | None, exact: bool) -> None:
        self._model = model
        self._drafter = drafter
        self._exact = exact

    def admit(self, job: Job) -> Admission:
        assert job.prompt is not None
        tokens = job.prompt[0]
        started = Started(self._model.info.id, len(tokens))
        adapters = applied(self._model.adapters, None)  # their global scales
        off = no_drafts(job.request.params, tokens) if self._drafter is not None else ""
        drafter = None if off else self._drafter
        return Admission(tokens, started, drafter, self._exact, adapters, draft_off=off)

    def prepare(self, prompt: list[int], seq: int, exact: bool, tag: str = "") -> None:
        pass

    def ended(self, job: Job, run: Running, final: Chunk | None) -> None:
        if final is not None:
            job.emit(final)


def stream(
    model: Decoding,
    prompt: Sequence[int],
    params: SamplingParams,
    *,
    should_stop: Callable[[], bool],
    drafter: Drafter | None = None,
    exact: bool = True,
) -> Iterator[Chunk]:
    """The chunks of one generation, the last with the finish reason and the stats. A
    prompt that does not fit, or a bad parameter, raises here, before the first chunk.
    `exact` (the default): the prompt is read in aligned blocks and only whole blocks of
    what sequence 0 holds are reused, so a cached prefix gives exactly the cold output
    (a deterministic request's rule); False: as a request of the engine's reuses it."""
    check_request(len(prompt), model.info.n_ctx, params, model.info.n_vocab)
    return _run(model, list(prompt), params, should_stop, drafter, exact)


def _run(
    model: Decoding,
    prompt: list[int],
    params: SamplingParams,
    should_stop: Callable[[], bool],
    drafter: Drafter | None,
    exact: bool,
) -> Iterator[Chunk]:
    items: list[Any] = []
    cancel = threading.Event()
    job = Job(Request(params, prompt_tokens=prompt), None, items.append, cancel)
    job.prompt = (prompt, 0, 0)
    scheduler = Scheduler(model, _Alone(model, drafter, exact))
    scheduler.add(job)
    try:
        while True:
            if should_stop():
                cancel.set()
            scheduler.step()
            scheduler.flush()
            taken, items[:] = list(items), []
            for item in taken:
                if item is END:
                    return
                if isinstance(item, BaseException):
                    raise item
                if isinstance(item, Chunk):
                    yield item
    finally:
        if not cancel.is_set() and scheduler.active:
            cancel.set()
            scheduler.step()  # ends the request: its sequence and sampler are freed
            scheduler.flush()
