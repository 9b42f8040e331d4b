"""Inference backends behind one contract (see base.py)."""

from __future__ import annotations

from localllm.backends.base import Backend, ModelRef
from localllm.errors import BackendUnavailable


def all_backends() -> list[Backend]:
    """Every backend this build knows, available or not (cheap: imports no engine library)."""
    from localllm.backends.llamacpp import LlamaCppBackend

    return [LlamaCppBackend()]


def backend_for(ref: ModelRef) -> Backend:
    """The backend that will run a model, or BackendUnavailable saying what to install."""
    for backend in all_backends():
        if backend.can_load(ref):
            if not backend.available():
                raise BackendUnavailable(backend.name, backend_hint(backend.name))
            return backend
    raise BackendUnavailable(ref.format, f"no backend can run {ref.format} models ({ref.path})")


def backend_hint(name: str) -> str:
    if name == "llamacpp":
        return "install it with: pip install 'llama-cpp-python==0.3.36'"
    return f"install it with: pip install 'localllm[{name}]'"
