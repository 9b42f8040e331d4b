"""Which backend runs which model, and why (the engine's choice).

`plan()` decides which backend runs a model and says why, reading headers only;
`prepare()` carries a plan out (a GGUF going to MLX is imported once, then reused).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from localllm.backends import BACKEND_CHOICES, apple_silicon, get_backend, require
from localllm.backends.base import CPU_F16, Backend, MemoryProfile, ModelRef
from localllm.errors import BackendUnavailable, ImportFailed


@dataclass(frozen=True, slots=True)
class Plan:
    backend: str  # "llamacpp" | "mlx"
    reason: str  # why this backend, a few words for `info` and the status bar
    needs_import: bool = False  # a GGUF that MLX runs after `localllm convert`
    note: str = ""  # what loading will do first (an import), for `info`

    @property
    def text(self) -> str:
        return f"{self.reason}; {self.note}" if self.note else self.reason


def plan(ref: ModelRef, preference: str, models_dir: Path) -> Plan:
    """Which backend runs `ref`, and why; raises BackendUnavailable when none can."""
    from localllm.models.convert import find_import

    if preference not in BACKEND_CHOICES:
        raise BackendUnavailable(
            preference, f"unknown backend; choose one of {', '.join(BACKEND_CHOICES)}"
        )
    if ref.format == "mlx":
        if preference == "llamacpp":
            raise BackendUnavailable(
                "llamacpp", f"{ref.name} is an MLX model folder; llama.cpp runs GGUF files"
            )
        require("mlx")
        return Plan("mlx", "set to mlx" if preference == "mlx" else "auto: an MLX model")
    if preference == "llamacpp":
        require("llamacpp")
        return Plan("llamacpp", "set to llamacpp")
    if preference == "mlx":
        require("mlx")
        imported = find_import(models_dir, ref.path) is not None
        note = "" if imported else "imports the GGUF once"
        return Plan("mlx", "set to mlx", needs_import=True, note=note)
    # auto
    if apple_silicon() and get_backend("mlx").available():
        problem = _import_problem(ref)
        if problem is None:
            imported = find_import(models_dir, ref.path) is not None
            note = "" if imported else "imports the GGUF once"
            return Plan("mlx", "auto: Apple Silicon", needs_import=True, note=note)
        require("llamacpp")
        return Plan("llamacpp", f"auto: the GGUF does not import into MLX ({problem})")
    require("llamacpp")
    where = "mlx is not installed" if apple_silicon() else "not Apple Silicon"
    return Plan("llamacpp", f"auto: {where}")


def memory_profile(
    ref: ModelRef, preference: str, models_dir: Path, n_ctx: int | None = None
) -> MemoryProfile:
    """How the backend the plan picks would hold `ref`; when no backend can run it, an
    f16 profile on the CPU (the load then says why it cannot)."""
    try:
        chosen = plan(ref, preference, models_dir)
    except BackendUnavailable:
        return CPU_F16
    return get_backend(chosen.backend).memory_profile(ref, n_ctx)


def _import_problem(ref: ModelRef) -> str | None:
    from localllm.errors import ModelLoadError
    from localllm.models.convert import check_importable
    from localllm.models.gguf import read_gguf

    try:
        check_importable(read_gguf(ref.path))
    except ImportFailed as exc:
        return exc.reason
    except ModelLoadError as exc:
        return exc.reason
    return None


def prepare(
    ref: ModelRef,
    chosen: Plan,
    models_dir: Path,
    progress: Callable[[float], None] | None = None,
) -> tuple[Backend, ModelRef]:
    """The backend and the model it loads (for a GGUF on MLX: its import, made if missing)."""
    backend = require(chosen.backend)
    if chosen.needs_import:
        from localllm.models.convert import ensure_import

        return backend, ensure_import(ref, models_dir, progress)
    return backend, ref
