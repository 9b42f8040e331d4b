"""LoRA adapters on a llama.cpp model: loaded with it, applied per step.

llama.cpp applies a set of adapters to a whole context (`llama_set_adapters_lora`), so the
engine's scheduler steps the sequences of one set at a time and tells the model which set
before each step (`use`); the call is skipped while the set stays the same. An adapter
at scale 0 is left out of the set, so a request that turns every adapter off runs the
base model's own graph.
"""

from __future__ import annotations

import ctypes
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from localllm.backends.base import Adapter, Scales
from localllm.backends.llama_api import LlamaApi
from localllm.backends.llamacpp_native import quietly
from localllm.errors import AdapterMismatch, LocalLLMError, ModelLoadError


class Loras:
    """The adapters loaded with one model, and the set its context applies now."""

    def __init__(self, ll: LlamaApi, model: Any, specs: Sequence[tuple[str, float]]) -> None:
        self._ll = ll
        self._handles: list[Any] = []
        self.adapters: list[Adapter] = []
        self._current: Scales = ()
        try:
            for path, scale in specs:
                self._handles.append(_load(ll, model, path))
                self.adapters.append(Adapter.loaded(path, scale))
        except BaseException:
            self.close()
            raise

    def use(self, ctx: Any, scales: Scales) -> None:
        """Apply `scales` to the context's following decodes (nothing to do when they are
        the ones it applies already)."""
        if scales == self._current:
            return
        ll, n = self._ll, len(scales)
        handles = (ll.llama_adapter_lora_p_ctypes * max(n, 1))(
            *[self._handles[i] for i, _ in scales]
        )
        values = (ctypes.c_float * max(n, 1))(*[s for _, s in scales])
        rc = ll.llama_set_adapters_lora(ctx, handles if n else None, n, values if n else None)
        if rc != 0:
            raise LocalLLMError(f"llama.cpp could not apply the LoRA adapters {scales} ({rc})")
        self._current = scales

    def close(self) -> None:
        for handle in self._handles:
            self._ll.llama_adapter_lora_free(handle)
        self._handles.clear()


def _load(ll: LlamaApi, model: Any, path: str) -> Any:
    """One adapter file; ModelLoadError naming it when it is missing, AdapterMismatch (a
    400) when llama.cpp refuses it for this model (another architecture, other shapes)."""
    if not Path(path).is_file():
        raise ModelLoadError(path, "the LoRA adapter file does not exist")
    handle, said = quietly(lambda: ll.llama_adapter_lora_init(model, path.encode()))
    if not handle:
        reason = re.sub(r"^(\w+: )+", "", said.strip())
        reason = reason.removeprefix("failed to apply lora adapter: ") or "no reason given"
        raise AdapterMismatch(path, f"llama.cpp refuses it: {reason[:300]}")
    return handle
