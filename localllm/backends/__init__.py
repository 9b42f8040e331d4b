"""Inference backends behind one contract (see base.py).

Which backend runs which model is the engine's choice (engine/placement.py).
"""

from __future__ import annotations

from localllm.backends.base import Backend
from localllm.errors import BackendUnavailable
from localllm.hardware import apple_silicon

__all__ = ["BACKEND_CHOICES", "all_backends", "apple_silicon", "get_backend", "require"]

BACKEND_CHOICES = ("auto", "llamacpp", "mlx")


def all_backends() -> list[Backend]:
    """Every backend this build knows, available or not (cheap: imports no engine library)."""
    from localllm.backends.llamacpp import LlamaCppBackend
    from localllm.backends.mlx import MlxBackend

    return [LlamaCppBackend(), MlxBackend()]


def get_backend(name: str) -> Backend:
    for backend in all_backends():
        if backend.name == name:
            return backend
    raise BackendUnavailable(name, f"unknown backend; choose one of {', '.join(BACKEND_CHOICES)}")


def require(name: str) -> Backend:
    """The named backend; BackendUnavailable (with how to install it) when it is missing."""
    backend = get_backend(name)
    if not backend.available():
        raise BackendUnavailable(name, backend_hint(name))
    return backend


def backend_hint(name: str) -> str:
    if name == "llamacpp":
        return "install it with: pip install 'llama-cpp-python==0.3.36'"
    return f"install it with: pip install 'localllm[{name}]'"
