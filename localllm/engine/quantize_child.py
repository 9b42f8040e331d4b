"""The child process of `localllm quantize` and of its report (see quantize.run_child).

`python -m localllm.engine.quantize_child JOB_JSON` runs one job and writes its
events as JSON lines on stdout: {"progress": f}, then {"done": {...}} or
{"error": "..."}. Everything else the native libraries print goes to stderr.
It dies with its parent, so a killed `localllm quantize` leaves no quantizer
running on.
"""

from __future__ import annotations

import ctypes
import json
import os
import re
import shutil
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

Emit = Callable[..., None]

_PROGRESS = re.compile(r"\[\s*(\d+)/\s*(\d+)\]")
_FALLBACK = re.compile(r"(\d+) of (\d+) tensor\(s\) required fallback")
_WEIGHT_FILES = re.compile(r"^model.*\.safetensors(\.index\.json)?$")


def _die_with_parent() -> None:
    """Linux: the kernel sends SIGKILL when the parent exits. Elsewhere: checked in callbacks."""
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL(None)
            libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        except (OSError, AttributeError):
            pass


def _orphaned(parent: int) -> bool:
    return os.getppid() != parent


def quantize_gguf(job: dict[str, Any], emit: Emit, parent: int) -> None:
    import llama_cpp as ll

    counts = {"fallback": 0, "tensors": 0}

    def on_log(_level: int, text: bytes, _user: Any) -> None:
        line = (text or b"").decode("utf-8", "replace")
        sys.stderr.write(line)
        if _orphaned(parent):
            os._exit(1)
        if m := _PROGRESS.search(line):
            done, total = int(m.group(1)), int(m.group(2))
            counts["tensors"] = total
            emit(progress=(done - 1) / total if total else 0.0)
        if m := _FALLBACK.search(line):
            counts["fallback"] = int(m.group(1))

    callback = ll.llama_log_callback(on_log)
    ll.llama_log_set(callback, None)
    ll.llama_backend_init()
    params = ll.llama_model_quantize_default_params()
    params.ftype = int(job["ftype"])
    params.nthread = int(job["threads"])
    params.allow_requantize = True  # the parent has asked the user already
    rc = ll.llama_model_quantize(
        str(job["source"]).encode(), str(job["dest"]).encode(), ctypes.byref(params)
    )
    if rc != 0:
        emit(error=f"llama.cpp's quantizer failed with code {rc} (see --log-level debug)")
        return
    emit(done={"fallback": counts["fallback"], "tensors": counts["tensors"]})


def quantize_mlx(job: dict[str, Any], emit: Emit, _parent: int) -> None:
    import mlx.core as mx
    from mlx.utils import tree_map
    from mlx_lm.utils import dequantize_model, load_model, quantize_model, save_config, save_model

    source, dest = Path(job["source"]), Path(job["dest"])
    bits, group_size = int(job["bits"]), int(job["group_size"])
    emit(progress=0.05)
    model, config = load_model(source)
    emit(progress=0.3)
    if "quantization" in config:
        model = dequantize_model(model)
        config.pop("quantization", None)
        config.pop("quantization_config", None)
    model.update(
        tree_map(
            lambda a: a.astype(mx.float16) if mx.issubdtype(a.dtype, mx.floating) else a,
            model.parameters(),
        )
    )
    emit(progress=0.5)
    layers = [m for _, m in model.named_modules() if hasattr(m, "to_quantized")]
    skipped = sum(1 for m in layers if m.weight.shape[-1] % group_size)
    model, config = quantize_model(model, config, group_size, bits)
    emit(progress=0.7)
    save_model(dest, model)
    save_config(config, dest / "config.json")
    for item in source.iterdir():
        keep = item.is_file() and not _WEIGHT_FILES.match(item.name)
        if keep and item.name not in ("config.json", "localllm.json"):
            shutil.copy2(item, dest / item.name)
    emit(done={"fallback": skipped, "tensors": len(layers)})


def measure(job: dict[str, Any], emit: Emit, _parent: int) -> None:
    from localllm.backends.base import ModelRef
    from localllm.engine.evaluate import measure as measure_one
    from localllm.engine.evaluate import read_text

    text_path = job.get("text")
    text = read_text(Path(text_path) if text_path else None)
    models = job["models"]
    results = []
    for i, m in enumerate(models):
        ref = ModelRef(m["name"], Path(m["path"]), m["format"], "store", int(m["size"]))

        def step(fraction: float, i: int = i) -> None:
            emit(progress=(i + fraction) / len(models))

        got = measure_one(
            ref,
            text,
            models_dir=Path(job["models_dir"]),
            max_tokens=job.get("max_tokens"),
            n_threads=job.get("threads"),
            progress=step,
        )
        results.append(
            {
                "name": got.name,
                "backend": got.backend,
                "quant": got.quant,
                "size": got.size_bytes,
                "decode_tps": got.decode_tps,
                "ppl": got.ppl.value,
                "scored": got.ppl.scored,
                "text_tokens": got.ppl.text_tokens,
            }
        )
    emit(done={"results": results})


JOBS: dict[str, Callable[[dict[str, Any], Emit, int], None]] = {
    "gguf": quantize_gguf,
    "mlx": quantize_mlx,
    "measure": measure,
}


def main(argv: list[str]) -> int:
    parent = os.getppid()
    _die_with_parent()
    # events on the original stdout; anything printed by libraries goes to stderr
    channel: TextIO = os.fdopen(os.dup(1), "w", buffering=1, encoding="utf-8")
    os.dup2(2, 1)
    sys.stdout = sys.stderr

    def emit(**event: Any) -> None:
        channel.write(json.dumps(event) + "\n")

    from localllm.errors import LocalLLMError

    try:
        job = json.loads(argv[1])
        JOBS[job["kind"]](job, emit, parent)
    except LocalLLMError as exc:
        emit(error=exc.message)
    except Exception as exc:  # a worker reports every failure as one line to its parent
        emit(error=f"{type(exc).__name__}: {exc}")
    channel.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
