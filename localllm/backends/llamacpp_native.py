"""llama.cpp as a native library: imported once and checked against the declared API,
its log routed into `logging`, models loaded with their errors held back, and what the
build and the CPU can do (GPU offload, AMX)."""

from __future__ import annotations

import contextlib
import ctypes
import logging
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from localllm.backends import llama_api
from localllm.backends.llama_api import LlamaApi
from localllm.errors import DamagedModel, ModelLoadError

_native_log = logging.getLogger("localllm.llama_cpp")

# ggml's levels: 1 debug, 2 info, 3 warn, 4 error, 5 continuation of the previous line
_LEVELS = {1: logging.DEBUG, 2: logging.INFO, 3: logging.WARNING, 4: logging.ERROR}
_state: dict[str, Any] = {}  # keeps the native log callback alive; filled on first load


def native() -> LlamaApi:
    """Import llama_cpp once (checked against the declared API), route its native logging
    into `logging`, init the backend."""
    ll = llama_api.load()

    if "log_cb" not in _state:

        def on_log(level: int, text: bytes, _user: Any) -> None:
            py_level = _LEVELS.get(level, logging.DEBUG)
            held = _state.get("held")
            if held is not None and py_level >= logging.WARNING:
                held.append((py_level, text.decode("utf-8", "replace").rstrip()))
            elif _native_log.isEnabledFor(py_level):
                _native_log.log(py_level, text.decode("utf-8", "replace").rstrip())

        _state["log_cb"] = ll.llama_log_callback(on_log)
        ll.llama_log_set(_state["log_cb"], ctypes.c_void_p(0))
        ll.llama_backend_init()
    return ll


def load_quietly(ll: LlamaApi, path: Path, mparams: Any) -> tuple[Any, str]:
    """Load a model holding back llama.cpp's warnings and errors meanwhile: on success they
    are logged as usual; on failure the first error becomes the reason (one line to the
    user, not llama.cpp's lines first)."""
    return quietly(lambda: ll.llama_model_load_from_file(str(path).encode(), mparams))


def quietly(call: Callable[[], Any]) -> tuple[Any, str]:
    """`call()` (a native load that answers NULL when it fails) with llama.cpp's warnings
    and errors held back: logged after a success; after a failure, the first error is
    returned as the reason."""
    held: list[tuple[int, str]] = []
    _state["held"] = held
    try:
        handle = call()
    finally:
        _state.pop("held", None)
    if handle:
        for level, line in held:
            _native_log.log(level, line)
        return handle, ""
    for _level, line in held:
        _native_log.debug("%s", line)
    errors = [line for level, line in held if level >= logging.ERROR]
    return handle, errors[0] if errors else ""


_MACHINE_WORDS = ("alloc", "memory", "mmap", "out of", "cuda", "metal", "vulkan", "device")


def load_failure(path: Path, said: str) -> ModelLoadError:
    """What a failed load is: llama.cpp refusing what the file says (an architecture it
    does not know, missing tensors or vocabulary, bad hyperparameters) is the file's
    fault, a DamagedModel (400 to a client); running out of memory or a device failing
    is the machine's (500)."""
    if not said or any(w in said.lower() for w in _MACHINE_WORDS):
        said = said or "no reason given"
        return ModelLoadError(str(path), f"llama.cpp could not read it: {said}")
    reason = re.sub(r"^(\w+: )+", "", said.strip())  # llama.cpp's function names
    reason = reason.removeprefix("error loading model: ").replace(str(path), path.name)
    return DamagedModel(str(path), f"llama.cpp cannot load it: {reason[:300]}")


def device_name(ll: Any, n_gpu_layers: int) -> str:
    if n_gpu_layers == 0:
        return "cpu"
    info = ll.llama_print_system_info().decode("utf-8", "replace").upper()
    for name in ("CUDA", "METAL", "VULKAN", "HIP", "SYCL"):
        if name in info:
            return name.lower()
    return "gpu"


def has_amx() -> bool:
    """Whether this CPU has Intel AMX, which a native llama.cpp build then uses."""
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as fh:
            return any(line.startswith("flags") and " amx_int8" in line for line in fh)
    except OSError:
        return False


@contextlib.contextmanager
def plain_cpu_buffers() -> Iterator[None]:
    """While open, llama-cpp-python's own `Llama` class loads weights as this backend does
    on a CPU with AMX (see `has_amx`): benchmarks and tests compare against that class."""
    import llama_cpp.llama_cpp as native

    if not has_amx():
        yield
        return
    default = native.llama_model_default_params

    def params() -> Any:
        p = default()
        p.use_extra_bufts = False
        return p

    native.llama_model_default_params = params
    try:
        yield
    finally:
        native.llama_model_default_params = default


def kv_cells(n_ctx: int, n_seq: int) -> int:
    """The KV cells a context of n_seq sequences of n_ctx tokens each allocates (llama.cpp
    rounds each sequence's share up to a multiple of 256 when there are several)."""
    if n_seq <= 1:
        return n_ctx
    return -(-n_ctx // 256) * 256 * n_seq


def gpu_offload() -> bool:
    """Whether this llama.cpp build can put layers on a GPU."""
    try:
        return bool(native().llama_supports_gpu_offload())
    except ImportError:
        return False
