"""The engine's façade: what its clients call (`EngineClient`, engine/client.py).

`Engine.submit()` returns a `ChunkStream` (an async iterator) for the event loop;
`Engine.generate()` is the same for synchronous callers such as the CLI. Each loaded
model runs its requests together in a `Scheduler` (engine/scheduler.py): up to
`parallel` of them decode in one batch per step, the rest wait, up to `max_queue`
outstanding; past that, `ServerBusy`. Closing a stream sets its cancel flag, which the
scheduler reads every step. No thread logic lives here: the worker (engine/worker.py)
owns the models, the residency (engine/residency.py) loads them, the lifecycle
(engine/lifecycle.py) counts what ran.
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import threading
from collections.abc import Callable, Generator, Mapping, Sequence
from typing import Any, TypeVar

from localllm.backends.base import Backend, Chunk, LoadedModel, ModelInfo, ModelRef, SamplingParams
from localllm.config import Settings
from localllm.engine import remote_route, routing
from localllm.engine.client import Budget, EngineStatus, Observer
from localllm.engine.lifecycle import Lifecycle
from localllm.engine.prompt import fit_prompt, with_tool_grammar
from localllm.engine.prompt_cache import PromptCache, default_ram_budget
from localllm.engine.request import Job, Request
from localllm.engine.residency import Residency, Resident
from localllm.engine.stream import ChunkStream, chunks_of
from localllm.engine.worker import Worker
from localllm.errors import InvalidRequest, ModelNotFound
from localllm.models import fit
from localllm.models.store import ModelStore

T = TypeVar("T")


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
        self.cache = PromptCache(
            settings.prompt_cache_ram_mb * 1024 * 1024
            if settings.prompt_cache_ram_mb is not None
            else default_ram_budget(),
            settings.cache_dir / "kv" if settings.prompt_cache_disk_mb > 0 else None,
            settings.prompt_cache_disk_mb * 1024 * 1024,
        )
        self.remotes = remote_route.Remotes(settings)
        self.life = Lifecycle(settings, self.cache)
        self.residency = Residency(
            settings,
            self.store,
            backends,
            cache=self.cache,
            life=self.life,
            remotes=self.remotes,
            publish=lambda: self.worker.publish(),
        )
        self.worker = Worker(settings, self.residency, self.life, self.cache)
        self.worker.start()

    # -- information -------------------------------------------------------------
    @property
    def totals(self) -> Mapping[str, int]:
        """What the engine has done (a live view; the status snapshot holds a copy)."""
        return self.life.totals

    @property
    def observers(self) -> list[Observer]:
        return self.life.observers

    def status(self) -> EngineStatus:
        """The snapshot the worker published after its last step (any thread)."""
        return self.worker.status()

    def resident(self) -> list[dict[str, Any]]:
        """The loaded models, default first, as of the worker's last step."""
        return self.status().resident()

    def activity(self) -> dict[str, Any]:
        """Running and waiting requests per loaded model (see Worker.activity)."""
        return self.worker.activity()

    def models(self) -> list[ModelRef]:
        """The models on this machine (reads the models folder), and those loaded from a
        file outside it (`--model PATH`)."""
        found = self.store.models()
        names = {ref.name for ref in found}
        return found + [ref for ref in self._loaded_refs() if ref.name not in names]

    def resolve(self, name: str, *, paths: bool = True) -> ModelRef:
        """A model name (or, with `paths`, a file or folder) as the store finds it; a
        model loaded from a file outside the store is found by its name."""
        try:
            return self.store.resolve(name, paths=paths)
        except ModelNotFound:
            loaded = next((ref for ref in self._loaded_refs() if ref.name == name), None)
            if loaded is None:
                raise
            return loaded

    def _loaded_refs(self) -> list[ModelRef]:
        return [res.ref for res in list(self.residency.resident.values()) if not res.draft_for]

    def remove(self, ref: ModelRef) -> None:
        """Delete a local model's files."""
        self.store.remove(ref)

    def limit_by(self, budget: Budget) -> None:
        self.life.budget = budget

    def observe(self, observer: Observer) -> Callable[[], None]:
        """Tell `observer` of each finished request; returns the call that stops it."""
        self.life.observers.append(observer)

        def stop() -> None:
            with contextlib.suppress(ValueError):
                self.life.observers.remove(observer)

        return stop

    def backend_of(self, model: str) -> str:
        """The backend that answers `model`'s requests: remote, or the loaded model's."""
        if self.remotes.find(model) is not None:
            return "remote"
        for res in list(self.residency.resident.values()):
            if model == res.ref.name:
                return res.model.info.backend
        return "unknown"

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
        job = Job(
            Request(SamplingParams()),
            ref,
            done.put,
            load_only=True,
            progress=progress,
            n_ctx=n_ctx,
            backend=backend,
        )
        self.worker.enqueue(job)
        item = done.get()
        if isinstance(item, BaseException):
            raise item
        default = self.residency.default
        assert default is not None
        return default.model.info

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
        rs = self.residency

        def load() -> dict[str, Any]:
            ref = rs.resolve(Request(SamplingParams(), model=model, allow_paths=allow_paths))
            assert ref is not None
            if n_ctx is not None:
                trained = fit.trained_context(ref)
                if trained and n_ctx > trained:
                    raise InvalidRequest(
                        f"n_ctx {n_ctx} is more than the {trained} tokens {ref.name} "
                        "was trained for",
                        param="n_ctx",
                    )
            default = rs.default is not None and rs.default.ref.path == ref.path
            res = rs.ensure_loaded(ref, n_ctx=n_ctx, keep_alive=keep_alive, default=default)
            return next(r for r in self.resident() if r["model"] == res.ref.name)

        row: dict[str, Any] = self.worker.on_worker(load)
        return row

    def unload(self, model: str | None) -> list[str]:
        """Unload a model by name (None: every model, the default too); the names unloaded.
        Its running requests end with an error saying so."""
        rs = self.residency

        def drop() -> list[str]:
            gone = []
            for res in list(rs.resident.values()):
                if res.draft_for is not None:
                    continue  # goes with its target
                if model is None or model in (res.ref.name, str(res.ref.path)):
                    gone.append(res.ref.name)
                    rs.unload(res)
            return gone

        names: list[str] = self.worker.on_worker(drop)
        return names

    def with_model(
        self,
        model: str | None,
        fn: Callable[[LoadedModel], T],
        *,
        allow_paths: bool = True,
        keep_alive: float | None = None,
        beside: bool = False,
    ) -> T:
        """fn(the loaded model), run on the worker (the model loaded first; None: the
        default model), for a tokenizer call or a model's properties (any thread but the
        worker's). Its errors reach the caller. `beside`: fn runs on the calling thread
        instead, with the model held loaded (as the tokenizer threads hold it), so work
        that grows with a request (tokenizing megabytes) never holds the others' steps."""
        rs = self.residency

        def load() -> Resident:
            ref = rs.resolve(Request(SamplingParams(), model=model, allow_paths=allow_paths))
            default = rs.default
            chosen = ref or (default.ref if default else self.store.resolve(self.settings.model))
            res = rs.ensure_loaded(
                chosen, default=default is None and ref is None, keep_alive=keep_alive
            )
            if beside:
                res.tokenizing += 1
            return res

        if not beside:
            result: T = self.worker.on_worker(lambda: fn(load().model))
            return result
        res: Resident = self.worker.on_worker(load)

        def release() -> None:
            res.tokenizing -= 1

        try:
            return fn(res.model)
        finally:
            self.worker.post(release)

    def prompt_tokens(self, request: Request) -> list[int]:
        """The prompt a request would run with (its model loaded first), without running
        it: for token counts (any thread but the worker's)."""

        def render(model: LoadedModel) -> list[int]:
            return fit_prompt(model, with_tool_grammar(model, request)[0])[0]

        tokens: list[int] = self.with_model(
            request.model, render, allow_paths=request.allow_paths, beside=True
        )
        return tokens

    # -- submitting ----------------------------------------------------------------
    def submit(self, request: Request) -> ChunkStream:
        """Queue a request; iterate the returned stream from the event loop. A remote
        engine's model is streamed from it on this loop (engine/remote_route.py)."""
        request = routing.route(self.settings.routes, request)
        remote = self.remotes.find(request.model)
        if remote is not None:
            return remote_route.submit(self, request, *remote)
        cancel = threading.Event()
        stream = ChunkStream(asyncio.get_running_loop(), cancel)
        job = Job(request, None, stream.feed, cancel, reader=stream.behind)
        job.stall_s = self.settings.stall_timeout_s
        self.worker.enqueue(job)
        return stream

    def submit_local(
        self,
        request: Request,
        emit: Callable[[Any], None],
        cancel: threading.Event | None = None,
    ) -> None:
        """Queue a request for a local model; its items go to `emit` on the worker (its
        model's name is resolved there: a bad one is the first item)."""
        self.worker.enqueue(Job(request, None, emit, cancel or threading.Event()))

    async def finished_remote(
        self, request: Request, model: str, final: Chunk, seconds: float
    ) -> None:
        """A remote request's end: counted and told to the observers on the worker thread,
        as a local one is; returns once that is done (from the event loop)."""
        loop = asyncio.get_running_loop()
        done: asyncio.Future[None] = loop.create_future()

        def count() -> None:
            try:
                self.life.finished_remote(request, model, final, seconds)
            finally:
                loop.call_soon_threadsafe(_settle, done)

        self.worker.post(count)
        await done

    def hold_remote(self, request: Request) -> tuple[Request, Callable[[], None], int | None]:
        """A remote request held against its key's quota (remote_route.Host); its prompt
        is not tokenized here, so it counts as a token per four characters."""
        chars = len(request.prompt or "") + sum(len(m.content) for m in request.messages or ())
        held, reserved, capped = self.life.hold(request, chars // 4 + 1)
        done = threading.Event()

        def release() -> None:
            if not done.is_set():
                done.set()
                self.life.release(request.client, reserved)

        return held, release, capped

    def cancelled_remote(self) -> None:
        """A remote request that its client left before it began (any thread)."""

        def count() -> None:
            self.life.totals["cancelled"] += 1

        self.worker.post(count)

    def generate(
        self, request: Request, *, cancel: threading.Event | None = None
    ) -> Generator[Chunk, None, None]:
        """Synchronous twin of submit(): yields chunks; raises the request's error."""
        request = routing.route(self.settings.routes, request)
        remote = self.remotes.find(request.model)
        if remote is not None:
            yield from remote_route.generate(self, request, *remote, cancel or threading.Event())
            return
        out: queue.Queue[Any] = queue.Queue()
        job = Job(request, None, out.put, cancel or threading.Event())
        self.worker.enqueue(job)
        try:
            yield from chunks_of(out)
        finally:
            job.cancel.set()

    def close(self) -> None:
        """Stop the worker and free the models."""
        self.worker.close()


def _settle(done: asyncio.Future[None]) -> None:
    if not done.done():
        done.set_result(None)
