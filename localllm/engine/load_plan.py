"""How a model would load: its backend's memory profile, its context, how many sequences
fit, and the memory all of that needs beside what is loaded already. The residency
(engine/residency.py) loads by this plan, and `localllm info` shows the same plan."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from localllm.backends.base import CPU_F16, Backend, MemoryProfile, ModelRef
from localllm.config import DEFAULT_PARALLEL, Settings
from localllm.engine import placement
from localllm.engine.speculative import configured_draft
from localllm.errors import BackendUnavailable, LocalLLMError, ModelTooLarge
from localllm.models import fit, projector
from localllm.models.gguf import read_meta
from localllm.models.store import ModelStore

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class LoadPlan:
    """What a load of one model would use."""

    profile: MemoryProfile  # how its backend holds it (KV dtype, GPU or not)
    n_ctx: int | None  # the context it loads with (None: the backend's default)
    need: fit.Estimate  # its memory with `need.n_seq` sequences and the configured draft


class Planner:
    """Plans loads for the backend preference `backend` (auto | llamacpp | mlx); an engine
    given its `backends` (tests: backends/fake.py) plans with the first that takes a model."""

    def __init__(
        self, settings: Settings, store: ModelStore, backends: Sequence[Backend] | None = None
    ) -> None:
        self.settings = settings
        self.store = store
        self._backends = None if backends is None else tuple(backends)
        self.backend = settings.backend  # the preference models load with

    def _held(self) -> int:
        """The bytes the models loaded now take (a load may take their place)."""
        return 0

    def plan(self, ref: ModelRef, n_ctx: int | None = None, *, strict: bool = True) -> LoadPlan:
        """The plan for loading `ref` now. Strict (a load): ModelTooLarge when a `parallel`
        the user set does not fit, naming the value that does; else (`info`) the plan as
        set, which then shows that it does not fit."""
        profile = self._profile(ref, n_ctx)
        n = n_ctx or self.settings.n_ctx or self.default_context(ref, profile) or None
        need = self._estimate(ref, n, profile)
        if strict:
            need = self._with_parallel(need, profile)
        else:
            need = need.with_seq(self.settings.parallel or DEFAULT_PARALLEL)
        return LoadPlan(profile, n, need)

    def _profile(self, ref: ModelRef, n_ctx: int | None) -> MemoryProfile:
        """How the backend that would load `ref` holds it (its KV dtype, as the
        kv_cache_type setting has it where the model and backend can, GPU or not)."""
        if self._backends is not None:
            try:
                found = self._given_backend(ref).memory_profile(ref, n_ctx)
            except BackendUnavailable:
                found = CPU_F16  # the load says why
        else:
            found = placement.memory_profile(ref, self.backend, self.settings.models_dir, n_ctx)
        kv_type = self.settings.kv_cache_type
        if kv_type == "f16":
            return found
        why = kv_type_refused(ref, kv_type, found)
        if why is not None:
            log.warning("%s keeps an f16 KV cache: %s", ref.name, why)
            return found
        return found.with_kv_type(kv_type)

    def _given_backend(self, ref: ModelRef) -> Backend:
        """Of the backends the engine was given, the first that loads `ref` (and is the
        preferred one, unless that is auto)."""
        assert self._backends is not None
        for backend in self._backends:
            if self.backend in ("auto", backend.name) and backend.can_load(ref):
                return backend
        names = ", ".join(b.name for b in self._backends) or "none"
        raise BackendUnavailable(
            self.backend, f"none of this engine's backends ({names}) loads {ref.name}"
        )

    def default_context(self, ref: ModelRef, profile: MemoryProfile) -> int:
        """The trained context, capped by what fits beside the model (see fit)."""
        n_seq = self.settings.parallel or DEFAULT_PARALLEL
        return fit.default_context(ref, self._room(profile), n_seq, kv_scale=profile.kv_scale)

    def _estimate(self, ref: ModelRef, n_ctx: int | None, profile: MemoryProfile) -> fit.Estimate:
        scale = profile.kv_scale
        draft = configured_draft(self.settings, self.store)
        need = fit.estimate(ref, n_ctx, kv_scale=scale)
        named = self.mmproj_for(ref)
        beside = projector.beside(ref.path) if ref.format == "gguf" else None
        if named is not None and (beside is None or Path(named) != beside):
            # the projector named with --mmproj loads beside it (fit counts one found there)
            extra = _size(Path(named)) - (_size(beside) if beside is not None else 0)
            need = dataclasses.replace(need, weights=need.weights + extra)
        return need.with_draft(draft, target=ref, kv_scale=scale)

    def mmproj_for(self, ref: ModelRef) -> str | None:
        """The projector `ref` loads with: the `mmproj` setting's, when `ref` is the
        setting's model; else the one beside its file (models/projector.py)."""
        if ref.format != "gguf":
            return None
        if self.settings.mmproj:
            try:
                mine = self.store.resolve(self.settings.model)
            except LocalLLMError:
                mine = None
            if mine is not None and mine.path.resolve() == ref.path.resolve():
                return str(Path(self.settings.mmproj).expanduser())
        found = projector.beside(ref.path)
        return str(found) if found is not None else None

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
        room = fit.Free(free.bytes + self._held(), free.where)
        budget = s.memory_budget_mb * 1024 * 1024 if s.memory_budget_mb is not None else None
        if budget is not None and budget < room.bytes:
            room = fit.Free(budget, "of memory_budget_mb")
        return room

    def _free(self, profile: MemoryProfile) -> fit.Free:
        offload = self.settings.n_gpu_layers != 0 and profile.gpu_offload
        return fit.free_memory(gpu_offload=offload)


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def kv_type_refused(ref: ModelRef, kv_type: str, profile: MemoryProfile) -> str | None:
    """Why `ref` cannot store its KV cache as `kv_type` (None: it can): its backend keeps
    its own, or its attention heads are not a whole number of the quantized cache's
    blocks (ggml's 32 values: llama.cpp would refuse the context; mlx-lm's groups of 64)."""
    if not profile.quantized_kv:
        return f"its backend does not apply kv_cache_type {kv_type}"
    try:
        meta = read_meta(ref.path, ref.format)
    except LocalLLMError:
        return None  # the load says what is wrong with the file
    head = meta.n_embd // meta.n_head if meta.n_head else 0
    if head % profile.kv_block:
        return (
            f"kv_cache_type {kv_type} stores blocks of {profile.kv_block} values, and its "
            f"attention heads are {head} wide"
        )
    return None
