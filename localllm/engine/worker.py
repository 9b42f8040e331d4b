"""The worker thread: it owns the loaded models, takes jobs from its queue and steps every
busy model's scheduler once per turn.

Clients hand it jobs through the engine's façade (engine/engine.py). Prompts are read
on two tokenizer threads, never here: a long or hostile prompt delays only the
requests behind it, never the streams that are decoding. The worker publishes a frozen
`EngineStatus`, which is all other threads read, after each load or unload, each job it
takes and each step that starts or ends a request, and every STATUS_INTERVAL_S while
tokens flow.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from localllm.backends.base import SamplingParams
from localllm.config import Settings
from localllm.engine.client import EngineStatus, LoadedRow, State, _frozen
from localllm.engine.collection import CollectionPause
from localllm.engine.lifecycle import Lifecycle, logged
from localllm.engine.prompt import check_token_ids, end_markers, fit_prompt, with_tool_grammar
from localllm.engine.prompt_cache import PromptCache
from localllm.engine.request import Job, Request, end_unstarted, interactive
from localllm.engine.residency import GrowthFailed, Residency, Resident
from localllm.errors import ContextOverflow, LocalLLMError, ServerBusy
from localllm.models.sampling import Recommended

log = logging.getLogger(__name__)

IDLE_WAIT_MAX_S = 3600.0


def high_reserve(max_queue: int) -> int:
    """Places beyond `max_queue` that only interactive requests (priority high, editor
    autocomplete) may take: a queue full of ordinary requests still lets them in."""
    return max(2, max_queue // 4)


PAUSED_LOOK_S = 0.05  # how often an idle worker looks whether a paused stream may go on
# while requests decode and none starts or ends, the status is published at most this often
# (building it took 10-14 us a step here: a quarter of the engine's Python for one stream)
STATUS_INTERVAL_S = 0.05


@dataclass(frozen=True, slots=True)
class _Tokenized:
    """A tokenizer thread's answer for a job: its prompt, or the error it gives."""

    job: Job
    res: Resident
    prompt: tuple[list[int], int, int] | None
    error: BaseException | None
    request: Request | None = None  # the request with its tool grammar, when it has one
    tool_format: str | None = None


@dataclass(frozen=True, slots=True)
class _Post:
    """A call to run on the worker that nobody waits for (a remote request's end)."""

    fn: Callable[[], None]


_Item = Job | _Tokenized | _Post | None


class Worker:
    """The thread and its queues. `residency` and `life` are touched on this thread only."""

    def __init__(
        self, settings: Settings, residency: Residency, life: Lifecycle, cache: PromptCache
    ) -> None:
        self.settings = settings
        self.residency = residency
        self.life = life
        self.cache = cache
        self.dead: str | None = None  # set if the worker thread ever stops unasked
        self._jobs: queue.Queue[_Item] = queue.Queue()
        self._outstanding = 0
        self._lock = threading.Lock()
        self._status = EngineStatus(backend_preference=settings.backend)
        self._status_due = 0.0  # when a step's status is next published without a change
        self._status_changes = -1  # the schedulers' `changes` in the last status
        self._tokenizers = ThreadPoolExecutor(2, thread_name_prefix="localllm-tokenize")
        self.thread = threading.Thread(target=self._run, name="localllm-engine", daemon=True)

    def start(self) -> None:
        self.thread.start()

    # -- what other threads read ---------------------------------------------------
    def _state(self) -> State:
        """ready while a default model serves (a failed on-demand load does not change
        that); error when the worker died or the only load failed; else loading or idle
        (status() also says error once the worker thread is gone)."""
        rs = self.residency
        if self.dead is not None:
            return "error"
        if rs.default is not None:
            return "ready"
        if rs.loading:
            return "loading"
        return "error" if rs.last_error else "idle"

    def status(self) -> EngineStatus:
        """The snapshot the worker published after its last step, with the requests
        outstanding counted now (any thread)."""
        status = dataclasses.replace(self._status, queued=self._outstanding)
        if status.state != "error" and not self.thread.is_alive():
            return dataclasses.replace(status, state="error")
        return status

    def publish(self) -> None:
        """On the worker: a new status snapshot, after each load or unload, each job taken
        and the steps that `_publish_after_step` says."""
        rs = self.residency
        default = rs.default
        rows = []
        for res in sorted(list(rs.resident.values()), key=lambda r: r is not default):
            info = res.model.info
            rows.append(
                LoadedRow(
                    model=res.ref.name,
                    default=res is default,
                    backend=info.backend,
                    device=info.device,
                    n_ctx=info.n_ctx,
                    memory_bytes=res.need,
                    kv_bytes=res.kv_bytes,
                    parallel=res.model.n_seq,
                    active=len(res.scheduler.active),
                    waiting=len(res.scheduler.waiting),
                    last_used=res.last_used,
                    keep_alive=res.keep_alive,
                    requests=res.requests,
                    draft_for=res.draft_for,
                    kv_type=res.profile.kv_dtype,
                    media=tuple(sorted(info.media)),
                )
            )
        self._status = EngineStatus(
            state=self._state(),
            model_info=default.model.info if default is not None else None,
            model_ref=default.ref if default is not None else None,
            sampling=default.sampling if default is not None else Recommended(),
            backend_preference=rs.backend,
            queued=self._outstanding,
            loaded=tuple(rows),
            activity=_frozen(self.activity()),
            totals=_frozen(self.life.totals),
            prompt_cache=_frozen(self.cache.stats()),
            dead=self.dead,
            last_error=rs.last_error,
        )

    def activity(self) -> dict[str, Any]:
        """Running and waiting requests per loaded model, with each one's prefill progress
        (for /health, `localllm ps` and the chat's status bar; any thread)."""
        out: dict[str, Any] = {"active": 0, "queued": 0, "requests": []}
        for res in list(self.residency.resident.values()):
            rows = res.scheduler.progress()
            out["active"] += len(rows)
            out["queued"] += len(res.scheduler.waiting)  # tokenizing ones included
            out["requests"] += [{"model": res.ref.name, **row} for row in rows]
        out["queued"] += self._jobs.qsize()
        return out

    # -- what other threads hand in ------------------------------------------------
    def enqueue(self, job: Job) -> None:
        if self.dead is not None:
            raise LocalLLMError(f"the engine stopped: {self.dead}; restart localllm")
        limit = self.settings.max_queue
        if job.call is None and interactive(job.request):
            limit += high_reserve(limit)  # never refused while ordinary ones fill the queue
        with self._lock:
            if self._outstanding >= limit:
                raise ServerBusy(self._outstanding, self.settings.max_queue)
            self._outstanding += 1
        self._jobs.put(job)

    def on_worker(self, fn: Callable[[], Any]) -> Any:
        """Run `fn` on the worker thread between steps; its result, or its error raised."""
        done: queue.Queue[Any] = queue.Queue()
        self.enqueue(Job(Request(SamplingParams()), None, done.put, call=fn))
        result = done.get()  # the result, or the error the call (or the engine) ended with
        if isinstance(result, BaseException):
            raise result
        done.get()  # END
        return result

    def post(self, fn: Callable[[], None]) -> None:
        """Run `fn` on the worker between steps; nobody waits for it (a stopped worker
        runs nothing more: then it runs here)."""
        if self.dead is not None or not self.thread.is_alive():
            fn()
            return
        self._jobs.put(_Post(fn))

    def close(self) -> None:
        self._jobs.put(None)
        self.thread.join(timeout=30)

    # -- the thread ----------------------------------------------------------------
    def _run(self) -> None:
        pause = CollectionPause()
        try:
            while self._turn(pause):
                pass
        except BaseException as exc:  # a bug: say so everywhere rather than hang
            log.exception("the engine's worker stopped")
            self.dead = f"{type(exc).__name__}: {exc}"
            self._fail_queued()
            self.publish()
        finally:
            pause.release()
            rs = self.residency
            for res in list(rs.resident.values()):
                with logged("unloading " + res.ref.name):
                    rs.unload(res)  # saves each live state to disk for the next start
            rs.speculation.close()
            self._tokenizers.shutdown(wait=False, cancel_futures=True)

    def _turn(self, pause: CollectionPause) -> bool:
        """One pass of the worker: take waiting jobs, or step every busy model once.
        False when asked to stop."""
        resident = self.residency.resident
        busy = [r for r in list(resident.values()) if r.scheduler.busy]
        self.cache.quiet(not busy)
        try:
            # with requests running, only look for new ones; idle, unload what has
            # expired and sleep until a job comes or the next model expires
            item = self._jobs.get_nowait() if busy else self._jobs.get(timeout=self._idle_wait())
        except queue.Empty:
            item = _NO_JOB
        if item is None:
            return False
        if isinstance(item, _Post):
            with logged("a posted call"):
                item.fn()
            return True
        if isinstance(item, _Tokenized):
            self._tokenized(item)
            self.publish()
            return True
        if item is not _NO_JOB:
            try:
                self._accept(item)
            except BaseException as exc:  # the worker is going down: this job hears why
                with logged("ending the job in hand"):
                    item.end(LocalLLMError(f"the engine stopped: {type(exc).__name__}: {exc}"))
                raise
            self.publish()
            return True  # take every job that is waiting before the next step
        pause.hold()  # while any model decodes (see CollectionPause)
        for res in busy:
            self._step(res)
        still = any(r.scheduler.busy for r in resident.values())
        if not still:
            pause.release()  # before the last request hears it has ended
        self._publish_after_step(busy, idle=not still)
        for res in busy:
            res.scheduler.flush()
        return True

    def _publish_after_step(self, stepped: list[Resident], *, idle: bool) -> None:
        """A new status when a request started or ended (before the ended ones hear so:
        they see themselves counted), when the worker is about to wait, and otherwise at
        most every STATUS_INTERVAL_S: a reader sees tokens counted that recently."""
        changes = sum(r.scheduler.changes for r in self.residency.resident.values())
        now = time.monotonic()
        if (
            idle
            or now >= self._status_due
            or changes != self._status_changes
            or any(r.scheduler.ending for r in stepped)
        ):
            self.publish()
            self._status_due = now + STATUS_INTERVAL_S
            self._status_changes = changes

    def _idle_wait(self) -> float:
        """Seconds to sleep while idle: until the next keep-alive expiry, at most an hour
        (a keep-alive is bounded where it is set; this bound keeps the wait a valid timeout
        whatever it is)."""
        try:
            soonest = self.residency.expire()
        except Exception:
            log.exception("unloading idle models failed")
            return IDLE_WAIT_MAX_S
        wait = IDLE_WAIT_MAX_S if soonest is None else min(max(soonest, 0.0), IDLE_WAIT_MAX_S)
        if any(res.scheduler.paused for res in self.residency.resident.values()):
            wait = min(wait, PAUSED_LOOK_S)  # a paused reader may have caught up
        return wait

    def _fail_queued(self) -> None:
        error = LocalLLMError(f"the engine stopped: {self.dead}; restart localllm")
        for res in list(self.residency.resident.values()):
            with logged("ending the requests of " + res.ref.name):
                res.scheduler.cancel_all(error)
        while True:
            try:
                item = self._jobs.get_nowait()
            except queue.Empty:
                return
            job = item.job if isinstance(item, _Tokenized) else item
            if isinstance(job, Job):
                with logged("ending a queued request"):
                    job.on_end = job.on_end or functools.partial(self._ended, job)
                    job.end(error)

    def _accept(self, job: Job) -> None:
        """A new job: a call or a load now, or a request handed to its model's scheduler."""
        job.on_end = functools.partial(self._ended, job)
        rs = self.residency
        try:
            if job.call is not None:
                job.emit(job.call())
                job.end()
                return
            if job.load_only:
                assert job.ref is not None
                rs.ensure_loaded(job.ref, job.progress, job.n_ctx, job.backend, default=True)
                job.end()
                return
            request = job.request
            if job.ref is None:  # resolved here: the models folder is never read on a loop
                job.ref = rs.resolve(request)
            default = rs.default
            ref = job.ref or (default.ref if default else rs.store.resolve(self.settings.model))
            if job.cancel.is_set():  # abandoned while it waited: end it the usual way
                end_unstarted(job, ref.name)
                job.end()
                return
            res = rs.ensure_loaded(
                ref, default=default is None and job.ref is None, keep_alive=request.keep_alive
            )
            if request.min_ctx is not None:
                path = res.ref.path
                try:
                    res = rs.grow_context(res, request.min_ctx)
                except GrowthFailed:
                    res = rs.resident[path]  # served at the context it has
            job.ref = res.ref
            job.request = dataclasses.replace(
                request,
                deterministic=self.life.deterministic(request),
                params=dataclasses.replace(
                    request.params.with_defaults(res.sampling.values),
                    end_markers=end_markers(request, res.model.info.chat_template),
                ),
            )
            self._schedule(job, res)
        except LocalLLMError as exc:
            job.end(exc)
        except Exception as exc:  # never let the worker die; the caller gets a typed error
            log.exception("request failed")
            job.end(LocalLLMError(f"internal error: {exc}"))

    def _schedule(self, job: Job, res: Resident) -> None:
        """Give the job its place in line on `res`, kept while its prompt is read."""
        res.requests += 1
        res.scheduler.add(job)
        if job.prompt is None:
            res.tokenizing += 1
            self._tokenizers.submit(self._tokenize, job, res)

    def _tokenize(self, job: Job, res: Resident) -> None:
        """On a tokenizer thread: the job's prompt tokens, handed back to the worker."""
        if job.cancel.is_set():  # abandoned while it waited: it costs no tokenizer time
            self._jobs.put(_Tokenized(job, res, None, None))  # (_tokenized drops it)
            return
        try:
            request, info = job.request, res.model.info
            if request.prompt_tokens is not None:
                check_token_ids(info, request.prompt_tokens)
            request, fmt = with_tool_grammar(res.model, request)
            prompt = fit_prompt(res.model, request)
            self._jobs.put(_Tokenized(job, res, prompt, None, request, fmt))
        except BaseException as exc:
            self._jobs.put(_Tokenized(job, res, None, exc))

    def _tokenized(self, item: _Tokenized) -> None:
        job, res = item.job, item.res
        res.tokenizing -= 1
        waiting = res.scheduler.waiting
        if job not in waiting or job.cancel.is_set():
            return  # ended meanwhile (its model went away), or the scheduler ends it next
        error = item.error
        if error is None:
            if item.request is not None:
                job.request = item.request
            job.tool_format = item.tool_format
            job.prompt = item.prompt  # ready: the scheduler starts it in its turn
            return
        waiting.remove(job)
        if isinstance(error, ContextOverflow) and self._regrow(job, res, error):
            return
        if isinstance(error, LocalLLMError):
            job.end(error)
        else:
            log.error("tokenizing a prompt failed", exc_info=error)
            job.end(LocalLLMError(f"internal error: {error}"))

    def _regrow(self, job: Job, res: Resident, error: ContextOverflow) -> bool:
        """A prompt longer than the loaded context but within the trained one: the idle
        model is reloaded with a context that holds it and its answer (a power of two, at
        most the trained context) when memory allows, and the prompt read again. False
        when it cannot be: the request then gets the 400 with both numbers."""
        trained = res.model.info.n_ctx_train
        want = error.prompt_tokens + (job.request.params.max_tokens or 1) + 1
        if self.settings.n_ctx is not None or not trained or error.prompt_tokens >= trained:
            return False  # a context the user set is kept
        size = min(1 << (want - 1).bit_length(), trained)
        try:
            grown = self.residency.grow_context(res, size)
        except LocalLLMError as exc:  # neither size could be loaded: this request hears why
            job.end(exc)
            return True
        if grown is res:
            return False
        job.ref = grown.ref
        self._schedule(job, grown)
        return True

    def _ended(self, job: Job) -> None:
        self.life.settle(job)  # what it held of its key's quota
        with self._lock:
            self._outstanding -= 1

    def _step(self, res: Resident) -> None:
        try:
            res.scheduler.step()
        except Exception as exc:  # a bug, not the client's: end its requests, keep serving
            log.exception("a batched step failed")
            res.scheduler.cancel_all(LocalLLMError(f"internal error: {exc}"))
        res.last_used = time.monotonic()


_NO_JOB: Any = object()
