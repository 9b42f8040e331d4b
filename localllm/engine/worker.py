"""One thread owns the loaded models; clients submit requests and read chunks.

`Engine.submit()` returns a `ChunkStream` (an async iterator) for the event loop;
`Engine.generate()` is the same for synchronous callers such as the CLI. Each
loaded model runs its requests together in a `Scheduler` (engine/scheduler.py):
up to `parallel` of them decode in one batch per step, the rest wait, up to
`max_queue` outstanding; past that, `ServerBusy`. Closing a stream sets its cancel
flag, which the scheduler reads every step. A request naming another local model
loads it beside the default one (see `Engine`).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import gc
import json
import logging
import math
import queue
import threading
import time
from collections.abc import Callable, Generator, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from localllm.backends import reasoning, tools
from localllm.backends.base import (
    CPU_F16,
    Backend,
    Chunk,
    LoadedModel,
    LoadOptions,
    MemoryProfile,
    Message,
    ModelInfo,
    ModelRef,
    SamplingParams,
)
from localllm.backends.common import check_request
from localllm.backends.tools import ToolSpec
from localllm.config import DEFAULT_PARALLEL, Settings
from localllm.engine import grammar, placement, remote_route
from localllm.engine.client import EngineStatus, LoadedRow, Observer, State, _frozen
from localllm.engine.placement import Plan, plan, prepare
from localllm.engine.prompt_cache import PromptCache, default_ram_budget, model_key
from localllm.engine.scheduler import Admission, Running, Scheduler, end_unstarted
from localllm.engine.speculative import Speculation, configured_draft
from localllm.engine.stream import END, ChunkStream, Started, chunks_of
from localllm.errors import (
    BackendUnavailable,
    ContextOverflow,
    FimUnsupported,
    ImportFailed,
    InvalidRequest,
    LocalLLMError,
    ModelLoadError,
    ModelTooLarge,
)
from localllm.models import fit
from localllm.models.sampling import Recommended, recommended
from localllm.models.store import ModelStore, looks_like_path

log = logging.getLogger(__name__)
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Infill:
    """A repo-level fill-in-the-middle prompt (llama-server's /infill)."""

    prefix: str
    suffix: str
    extra: tuple[tuple[str, str], ...] = ()  # (filename, text) chunks, oldest first
    typed: str = ""  # the text typed so far on the cursor's line: after the middle marker


@dataclass(frozen=True, slots=True)
class Request:
    """What to generate. Exactly one of messages / prompt / prompt_tokens is set."""

    params: SamplingParams
    messages: Sequence[Message] | None = None
    prompt: str | None = None
    suffix: str | None = None  # with prompt: fill in the middle
    prompt_tokens: Sequence[int] | None = None
    model: str | None = None  # None: whatever is loaded
    # a chat longer than the context: "error" (ContextOverflow) or "truncate-oldest"
    context_policy: str = "error"
    # seconds an on-demand model stays loaded after this request (None: the setting's)
    keep_alive: float | None = None
    speculate: str | None = None  # off | lookup | draft | auto; None: the setting's
    draft_model: str | None = None  # None: the setting's
    priority: str | None = None  # "high": ahead of others (see scheduler.py); None: normal
    deterministic: bool | None = None  # runs alone, exact prefixes only; None: the setting's
    client: str = "local"  # who asked, for usage accounting: a key's name, "chat", ...
    request_id: str | None = None  # the endpoint's id for the request (access log, metrics)
    allow_paths: bool = True  # may `model` be a file or folder path (API: a setting)
    tools: ToolSpec | None = None  # functions the model may call, and the caller's choice
    template_vars: Mapping[str, Any] | None = None  # chat_template_kwargs (enable_thinking)
    # the context the caller wants (Ollama's num_ctx): an idle model loaded with less is
    # reloaded with more, up to its trained context, when memory allows
    min_ctx: int | None = None
    infill: Infill | None = None  # a repo-level FIM prompt instead of messages or prompt
    # the wire's response_format (with params.grammar): what a remote engine is sent
    response_format: Mapping[str, Any] | None = None


@dataclass(slots=True)
class _Job:
    request: Request
    ref: ModelRef | None
    emit: Callable[[Any], None]
    cancel: threading.Event = field(default_factory=threading.Event)
    load_only: bool = False  # load (or swap to) ref, generate nothing
    call: Callable[[], Any] | None = None  # run this on the worker; its result is emitted
    progress: Callable[[float], None] | None = None
    n_ctx: int | None = None  # with load_only: the context size to load with
    backend: str | None = None  # with load_only: auto | llamacpp | mlx (None: as before)
    on_end: Callable[[], None] | None = None  # told once, when the job ends
    arrival: int = 0  # order of arrival at its model's scheduler
    submitted: float = field(default_factory=time.monotonic)
    prompt: tuple[list[int], int, int] | None = None  # fit_prompt's answer, once tokenized
    tool_format: str | None = None  # with tools: how the model writes calls

    @property
    def ready(self) -> bool:
        """Its prompt is tokenized: the scheduler may start it."""
        return self.prompt is not None

    def end(self, item: Any = END) -> None:
        """The job's last item: END, or the error it failed with."""
        self.emit(item)
        if self.on_end is not None:
            self.on_end()
            self.on_end = None


@dataclass(slots=True)
class Resident:
    """A loaded model and what the engine knows about it."""

    ref: ModelRef
    model: LoadedModel
    loaded_with: str  # the backend preference it loaded with: auto | llamacpp | mlx
    cache_key: str  # its prompt-cache identity
    need: int  # the estimated bytes it takes
    kv_bytes: int  # of which the KV cache of its n_seq sequences
    keep_alive: float | None  # idle seconds before it unloads; None: never
    scheduler: Scheduler = field(init=False)
    draft_for: str | None = None  # a draft model: the model it drafts for
    last_used: float = field(default_factory=time.monotonic)
    requests: int = 0
    tokenizing: int = 0  # its requests whose prompts the tokenizer threads are reading
    # what its makers recommend: a request's unset sampling fields take these
    sampling: Recommended = field(default_factory=Recommended)
    profile: MemoryProfile = CPU_F16  # how its backend holds it

    def time_left(self, now: float) -> float | None:
        """Seconds until the keep-alive runs out (negative: it has); None: it never does."""
        return None if self.keep_alive is None else self.keep_alive - (now - self.last_used)


@dataclass(frozen=True, slots=True)
class _Tokenized:
    """A tokenizer thread's answer for a job: its prompt, or the error it gives."""

    job: _Job
    res: Resident
    prompt: tuple[list[int], int, int] | None
    error: BaseException | None
    request: Request | None = None  # the request with its tool grammar, when it has one
    tool_format: str | None = None


class Engine:
    """Owns the worker thread and the loaded models; its clients see it as an
    `EngineClient` (engine/client.py).

    One model is the default (the one loaded with `load()`: what the chat and requests
    without a model use); it stays until another replaces it. A request naming
    another local model loads it on demand beside the default; such a model unloads
    after `keep_alive_s` idle seconds, or sooner to make room: at most
    `max_loaded_models` stay loaded, and a load that would not fit in free memory (or
    `memory_budget_mb`) first unloads the least recently used others, then is refused
    with the numbers unless `force_load` is set.
    """

    def __init__(
        self,
        settings: Settings,
        store: ModelStore | None = None,
        *,
        backends: Sequence[Backend] | None = None,
    ) -> None:
        """`backends`: the backends models load with, the first that takes a model (tests
        give backends/fake.py's); None: the engine's placement chooses (engine/placement.py)."""
        self.settings = settings
        self.store = store or ModelStore.from_settings(settings)
        self._backends = None if backends is None else tuple(backends)
        self.last_error: str | None = None  # the last failed load's message
        self.dead: str | None = None  # set if the worker thread ever stops unasked
        self._loading = False
        self._resident: dict[Path, Resident] = {}
        self._default: Resident | None = None
        self.cache = PromptCache(
            settings.prompt_cache_ram_mb * 1024 * 1024
            if settings.prompt_cache_ram_mb is not None
            else default_ram_budget(),
            settings.cache_dir / "kv" if settings.prompt_cache_disk_mb > 0 else None,
            settings.prompt_cache_disk_mb * 1024 * 1024,
        )
        self.remotes = remote_route.Remotes(settings)
        self.speculation = Speculation(
            settings, self.store, load_draft=self._load_draft, unload_draft=self._unload_draft
        )
        self._backend = settings.backend  # the preference models load with
        self._jobs: queue.Queue[_Job | _Tokenized | None] = queue.Queue()
        self._outstanding = 0
        self._lock = threading.Lock()
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
        self._status = EngineStatus(backend_preference=settings.backend)
        # prompts are rendered and tokenized here, not on the worker: a long or hostile
        # prompt delays only the requests behind it, never the streams that are decoding
        self._tokenizers = ThreadPoolExecutor(2, thread_name_prefix="localllm-tokenize")
        self._thread = threading.Thread(target=self._run, name="localllm-engine", daemon=True)
        self._thread.start()

    # -- information -------------------------------------------------------------
    def _state(self) -> State:
        """ready while a default model serves (a failed on-demand load does not change
        that); error when the worker died or the only load failed; else loading or idle
        (status() also says error once the worker thread is gone)."""
        if self.dead is not None:
            return "error"
        if self._default is not None:
            return "ready"
        if self._loading:
            return "loading"
        return "error" if self.last_error else "idle"

    def resident(self) -> list[dict[str, Any]]:
        """The loaded models, default first, as of the worker's last step."""
        return self.status().resident()

    def status(self) -> EngineStatus:
        """The snapshot the worker published after its last step, with the requests
        outstanding counted now (any thread)."""
        status = dataclasses.replace(self._status, queued=self._outstanding)
        if status.state != "error" and not self._thread.is_alive():
            return dataclasses.replace(status, state="error")
        return status

    def _publish(self) -> None:
        """On the worker: a new status snapshot, after each step and each load or unload."""
        default = self._default
        rows = []
        for res in sorted(list(self._resident.values()), key=lambda r: r is not default):
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
                )
            )
        self._status = EngineStatus(
            state=self._state(),
            model_info=default.model.info if default is not None else None,
            model_ref=default.ref if default is not None else None,
            sampling=default.sampling if default is not None else Recommended(),
            backend_preference=self._backend,
            queued=self._outstanding,
            loaded=tuple(rows),
            activity=_frozen(self.activity()),
            totals=_frozen(self.totals),
            prompt_cache=_frozen(self.cache.stats()),
            dead=self.dead,
            last_error=self.last_error,
        )

    def models(self) -> list[ModelRef]:
        """The models on this machine (reads the models folder)."""
        return self.store.models()

    def resolve(self, name: str, *, paths: bool = True) -> ModelRef:
        """A model name (or, with `paths`, a file or folder) as the store finds it."""
        return self.store.resolve(name, paths=paths)

    def remove(self, ref: ModelRef) -> None:
        """Delete a local model's files."""
        self.store.remove(ref)

    def observe(self, observer: Observer) -> Callable[[], None]:
        """Tell `observer` of each finished request; returns the call that stops it."""
        self.observers.append(observer)

        def stop() -> None:
            with contextlib.suppress(ValueError):
                self.observers.remove(observer)

        return stop

    # -- loading -----------------------------------------------------------------
    def load(
        self,
        model: str | ModelRef | None,
        *,
        progress: Callable[[float], None] | None = None,
        n_ctx: int | None = None,
        backend: str | None = None,
    ) -> ModelInfo:
        """Make a model (a reference, or a name to resolve) the default, loading it now,
        blocking; n_ctx and backend (auto | llamacpp | mlx) override the settings. The
        previous default stays loaded as an on-demand model while it is within limits."""
        ref = (
            model
            if isinstance(model, ModelRef)
            else self.store.resolve(model or self.settings.model)
        )
        done: queue.Queue[Any] = queue.Queue()
        job = _Job(
            Request(SamplingParams()),
            ref,
            done.put,
            load_only=True,
            progress=progress,
            n_ctx=n_ctx,
            backend=backend,
        )
        self._enqueue(job)
        item = done.get()
        if isinstance(item, BaseException):
            raise item
        assert self._default is not None
        return self._default.model.info

    def _on_worker(self, fn: Callable[[], Any]) -> Any:
        """Run `fn` on the worker thread between steps; its result, or its error raised."""
        done: queue.Queue[Any] = queue.Queue()
        self._enqueue(_Job(Request(SamplingParams()), None, done.put, call=fn))
        result = done.get()  # the result, or the error the call (or the engine) ended with
        if isinstance(result, BaseException):
            raise result
        done.get()  # END
        return result

    def preload(
        self,
        model: str,
        *,
        n_ctx: int | None = None,
        keep_alive: float | None = None,
        allow_paths: bool = True,
    ) -> dict[str, Any]:
        """Load a model beside the default (or reload it at another context) and set how long
        it stays idle before it unloads (negative: for good); its /health row."""

        def load() -> dict[str, Any]:
            ref = self._resolve(Request(SamplingParams(), model=model, allow_paths=allow_paths))
            assert ref is not None
            if n_ctx is not None:
                trained = fit.trained_context(ref)
                if trained and n_ctx > trained:
                    raise InvalidRequest(
                        f"n_ctx {n_ctx} is more than the {trained} tokens {ref.name} "
                        "was trained for",
                        param="n_ctx",
                    )
            default = self._default is not None and self._default.ref.path == ref.path
            res = self._ensure_loaded(ref, n_ctx=n_ctx, keep_alive=keep_alive, default=default)
            return next(r for r in self.resident() if r["model"] == res.ref.name)

        row: dict[str, Any] = self._on_worker(load)
        return row

    def unload(self, model: str | None) -> list[str]:
        """Unload a model by name (None: every model, the default too); the names unloaded.
        Its running requests end with an error saying so."""

        def drop() -> list[str]:
            gone = []
            for res in list(self._resident.values()):
                if res.draft_for is not None:
                    continue  # goes with its target
                if model is None or model in (res.ref.name, str(res.ref.path)):
                    gone.append(res.ref.name)
                    self._unload(res)
            return gone

        names: list[str] = self._on_worker(drop)
        return names

    def _ensure_loaded(
        self,
        ref: ModelRef,
        progress: Callable[[float], None] | None = None,
        n_ctx: int | None = None,
        backend: str | None = None,
        *,
        default: bool = False,
        keep_alive: float | None = None,
    ) -> Resident:
        """The resident model for `ref`, loading it if needed; it becomes the model the
        prompt cache serves."""
        if backend is not None:
            self._backend = backend
        res = self._resident.get(ref.path)
        if res is not None and (
            res.loaded_with != self._backend or n_ctx not in (None, res.model.info.n_ctx)
        ):
            self._unload(res)
            res = None
        if res is None:
            res = self._load(ref, progress, n_ctx)
        if default and self._default is not res:
            old, self._default = self._default, res
            if old is not None:
                old.keep_alive = self._keep_alive(None)
                old.last_used = time.monotonic()
        if keep_alive is not None and res is not self._default:
            res.keep_alive = self._keep_alive(keep_alive)
        res.last_used = time.monotonic()
        self.cache.attach(res.model, res.cache_key)
        self._publish()
        return res

    def _regrow(self, job: _Job, res: Resident, error: ContextOverflow) -> bool:
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
            grown = self._grow_context(res, size)
        except LocalLLMError as exc:  # neither size could be loaded: this request hears why
            job.end(exc)
            return True
        if grown is res:
            return False
        job.ref = grown.ref
        grown.requests += 1
        grown.scheduler.add(job)
        grown.tokenizing += 1
        self._tokenizers.submit(self._tokenize, job, grown)
        return True

    def _grow_context(self, res: Resident, want: int) -> Resident:
        """The model reloaded with a context of `want` tokens (at most its trained context)
        when it has less, nothing is running on it, and the larger KV fits in what is free
        plus what it holds now; otherwise it serves as it is (a prompt too long for it is
        then refused with both numbers)."""
        info = res.model.info
        want = min(want, info.n_ctx_train or want)
        if want <= info.n_ctx or res.scheduler.active or res.scheduler.waiting or res.tokenizing:
            return res
        need = self._estimate(res.ref, want, res.profile).with_seq(res.model.n_seq)
        free = self._free(res.profile)
        room = fit.Free(free.bytes + res.need, free.where)
        if not fit.fits(need, room):
            log.info(
                "%s: a %d-token context does not fit (%s; %s); staying at %d",
                res.ref.name,
                want,
                need.text(),
                room.text(),
                info.n_ctx,
            )
            return res
        log.info("%s: reloading with a %d-token context (was %d)", res.ref.name, want, info.n_ctx)
        default = res is self._default
        try:
            return self._ensure_loaded(res.ref, n_ctx=want, default=default)
        except LocalLLMError as exc:  # the estimate was wrong: back to the size it had
            log.warning("%s: could not reload with %d tokens (%s)", res.ref.name, want, exc)
            self._ensure_loaded(res.ref, n_ctx=info.n_ctx, default=default)
            raise _GrowthFailed(
                f"{res.ref.name} could not be reloaded with a {want}-token context "
                f"({exc.public_message}); it stays at {info.n_ctx} tokens"
            ) from None

    def with_model(
        self,
        model: str | None,
        fn: Callable[[LoadedModel], T],
        *,
        allow_paths: bool = True,
        keep_alive: float | None = None,
    ) -> T:
        """fn(the loaded model), run on the worker (the model loaded first; None: the
        default model), for a tokenizer call or a model's properties (any thread but the
        worker's). Its errors reach the caller."""

        def call() -> T:
            ref = self._resolve(Request(SamplingParams(), model=model, allow_paths=allow_paths))
            default = self._default
            chosen = ref or (default.ref if default else self.store.resolve(self.settings.model))
            res = self._ensure_loaded(
                chosen, default=default is None and ref is None, keep_alive=keep_alive
            )
            return fn(res.model)

        return self._on_worker(call)

    def prompt_tokens(self, request: Request) -> list[int]:
        """The prompt a request would run with (its model loaded first), without running
        it: for token counts (any thread but the worker's)."""

        def render(model: LoadedModel) -> list[int]:
            return fit_prompt(model, with_tool_grammar(model, request)[0])[0]

        tokens: list[int] = self.with_model(request.model, render, allow_paths=request.allow_paths)
        return tokens

    def _keep_alive(self, seconds: float | None) -> float | None:
        """A keep-alive in seconds (the setting's when None); negative: forever. Not a
        number or infinite counts as forever too (the wire and the config refuse those
        first)."""
        value = self.settings.keep_alive_s if seconds is None else seconds
        if value < 0 or not math.isfinite(value):
            return None
        return float(value)

    def _load(
        self, ref: ModelRef, progress: Callable[[float], None] | None, n_ctx: int | None
    ) -> Resident:
        profile = self._profile(ref, n_ctx)
        n = n_ctx or self.settings.n_ctx or self._default_context(ref, profile) or None
        need = self._with_parallel(self._estimate(ref, n, profile), profile)
        self._make_room(need, profile)
        self._loading = True
        self._publish()
        options = LoadOptions(
            n_ctx=n,
            n_threads=self.settings.n_threads,
            n_gpu_layers=self.settings.n_gpu_layers,
            progress=progress,
            n_seq=need.n_seq,
        )
        try:
            model, reason, target = self._load_with_backend(ref, options)
        except LocalLLMError as exc:
            self.last_error = exc.public_message  # /health is open to any local client
            raise
        except Exception as exc:  # a native library failing in an unexpected way
            error = ModelLoadError(str(ref.path), str(exc))
            self.last_error = error.public_message
            raise error from exc
        finally:
            self._loading = False
            self._publish()
        extra = {**model.info.extra, "backend_reason": reason}
        model.info = dataclasses.replace(model.info, id=ref.name, extra=extra)
        key = model_key(target, model, profile.kv_dtype)
        res = Resident(ref, model, self._backend, key, need.total, need.kv, self._keep_alive(None))
        res.profile = profile
        res.sampling = recommended(ref)
        res.scheduler = self._scheduler(res)
        self._resident[ref.path] = res
        self.totals["loads"] += 1
        self.last_error = None
        log.info(
            "loaded %s on %s (%s): %s; needs %s",
            ref.name,
            model.info.backend,
            model.info.device,
            reason,
            need.text(),
        )
        return res

    def _profile(self, ref: ModelRef, n_ctx: int | None) -> MemoryProfile:
        """How the backend that would load `ref` holds it (its KV dtype, GPU or not)."""
        if self._backends is not None:
            try:
                return self._given_backend(ref).memory_profile(ref, n_ctx)
            except BackendUnavailable:
                return CPU_F16  # the load says why
        return placement.memory_profile(ref, self._backend, self.settings.models_dir, n_ctx)

    def _given_backend(self, ref: ModelRef) -> Backend:
        """Of the backends the engine was given, the first that loads `ref` (and is the
        preferred one, unless that is auto)."""
        assert self._backends is not None
        for backend in self._backends:
            if self._backend in ("auto", backend.name) and backend.can_load(ref):
                return backend
        names = ", ".join(b.name for b in self._backends) or "none"
        raise BackendUnavailable(
            self._backend, f"none of this engine's backends ({names}) loads {ref.name}"
        )

    def _default_context(self, ref: ModelRef, profile: MemoryProfile) -> int:
        """The trained context, capped by what fits beside the model (see fit)."""
        n_seq = self.settings.parallel or DEFAULT_PARALLEL
        return fit.default_context(ref, self._room(profile), n_seq, kv_scale=profile.kv_scale)

    def _estimate(self, ref: ModelRef, n_ctx: int | None, profile: MemoryProfile) -> fit.Estimate:
        scale = profile.kv_scale
        draft = configured_draft(self.settings, self.store)
        return fit.estimate(ref, n_ctx, kv_scale=scale).with_draft(
            draft, target=ref, kv_scale=scale
        )

    def _with_parallel(self, need: fit.Estimate, profile: MemoryProfile) -> fit.Estimate:
        """The estimate with its KV for `parallel` sequences. Unset, that is 4, or fewer
        when memory says so; set, a value that does not fit is refused (unless forced),
        naming the value that does."""
        s = self.settings
        want = need.with_seq(s.parallel or DEFAULT_PARALLEL)
        room = self._room(profile)
        if s.force_load or fit.fits(want, room):
            return want
        fitting = want.max_seq(room.bytes)
        if s.parallel is None or fitting == 0:
            if fitting:
                log.info("%s: %d parallel sequences fit in memory, not 4", need.name, fitting)
            return need.with_seq(max(fitting, 1))  # none fits: _make_room says so
        raise ModelTooLarge(
            need.name,
            want.text(),
            want.total,
            room.text(),
            room.bytes,
            f"--parallel {fitting} (needs {fit.format_bytes(need.with_seq(fitting).total)})",
        )

    def _room(self, profile: MemoryProfile) -> fit.Free:
        """The memory a load may take: what is free and what loaded models hold, within
        memory_budget_mb."""
        s = self.settings
        free = self._free(profile)
        room = fit.Free(free.bytes + sum(r.need for r in self._resident.values()), free.where)
        budget = s.memory_budget_mb * 1024 * 1024 if s.memory_budget_mb is not None else None
        if budget is not None and budget < room.bytes:
            room = fit.Free(budget, "of memory_budget_mb")
        return room

    def _free(self, profile: MemoryProfile) -> fit.Free:
        offload = self.settings.n_gpu_layers != 0 and profile.gpu_offload
        return fit.free_memory(gpu_offload=offload)

    def _make_room(
        self, need: fit.Estimate, profile: MemoryProfile, *, keep: Path | None = None
    ) -> None:
        """Refuse (unless forced) a load that would not fit even with every other model
        unloaded; otherwise unload least recently used models (the default last) until it
        fits beside the rest, within max_loaded_models and memory."""
        s = self.settings
        budget = s.memory_budget_mb * 1024 * 1024 if s.memory_budget_mb is not None else None
        free = self._free(profile)
        held = sum(r.need for r in self._resident.values())
        room = self._room(profile)
        if not fit.fits(need, room):
            if not s.force_load:
                raise fit.refusal(need, room)
            log.warning(
                "loading %s anyway (force_load): needs %s, %s", need.name, need.text(), room.text()
            )
        # a draft model goes with its target; a model being served stays
        idle = [
            r
            for r in self._resident.values()
            if not r.scheduler.busy and r.draft_for is None and r.ref.path != keep
        ]
        order = sorted(idle, key=lambda r: (r is self._default, r.last_used))
        kept = held  # what the models still loaded take

        def short() -> bool:
            over_budget = budget is not None and need.total + kept > budget
            return over_budget or need.total > free.bytes + (held - kept)

        while order and (len(self._resident) >= s.max_loaded_models or short()):
            res = order.pop(0)
            kept -= res.need
            self._unload(res)

    def _unload(self, res: Resident) -> None:
        if res not in self._resident.values():
            return  # a draft model, gone with its target already
        log.info("unloading %s", res.ref.name)
        try:
            self.cache.release(res.cache_key)
        except Exception:
            log.exception("could not save %s's live KV state", res.ref.name)
        self.totals["unloads"] += 1  # first: a reader that sees it gone sees it counted
        for key, value in list(self._resident.items()):
            if value is res:
                del self._resident[key]
        if self._default is res:
            self._default = None
        self.speculation.release(res.ref)
        res.scheduler.cancel_all(LocalLLMError(f"the model {res.ref.name} was unloaded"))
        res.model.close()
        self._publish()

    def _expire(self) -> float | None:
        """Unload on-demand models idle past their keep-alive; seconds until the next expiry."""
        now = time.monotonic()
        soonest: float | None = None
        for res in list(self._resident.values()):
            left = res.time_left(now)
            if res is self._default or left is None or res.scheduler.busy or res.tokenizing:
                continue
            if left <= 0:
                log.info("%s idle for %.0f s: unloading", res.ref.name, now - res.last_used)
                self._unload(res)
            elif soonest is None or left < soonest:
                soonest = left
        return soonest

    def _load_draft(self, target_ref: ModelRef, ref: ModelRef, target: LoadedModel) -> LoadedModel:
        """Load a draft model for `target`, on its backend and at its context, one sequence:
        checked against memory like any load and listed among the loaded models (it goes
        when its target goes)."""
        from localllm.errors import InvalidRequest

        backend = target.info.backend  # the draft runs where the target runs
        # and is held as its target is held
        profile = next(r.profile for r in self._resident.values() if r.model is target)
        need = fit.estimate(ref, target.info.n_ctx, kv_scale=profile.kv_scale)
        self._make_room(need, profile, keep=target_ref.path)
        models_dir = self.settings.models_dir
        try:
            if self._backends is not None:
                loader, loadable = self._given_backend(ref), ref
            else:
                loader, loadable = prepare(ref, plan(ref, backend, models_dir), models_dir)
        except BackendUnavailable as exc:
            raise InvalidRequest(
                f"the draft model {ref.name} cannot run on {backend} beside "
                f"{target_ref.name}: {exc.hint}",
                param="draft_model",
            ) from None
        options = LoadOptions(n_ctx=target.info.n_ctx, n_threads=self.settings.n_threads)
        model = loader.load(loadable, options)
        res = Resident(ref, model, backend, "", need.total, need.kv, None, profile=profile)
        res.scheduler = self._scheduler(res)  # it serves no requests of its own
        res.draft_for = target_ref.name
        self._resident[Path(f"{ref.path}#draft-for:{target_ref.path}")] = res
        self.totals["loads"] += 1
        log.info("loaded %s as the draft model for %s", ref.name, target_ref.name)
        return model

    def _unload_draft(self, model: LoadedModel) -> None:
        for res in list(self._resident.values()):
            if res.model is model:
                self._unload(res)
                return
        model.close()  # not listed (it failed its checks before it was)

    def _load_with_backend(
        self, ref: ModelRef, options: LoadOptions
    ) -> tuple[LoadedModel, str, ModelRef]:
        """Plan the backend, import a GGUF for MLX when the plan says so, load; with `auto`,
        a GGUF whose import fails runs on llama.cpp instead. An engine given its backends
        loads with the first of them that takes the model."""
        if self._backends is not None:
            given = self._given_backend(ref)
            return given.load(ref, options), f"given: {given.name}", ref
        models_dir = self.settings.models_dir
        chosen = plan(ref, self._backend, models_dir)
        try:
            backend, target = prepare(ref, chosen, models_dir, options.progress)
        except ImportFailed as exc:
            if self._backend != "auto":
                raise
            log.warning("MLX import of %s failed, using llama.cpp: %s", ref.name, exc.reason)
            chosen = Plan("llamacpp", f"auto: the MLX import failed ({exc.reason})")
            backend, target = prepare(ref, chosen, models_dir)
        reason = chosen.reason
        if target != ref:
            reason += f"; MLX import {target.name}"
        return backend.load(target, options), reason, target

    # -- submitting ----------------------------------------------------------------
    def _resolve(self, request: Request) -> ModelRef | None:
        if request.model is None:
            return None
        if self.remotes.find(request.model) is not None:  # (requests for it never come here)
            raise InvalidRequest(
                f"{request.model} is a remote engine's model: loading, tokenizing and "
                "counting tokens are for models on this machine",
                param="model",
                code="unsupported_for_remote",
            )
        for res in list(self._resident.values()):
            if request.model in (res.ref.name, str(res.ref.path)):
                return res.ref  # a loaded model, whatever the store would make of its name
        if not request.allow_paths and looks_like_path(request.model):
            # said the same whether or not the path exists: nothing about the disk leaks
            raise InvalidRequest(
                "Model paths are not accepted over the API; name a model from "
                "`localllm list`, or set allow_model_paths = true in the server's config.",
                param="model",
                code="model_path_not_allowed",
            )
        return self.store.resolve(request.model, paths=request.allow_paths)

    def _enqueue(self, job: _Job) -> None:
        from localllm.errors import ServerBusy

        if self.dead is not None:
            raise LocalLLMError(f"the engine stopped: {self.dead}; restart localllm")
        with self._lock:
            if self._outstanding >= self.settings.max_queue:
                raise ServerBusy(self._outstanding, self.settings.max_queue)
            self._outstanding += 1
        self._jobs.put(job)

    def submit(self, request: Request) -> ChunkStream:
        """Queue a request; iterate the returned stream from the event loop. A remote
        engine's model is streamed from it on this loop (engine/remote_route.py)."""
        request = remote_route.route(self.settings.routes, request)
        remote = self.remotes.find(request.model)
        if remote is not None:
            return remote_route.submit(self, request, *remote)
        cancel = threading.Event()
        stream = ChunkStream(asyncio.get_running_loop(), cancel)
        self.submit_local(request, stream.feed, cancel)
        return stream

    def submit_local(
        self,
        request: Request,
        emit: Callable[[Any], None],
        cancel: threading.Event | None = None,
    ) -> None:
        """Queue a request for a local model; its items go to `emit` on the worker (its
        model's name is resolved there: a bad one is the first item)."""
        self._enqueue(_Job(request, None, emit, cancel or threading.Event()))

    def finished_remote(self, request: Request, model: str, final: Chunk, seconds: float) -> None:
        """A remote request's end, counted and told to the observers as a local one is."""
        stats = final.stats
        assert stats is not None
        self.totals["requests"] += 1
        self.totals["prompt_tokens"] += stats.prompt_tokens
        self.totals["generated_tokens"] += stats.generated_tokens
        for observe in self.observers:
            with _logged("a request observer"):
                observe(request, model, final, seconds)

    def backend_of(self, model: str) -> str:
        """The backend that answers `model`'s requests: remote, or the loaded model's."""
        if self.remotes.find(model) is not None:
            return "remote"
        for res in list(self._resident.values()):
            if model == res.ref.name:
                return res.model.info.backend
        return "unknown"

    def generate(
        self, request: Request, *, cancel: threading.Event | None = None
    ) -> Generator[Chunk, None, None]:
        """Synchronous twin of submit(): yields chunks; raises the request's error."""
        request = remote_route.route(self.settings.routes, request)
        remote = self.remotes.find(request.model)
        if remote is not None:
            yield from remote_route.generate(self, request, *remote, cancel or threading.Event())
            return
        out: queue.Queue[Any] = queue.Queue()
        job = _Job(request, None, out.put, cancel or threading.Event())
        self._enqueue(job)
        try:
            yield from chunks_of(out)
        finally:
            job.cancel.set()

    def close(self) -> None:
        """Stop the worker and free the model."""
        self._jobs.put(None)
        self._thread.join(timeout=30)

    # -- the worker thread ---------------------------------------------------------
    def _run(self) -> None:
        pause = CollectionPause()
        try:
            while self._turn(pause):
                pass
        except BaseException as exc:  # a bug: say so everywhere rather than hang
            log.exception("the engine's worker stopped")
            self.dead = f"{type(exc).__name__}: {exc}"
            self._fail_queued()
            self._publish()
        finally:
            pause.release()
            for res in list(self._resident.values()):
                with _logged("unloading " + res.ref.name):
                    self._unload(res)  # saves each live state to disk for the next start
            self.speculation.close()
            self._tokenizers.shutdown(wait=False, cancel_futures=True)

    def _turn(self, pause: CollectionPause) -> bool:
        """One pass of the worker: take waiting jobs, or step every busy model once.
        False when asked to stop."""
        busy = [r for r in list(self._resident.values()) if r.scheduler.busy]
        try:
            # with requests running, only look for new ones; idle, unload what has
            # expired and sleep until a job comes or the next model expires
            job = self._jobs.get_nowait() if busy else self._jobs.get(timeout=self._idle_wait())
        except queue.Empty:
            job = _NO_JOB
        if job is None:
            return False
        if isinstance(job, _Tokenized):
            self._tokenized(job)
            self._publish()
            return True
        if job is not _NO_JOB:
            try:
                self._accept(job)
            except BaseException as exc:  # the worker is going down: this job hears why
                with _logged("ending the job in hand"):
                    job.end(LocalLLMError(f"the engine stopped: {type(exc).__name__}: {exc}"))
                raise
            self._publish()
            return True  # take every job that is waiting before the next step
        pause.hold()  # while any model decodes (see CollectionPause)
        for res in busy:
            self._step(res)
        if not any(r.scheduler.busy for r in self._resident.values()):
            pause.release()  # before the last request hears it has ended
        self._publish()  # before the requests that ended hear so: they see themselves counted
        for res in busy:
            res.scheduler.flush()
        return True

    def _idle_wait(self) -> float:
        """Seconds to sleep while idle: until the next keep-alive expiry, at most an hour
        (a keep-alive is bounded where it is set; this bound keeps the wait a valid timeout
        whatever it is)."""
        try:
            soonest = self._expire()
        except Exception:
            log.exception("unloading idle models failed")
            return IDLE_WAIT_MAX_S
        return IDLE_WAIT_MAX_S if soonest is None else min(max(soonest, 0.0), IDLE_WAIT_MAX_S)

    def _fail_queued(self) -> None:
        error = LocalLLMError(f"the engine stopped: {self.dead}; restart localllm")
        for res in list(self._resident.values()):
            with _logged("ending the requests of " + res.ref.name):
                res.scheduler.cancel_all(error)
        while True:
            try:
                item = self._jobs.get_nowait()
            except queue.Empty:
                return
            job = item.job if isinstance(item, _Tokenized) else item
            if job is not None:
                with _logged("ending a queued request"):
                    job.on_end = job.on_end or self._ended
                    job.end(error)

    def _accept(self, job: _Job) -> None:
        """A new job: a load now, or a request handed to its model's scheduler."""
        job.on_end = self._ended
        try:
            if job.call is not None:
                job.emit(job.call())
                job.end()
                return
            if job.load_only:
                assert job.ref is not None
                self._ensure_loaded(job.ref, job.progress, job.n_ctx, job.backend, default=True)
                job.end()
                return
            request = job.request
            if job.ref is None:  # resolved here: the models folder is never read on a loop
                job.ref = self._resolve(request)
            default = self._default
            ref = job.ref or (default.ref if default else self.store.resolve(self.settings.model))
            if job.cancel.is_set():  # abandoned while it waited: end it the usual way
                end_unstarted(job, ref.name)
                job.end()
                return
            res = self._ensure_loaded(
                ref, default=default is None and job.ref is None, keep_alive=request.keep_alive
            )
            if request.min_ctx is not None:
                path = res.ref.path
                try:
                    res = self._grow_context(res, request.min_ctx)
                except _GrowthFailed:
                    res = self._resident[path]  # served at the context it has
            job.ref = res.ref
            job.request = dataclasses.replace(
                request,
                deterministic=self._deterministic(request),
                params=request.params.with_defaults(res.sampling.values),
            )
            res.requests += 1
            res.scheduler.add(job)  # its place in line is kept while its prompt is read
            if job.prompt is not None:
                return
            res.tokenizing += 1
            self._tokenizers.submit(self._tokenize, job, res)
        except LocalLLMError as exc:
            job.end(exc)
        except Exception as exc:  # never let the worker die; the caller gets a typed error
            log.exception("request failed")
            job.end(LocalLLMError(f"internal error: {exc}"))

    def _tokenize(self, job: _Job, res: Resident) -> None:
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

    def _ended(self) -> None:
        with self._lock:
            self._outstanding -= 1

    def _step(self, res: Resident) -> None:
        try:
            res.scheduler.step()
        except Exception as exc:  # a bug, not the client's: end its requests, keep serving
            log.exception("a batched step failed")
            res.scheduler.cancel_all(LocalLLMError(f"internal error: {exc}"))
        res.last_used = time.monotonic()

    def _scheduler(self, res: Resident) -> Scheduler:
        """The scheduler of a newly loaded model, wired to the cache and the speculation."""
        model, key = res.model, res.cache_key

        def admit(job: _Job) -> Admission:
            if job.prompt is None:  # not read ahead on a tokenizer thread
                job.request, job.tool_format = with_tool_grammar(model, job.request)
                job.prompt = fit_prompt(model, job.request)
            request = job.request
            tokens, dropped, before = job.prompt
            check_request(len(tokens), model.info.n_ctx, request.params, model.info.n_vocab)
            thinking = None
            if request.messages is not None:  # a chat: the template may think
                tail = model.detokenize(tokens[-8:])
                thinking = reasoning.mode_for(model.info.chat_template, tail)
            started = Started(
                res.ref.name, len(tokens), dropped, before, job.tool_format, reasoning=thinking
            )
            exact = bool(request.deterministic)  # the setting's when the request is silent
            params = request.params
            # a grammar or log probabilities go token by token: no drafts to verify
            plain = params.grammar is None and params.logprobs is None
            drafter = self.speculation.drafter(request, res.ref, model) if plain else None
            self.totals["requests"] += 1
            return Admission(tokens, started, drafter, exact)

        def prepare_seq(prompt: list[int], seq: int, exact: bool) -> None:
            self.cache.prepare(key, prompt, seq, exact=exact)

        def ended(job: _Job, run: Running, final: Chunk | None) -> None:
            self.speculation.finished(res.ref, run.drafter)
            res.last_used = time.monotonic()
            if final is None:
                self.cache.finished(key, run.seq, 0)
                return
            final = self.speculation.with_speedup(final, run.drafter)
            stats = final.stats
            assert stats is not None
            self.totals["prompt_tokens"] += stats.prompt_tokens
            self.totals["generated_tokens"] += stats.generated_tokens
            self.totals["cancelled"] += final.finish_reason == "cancelled"
            self.cache.finished(key, run.seq, stats.cached_tokens)
            seconds = time.monotonic() - job.submitted
            for observe in self.observers:
                with _logged("a request observer"):
                    observe(job.request, res.ref.name, final, seconds)
            if run.started is not None:
                job.emit(run.started)
            job.emit(final)

        return Scheduler(model, prepare=admit, prepare_seq=prepare_seq, on_end=ended)

    def _deterministic(self, request: Request) -> bool:
        if request.deterministic is None:
            return self.settings.deterministic
        return request.deterministic

    def activity(self) -> dict[str, Any]:
        """Running and waiting requests per loaded model, with each one's prefill progress
        (for /health, `localllm ps` and the chat's status bar; any thread)."""
        out: dict[str, Any] = {"active": 0, "queued": 0, "requests": []}
        for res in list(self._resident.values()):
            rows = res.scheduler.progress()
            out["active"] += len(rows)
            out["queued"] += len(res.scheduler.waiting)  # tokenizing ones included
            out["requests"] += [{"model": res.ref.name, **row} for row in rows]
        out["queued"] += self._jobs.qsize()
        return out


_NO_JOB: Any = object()


class _GrowthFailed(LocalLLMError):
    """A model could not be reloaded with a larger context; it is back at its old one."""

    status = 400
    error_type = "invalid_request_error"
    code = "context_length_exceeded"


IDLE_WAIT_MAX_S = 3600.0


@contextlib.contextmanager
def _logged(what: str) -> Iterator[None]:
    """Log an exception from `what` and go on (cleanup that must reach its end)."""
    try:
        yield
    except Exception:
        log.exception("%s failed", what)


class CollectionPause:
    """No automatic cycle collection while a model decodes.

    A full collection walks every object the process has while holding the GIL: in
    the chat app (Textual's widgets, the endpoint, the model's bindings) that was
    30-150 ms, every few answers, and decoding stops for all of it (the sampler runs
    in Python between tokens). Reference counting still frees almost everything; the
    cycles that wait are collected once no request is running, where a pause costs
    nothing. If someone else turned collection off, it stays off.
    """

    def __init__(self) -> None:
        self._held = False

    def hold(self) -> None:
        if not self._held and gc.isenabled():
            gc.disable()
            self._held = True

    def release(self) -> None:
        if self._held:
            gc.enable()
            self._held = False


def fit_prompt(model: LoadedModel, request: Request) -> tuple[list[int], int, int]:
    """The prompt tokens, and how many messages the truncate-oldest policy dropped to fit
    (with the length before); ContextOverflow when it does not fit and may not be cut.

    A prompt that cannot fit whatever it tokenizes to (more bytes than the context's
    tokens times the longest token, or more messages than tokens) is refused, or under
    truncate-oldest cut, before any of it is tokenized: a hostile body costs no
    tokenizer time."""
    n_ctx = model.info.n_ctx
    if request.infill is not None:
        tokens, dropped = infill_tokens(model, request.infill, request.params.max_tokens)
        if len(tokens) >= n_ctx:
            raise ContextOverflow(len(tokens), n_ctx)
        return tokens, dropped, 0
    messages = list(request.messages or [])
    least = least_tokens(model.info, request.prompt, request.suffix, messages)
    cut = request.context_policy == "truncate-oldest" and len(messages) > 1
    if least >= n_ctx and not cut:
        raise ContextOverflow(least, n_ctx, at_least=True)
    least_before = least  # what a cut reports as the length before (a lower bound)
    system = [m for m in messages[:1] if m.role == "system"]
    rest = messages[len(system) :]
    dropped = 0
    while least >= n_ctx and len(rest) > 1:  # cut by the bound first, without tokenizing
        rest, dropped = rest[1:], dropped + 1
        least = least_tokens(model.info, None, None, [*system, *rest])
    if least >= n_ctx:
        raise ContextOverflow(least, n_ctx, at_least=True)
    if dropped:
        request = dataclasses.replace(request, messages=[*system, *rest])
    tokens = render_prompt(model, request)
    if len(tokens) < n_ctx:
        return tokens, dropped, least_before if dropped else 0
    if not cut:
        raise ContextOverflow(len(tokens), n_ctx)
    before = len(tokens)
    while len(rest) > 1:
        rest = rest[1:]
        dropped += 1
        if rest[0].role == "assistant" and len(rest) > 1:
            rest, dropped = rest[1:], dropped + 1  # a turn starts with the user
        tokens = render_messages(model, request, [*system, *rest])
        if len(tokens) < n_ctx:
            log.info("dropped the %d oldest messages to fit %d tokens", dropped, n_ctx)
            return tokens, dropped, before
    raise ContextOverflow(len(tokens), n_ctx)


def least_tokens(
    info: ModelInfo, prompt: str | None, suffix: str | None, messages: Sequence[Message]
) -> int:
    """A lower bound on a prompt's length in tokens, from its size alone: no token covers
    more bytes than the vocabulary's longest, and each message is at least one token."""
    per = info.max_token_bytes
    if per <= 0:
        return 0
    size = sum(len(m.content.encode()) for m in messages)
    size += len((prompt or "").encode()) + len((suffix or "").encode())
    return max(-(-size // per), len(messages))


def check_token_ids(info: ModelInfo, tokens: Sequence[int]) -> None:
    """InvalidRequest naming the first prompt token id outside the model's vocabulary."""
    if info.n_vocab <= 0:
        return
    for i, tok in enumerate(tokens):
        if not 0 <= tok < info.n_vocab:
            raise InvalidRequest(
                f"prompt token {tok} at position {i} is not in the vocabulary of {info.id} "
                f"(ids 0 to {info.n_vocab - 1})",
                param="prompt",
            )


def render_prompt(model: LoadedModel, request: Request) -> list[int]:
    """The prompt tokens for a request: chat template, raw text, FIM, or given tokens."""
    info = model.info
    if request.messages is not None:
        return render_messages(model, request, request.messages)
    if request.prompt_tokens is not None:
        return list(request.prompt_tokens)
    bos = [info.bos_id] if info.add_bos and info.bos_id is not None else []
    prompt = request.prompt or ""
    if request.suffix is None:
        return bos + model.tokenize(prompt, special=True)
    if info.fim is None:
        raise FimUnsupported(info.id)
    fim = info.fim
    prefix, suffix = model.tokenize(prompt), model.tokenize(request.suffix)
    return [*bos, fim.prefix, *prefix, fim.suffix, *suffix, fim.middle]


def render_messages(model: LoadedModel, request: Request, messages: Sequence[Message]) -> list[int]:
    """A chat's prompt: the template gets the tools when it knows them; a template that
    does not gets them described in a system message and the calls and results
    rewritten as turns it takes (backends/tools.py)."""
    fmt = tools.format_for(model.info.chat_template)
    spec = request.tools
    variables = dict(request.template_vars or {})
    if fmt == "generic":
        return model.render_chat(tools.generic_messages(messages, spec), variables)
    if spec is not None and spec.choice.mode != "none":
        variables["tools"] = [{"type": "function", "function": f} for f in spec.offered()]
    return model.render_chat(messages, variables)


def with_tool_grammar(model: LoadedModel, request: Request) -> tuple[Request, str | None]:
    """The request with the grammar its tool calls must follow (when its choice or the
    template's format needs one), and the format the reply is read in."""
    spec = request.tools
    if spec is None or request.messages is None:
        return request, None
    fmt = tools.format_for(model.info.chat_template)
    if spec.choice.mode == "none":
        return request, None
    if not tools.constrained(fmt, spec):
        return request, fmt
    if request.params.grammar is not None:
        raise InvalidRequest(
            "response_format cannot be combined with tools the model must call "
            f"(tool_choice {spec.choice.mode!r}, or a model whose template has no tool "
            "format); send one of them",
            param="response_format",
        )

    def marker(text: str) -> str:
        ids = model.tokenize(text, special=True)
        if len(ids) == 1 and not model.piece(ids[0]):  # a control token: named by its id
            return f"<[{ids[0]}]>"
        return json.dumps(text)

    source = tools.lark_grammar(fmt, spec, marker)
    compiled = grammar.from_lark(source, param="tools")
    params = dataclasses.replace(request.params, grammar=compiled)
    return dataclasses.replace(request, params=params), fmt


INFILL_RESERVE = 256  # tokens kept free for the answer when /infill says no n_predict


def infill_tokens(
    model: LoadedModel, infill: Infill, n_predict: int | None
) -> tuple[list[int], int]:
    """The /infill prompt laid out as llama.cpp lays it out, and how many extra chunks
    were left out: [BOS] [repo marker, name] then per extra chunk [file separator,
    filename] and its text; then the prefix, suffix and middle markers around the code,
    and the text typed so far. The prefix and suffix are never cut; the extra context
    keeps its newest chunks that fit beside them and the answer."""
    info = model.info
    fim = info.fim
    if fim is None:
        raise FimUnsupported(info.id)
    tok = model.tokenize
    bos = [info.bos_id] if info.add_bos and info.bos_id is not None else []
    core = [
        fim.prefix,
        *tok(infill.prefix),
        fim.suffix,
        *tok(infill.suffix),
        fim.middle,
        *tok(infill.typed),
    ]
    head = [fim.rep, *tok("myproject\n")] if fim.rep is not None else []
    room = info.n_ctx - len(bos) - len(core) - len(head) - (n_predict or INFILL_RESERVE)
    chunks: list[list[int]] = []
    for filename, text in reversed(infill.extra):
        part = [fim.sep, *tok(f"{filename}\n")] if fim.sep is not None else []
        part += tok(text)
        if len(part) > room:
            break
        room -= len(part)
        chunks.append(part)
    dropped = len(infill.extra) - len(chunks)
    extra = [t for part in reversed(chunks) for t in part]
    return [*bos, *(head if extra else []), *extra, *core], dropped
