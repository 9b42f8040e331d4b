"""The loaded models: load, unload, make room, expire, grow a context, drafts.

`Residency` owns the table of resident models and the default one; it runs on the
worker thread only (the engine's clients read the table through the status snapshot).
A load follows the plan of engine/load_plan.py; a model that does not fit unloads the
least recently used idle ones first, and is refused with the numbers otherwise.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from localllm.backends.base import (
    CPU_F16,
    Backend,
    LoadedModel,
    LoadOptions,
    MemoryProfile,
    ModelRef,
)
from localllm.config import KV_CACHE_TYPES, Settings, lora_spec
from localllm.engine import prompt
from localllm.engine.lifecycle import Lifecycle, ModelHooks
from localllm.engine.load_plan import Planner
from localllm.engine.placement import Plan, plan, prepare
from localllm.engine.prompt_cache import PromptCache, model_key
from localllm.engine.remote_route import Remotes
from localllm.engine.request import Request
from localllm.engine.scheduler import Scheduler
from localllm.engine.speculative import Speculation
from localllm.errors import (
    BackendUnavailable,
    ImportFailed,
    InvalidRequest,
    LocalLLMError,
    ModelLoadError,
)
from localllm.models import fit
from localllm.models.sampling import Recommended, recommended
from localllm.models.store import ModelStore

log = logging.getLogger(__name__)


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


class GrowthFailed(LocalLLMError):
    """A model could not be reloaded with a larger context; it is back at its old one."""

    status = 400
    error_type = "invalid_request_error"
    code = "context_length_exceeded"


class Residency(Planner):
    """The resident models (by path; a draft under its target's) and the default one."""

    def __init__(
        self,
        settings: Settings,
        store: ModelStore,
        backends: Sequence[Backend] | None,
        *,
        cache: PromptCache,
        life: Lifecycle,
        remotes: Remotes,
        publish: Callable[[], None],
    ) -> None:
        super().__init__(settings, store, backends)
        self.cache = cache
        self.life = life
        self.remotes = remotes
        self.publish = publish  # a new status snapshot (after each load and unload)
        self.speculation = Speculation(
            settings, store, load_draft=self.load_draft, unload_draft=self.unload_draft
        )
        self.resident: dict[Path, Resident] = {}
        self.default: Resident | None = None
        self.loading = False
        self.last_error: str | None = None  # the last failed load's message

    def _held(self) -> int:
        return sum(r.need for r in self.resident.values())

    def _hooks(self, res: Resident) -> ModelHooks:
        return self.life.hooks(res.model, res.ref, res.cache_key, self.speculation)

    def ensure_loaded(
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
            self.backend = backend
        res = self.resident.get(ref.path)
        if res is not None and (
            res.loaded_with != self.backend or n_ctx not in (None, res.model.info.n_ctx)
        ):
            self.unload(res)
            res = None
        if res is None:
            res = self._load(ref, progress, n_ctx)
        if default and self.default is not res:
            old, self.default = self.default, res
            if old is not None:
                old.keep_alive = self.keep_alive(None)
                old.last_used = time.monotonic()
        if keep_alive is not None and res is not self.default:
            res.keep_alive = self.keep_alive(keep_alive)
        res.last_used = time.monotonic()
        self.cache.attach(res.model, res.cache_key)
        self.publish()
        return res

    def grow_context(self, res: Resident, want: int) -> Resident:
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
        default = res is self.default
        try:
            return self.ensure_loaded(res.ref, n_ctx=want, default=default)
        except LocalLLMError as exc:  # the estimate was wrong: back to the size it had
            log.warning("%s: could not reload with %d tokens (%s)", res.ref.name, want, exc)
            self.ensure_loaded(res.ref, n_ctx=info.n_ctx, default=default)
            raise GrowthFailed(
                f"{res.ref.name} could not be reloaded with a {want}-token context "
                f"({exc.public_message}); it stays at {info.n_ctx} tokens"
            ) from None

    def _loras_for(self, ref: ModelRef) -> tuple[tuple[str, float], ...]:
        """The LoRA adapters `ref` loads with: the `lora` setting's, when `ref` is the
        setting's model (an adapter fits the one base model it was trained on)."""
        if not self.settings.lora:
            return ()
        try:
            mine = self.store.resolve(self.settings.model)
        except LocalLLMError:
            return ()
        if mine.path.resolve() != ref.path.resolve():
            return ()
        return tuple(lora_spec(spec) for spec in self.settings.lora)

    def keep_alive(self, seconds: float | None) -> float | None:
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
        plan = self.plan(ref, n_ctx)
        profile, n, need = plan.profile, plan.n_ctx, plan.need
        self._make_room(need, profile)
        self.loading = True
        self.publish()
        options = LoadOptions(
            n_ctx=n,
            n_threads=self.settings.n_threads,
            n_gpu_layers=self.settings.n_gpu_layers,
            progress=progress,
            n_seq=need.n_seq,
            kv_type=profile.kv_dtype if profile.kv_dtype in KV_CACHE_TYPES else "f16",
            loras=self._loras_for(ref),
            mmproj=self.mmproj_for(ref),
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
            self.loading = False
            self.publish()
        extra = {**model.info.extra, "backend_reason": reason}
        model.info = dataclasses.replace(model.info, id=ref.name, extra=extra)
        key = model_key(target, model, profile.kv_dtype)
        res = Resident(ref, model, self.backend, key, need.total, need.kv, self.keep_alive(None))
        res.profile = profile
        res.sampling = recommended(ref)
        res.scheduler = Scheduler(res.model, self._hooks(res))
        prompt.warm(model)
        self.resident[ref.path] = res
        self.life.totals["loads"] += 1
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

    def _make_room(
        self, need: fit.Estimate, profile: MemoryProfile, *, keep: Path | None = None
    ) -> None:
        """Refuse (unless forced) a load that would not fit even with every other model
        unloaded; otherwise unload least recently used models (the default last) until it
        fits beside the rest, within max_loaded_models and memory."""
        s = self.settings
        budget = s.memory_budget_mb * 1024 * 1024 if s.memory_budget_mb is not None else None
        free = self._free(profile)
        held = sum(r.need for r in self.resident.values())
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
            for r in self.resident.values()
            if not r.scheduler.busy and r.draft_for is None and r.ref.path != keep
        ]
        order = sorted(idle, key=lambda r: (r is self.default, r.last_used))
        kept = held  # what the models still loaded take

        def short() -> bool:
            over_budget = budget is not None and need.total + kept > budget
            return over_budget or need.total > free.bytes + (held - kept)

        while order and (len(self.resident) >= s.max_loaded_models or short()):
            res = order.pop(0)
            kept -= res.need
            self.unload(res)

    def unload(self, res: Resident) -> None:
        if res not in self.resident.values():
            return  # a draft model, gone with its target already
        log.info("unloading %s", res.ref.name)
        try:
            self.cache.release(res.cache_key)
        except Exception:
            log.exception("could not save %s's live KV state", res.ref.name)
        self.life.totals["unloads"] += 1  # first: a reader that sees it gone sees it counted
        for key, value in list(self.resident.items()):
            if value is res:
                del self.resident[key]
        if self.default is res:
            self.default = None
        self.speculation.release(res.ref)
        res.scheduler.cancel_all(LocalLLMError(f"the model {res.ref.name} was unloaded"))
        res.model.close()
        self.publish()

    def expire(self) -> float | None:
        """Unload on-demand models idle past their keep-alive; seconds until the next expiry."""
        now = time.monotonic()
        soonest: float | None = None
        for res in list(self.resident.values()):
            left = res.time_left(now)
            if res is self.default or left is None or res.scheduler.busy or res.tokenizing:
                continue
            if left <= 0:
                log.info("%s idle for %.0f s: unloading", res.ref.name, now - res.last_used)
                self.unload(res)
            elif soonest is None or left < soonest:
                soonest = left
        return soonest

    def load_draft(self, target_ref: ModelRef, ref: ModelRef, target: LoadedModel) -> LoadedModel:
        """Load a draft model for `target`, on its backend and at its context, one sequence:
        checked against memory like any load and listed among the loaded models (it goes
        when its target goes)."""
        from localllm.errors import InvalidRequest

        backend = target.info.backend  # the draft runs where the target runs
        # and is held as its target is held
        profile = next(r.profile for r in self.resident.values() if r.model is target)
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
        res.scheduler = Scheduler(res.model, self._hooks(res))  # it serves no requests of its own
        res.draft_for = target_ref.name
        self.resident[Path(f"{ref.path}#draft-for:{target_ref.path}")] = res
        self.life.totals["loads"] += 1
        log.info("loaded %s as the draft model for %s", ref.name, target_ref.name)
        return model

    def unload_draft(self, model: LoadedModel) -> None:
        for res in list(self.resident.values()):
            if res.model is model:
                self.unload(res)
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
        chosen = plan(ref, self.backend, models_dir)
        try:
            backend, target = prepare(ref, chosen, models_dir, options.progress)
        except ImportFailed as exc:
            if self.backend != "auto":
                raise
            log.warning("MLX import of %s failed, using llama.cpp: %s", ref.name, exc.reason)
            chosen = Plan("llamacpp", f"auto: the MLX import failed ({exc.reason})")
            backend, target = prepare(ref, chosen, models_dir)
        reason = chosen.reason
        if target != ref:
            reason += f"; MLX import {target.name}"
        return backend.load(target, options), reason, target

    def resolve(self, request: Request) -> ModelRef | None:
        if request.model is None:
            return None
        if self.remotes.find(request.model) is not None:  # (requests for it never come here)
            raise InvalidRequest(
                f"{request.model} is a remote engine's model: loading, tokenizing and "
                "counting tokens are for models on this machine",
                param="model",
                code="unsupported_for_remote",
            )
        for res in list(self.resident.values()):
            by_path = request.allow_paths and request.model == str(res.ref.path)
            if request.model == res.ref.name or by_path:
                return res.ref  # a loaded model, whatever the store would make of its name
        return self.store.resolve_for_request(
            request.model, allow_paths=request.allow_paths, param="model"
        )
