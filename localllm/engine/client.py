"""What the routes, the chat and the CLI may ask of the engine: `EngineClient`.

`Engine` (engine/engine.py) is the one implementation; the clients are typed against
this protocol, so they cannot reach into the engine's parts (its store, prompt cache,
counters or loaded models), and a route test can stand a `Mock(spec=EngineClient)` in
its place and check the request it was handed. What the engine is doing is read as
one `EngineStatus`, a frozen snapshot the worker publishes after each of its steps:
a reader on another thread never sees a loaded-model table or a counter half-changed.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Generator, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Literal, Protocol, TypeVar

from localllm.backends.base import Chunk, LoadedModel, ModelInfo, ModelRef
from localllm.models.sampling import Recommended

if TYPE_CHECKING:
    from localllm.engine.remote_route import Remotes
    from localllm.engine.request import Request
    from localllm.engine.stream import ChunkStream

State = Literal["idle", "loading", "ready", "error"]
T = TypeVar("T")
Observer = Callable[["Request", str, Chunk, float], None]


class Budget(Protocol):
    """API keys' daily token quotas (engine/accounting.py's Accounting): a request is
    admitted against what its key has left, and settles when it ends."""

    def reserve(
        self, client: str, prompt: int, max_tokens: int | None
    ) -> tuple[int | None, int]: ...

    def settle(self, client: str, reserved: int) -> None: ...


@dataclass(frozen=True, slots=True)
class LoadedRow:
    """One loaded model as the worker last saw it."""

    model: str
    default: bool
    backend: str
    device: str
    n_ctx: int
    memory_bytes: int
    kv_bytes: int
    parallel: int
    active: int
    waiting: int
    last_used: float  # time.monotonic() of its last use
    keep_alive: float | None  # idle seconds before it unloads; None: never
    requests: int
    draft_for: str | None
    kv_type: str = "f16"  # what its KV cache stores (f32, f16, q8_0, q4_0)
    media: tuple[str, ...] = ()  # what it reads beside text ("image", "audio")

    def as_dict(self, now: float) -> dict[str, Any]:
        """The row /health, `localllm ps` and Ollama's /api/ps show, its clocks read at `now`."""
        idle = now - self.last_used
        expires = None
        if not self.default and self.keep_alive is not None:
            expires = round(max(0.0, self.keep_alive - idle), 1)
        return {
            "model": self.model,
            "default": self.default,
            "backend": self.backend,
            "device": self.device,
            "n_ctx": self.n_ctx,
            "memory_bytes": self.memory_bytes,
            "kv_bytes": self.kv_bytes,
            "kv_type": self.kv_type,
            "parallel": self.parallel,
            "active": self.active,
            "waiting": self.waiting,
            "idle_s": round(idle, 1),
            "expires_in_s": expires,
            "requests": self.requests,
            "draft_for": self.draft_for,
            "media": list(self.media),
        }


def _frozen(mapping: Mapping[str, Any]) -> Mapping[str, Any]:
    return MappingProxyType(dict(mapping))


@dataclass(frozen=True, slots=True)
class EngineStatus:
    """What the engine is doing, as of its last step."""

    state: State = "idle"
    model_info: ModelInfo | None = None  # the default model's
    model_ref: ModelRef | None = None
    sampling: Recommended = field(default_factory=Recommended)  # the default model's
    backend_preference: str = "auto"  # what the next load uses unless told otherwise
    queued: int = 0  # requests submitted and not yet ended (counted when status() is read)
    loaded: tuple[LoadedRow, ...] = ()  # the default model first
    # running and waiting requests, each one's prefill progress (see Engine.activity)
    activity: Mapping[str, Any] = field(default_factory=lambda: _frozen({}))
    totals: Mapping[str, int] = field(default_factory=lambda: _frozen({}))
    prompt_cache: Mapping[str, Any] = field(default_factory=lambda: _frozen({}))
    dead: str | None = None  # why the worker stopped, if it ever stopped unasked
    last_error: str | None = None  # the last failed load's message

    def resident(self, now: float | None = None) -> list[dict[str, Any]]:
        """The loaded models as rows (see LoadedRow.as_dict), default first."""
        at = time.monotonic() if now is None else now
        return [row.as_dict(at) for row in self.loaded]

    def n_ctx_of(self, model: str) -> int | None:
        """The context a loaded model has (None: not loaded)."""
        return next((row.n_ctx for row in self.loaded if row.model == model), None)


class EngineClient(Protocol):
    """The engine as its clients see it (any thread unless a method says otherwise)."""

    @property
    def remotes(self) -> Remotes:
        """The remote engines this one fronts (engine/remote_route.py)."""
        ...

    def status(self) -> EngineStatus:
        """The snapshot the worker published after its last step."""
        ...

    def submit(self, request: Request) -> ChunkStream:
        """Queue a request (from the event loop); its stream says Started, then chunks.
        Every error, a bad model name included, arrives as the stream's first item."""
        ...

    def generate(
        self, request: Request, *, cancel: threading.Event | None = None
    ) -> Generator[Chunk, None, None]:
        """submit() for synchronous callers: yields chunks, raises the request's error."""
        ...

    def load(
        self,
        model: str | ModelRef | None,
        *,
        progress: Callable[[float], None] | None = None,
        n_ctx: int | None = None,
        backend: str | None = None,
    ) -> ModelInfo:
        """Make a model the default, loading it now (blocking)."""
        ...

    def preload(
        self,
        model: str,
        *,
        n_ctx: int | None = None,
        keep_alive: float | None = None,
        allow_paths: bool = True,
    ) -> dict[str, Any]:
        """Load a model beside the default and set its keep-alive; its status row."""
        ...

    def unload(self, model: str | None) -> list[str]:
        """Unload a model by name (None: all); the names unloaded."""
        ...

    def models(self) -> list[ModelRef]:
        """The models on this machine (reads the models folder: not on the event loop)."""
        ...

    def resolve(self, name: str, *, paths: bool = True) -> ModelRef:
        """A model name (or, with `paths`, a file or folder) as the store finds it."""
        ...

    def remove(self, ref: ModelRef) -> None:
        """Delete a local model's files."""
        ...

    def with_model(
        self,
        model: str | None,
        fn: Callable[[LoadedModel], T],
        *,
        allow_paths: bool = True,
        keep_alive: float | None = None,
        beside: bool = False,
    ) -> T:
        """fn(the loaded model) on the worker, loading it first (None: the default);
        `beside`: on the calling thread, the model held loaded meanwhile."""
        ...

    def prompt_tokens(self, request: Request) -> list[int]:
        """The prompt a request would run with, without running it."""
        ...

    def backend_of(self, model: str) -> str:
        """remote, or the backend of the loaded model answering `model`."""
        ...

    def limit_by(self, budget: Budget) -> None:
        """Admit each request against `budget` (the API keys' daily quotas)."""
        ...

    def observe(self, observer: Observer) -> Callable[[], None]:
        """Tell `observer` of each finished request (on the worker: keep it quick);
        returns the call that stops it."""
        ...

    def close(self) -> None:
        """Stop the worker and free the models."""
        ...
