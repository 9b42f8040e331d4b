"""On-device quantization: `localllm quantize MODEL --to TYPE`.

GGUF types go through llama.cpp's quantizer, MLX types through mlx-lm. Either
runs in a child process (`quantize_child`), so a crash in native code cannot
take down the chat or the server that started it. The result is written to a
hidden folder in the store, `.quantize-NAME-*`, and renamed into place only
when complete, with `localllm.json` recording its source and type; a folder
left by a killed run is never listed as a model and is swept by the next run.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from localllm.backends.base import ModelRef
from localllm.errors import LocalLLMError, QuantizeFailed
from localllm.models.gguf import read_gguf
from localllm.models.staging import STAGING_PREFIX, staging_dir, sweep_stale
from localllm.provenance import PROVENANCE, read_provenance
from localllm.units import format_bytes

# llama.cpp's file types (llama_ftype)
GGUF_TYPES = {"f16": 1, "q4_0": 2, "q4_1": 3, "q8_0": 7, "q4_k_m": 15, "q5_k_m": 17}
MLX_TYPES = {"mlx-4bit": 4, "mlx-8bit": 8}
TYPES = (*GGUF_TYPES, *MLX_TYPES)
MLX_GROUP_SIZES = (32, 64, 128)
UNQUANTIZED = ("F32", "F16", "BF16")

# bits per weight of each type, and what a K-quant falls back to for rows it cannot split
_BPW = {"f16": 16.0, "q4_0": 4.5, "q4_1": 5.0, "q8_0": 8.5, "q4_k_m": 4.5, "q5_k_m": 5.5}
_FALLBACK_BPW = {"q4_k_m": 5.5, "q5_k_m": 6.0}  # q5_0, q5_1
QK_K = 256  # K-quant super-block: rows must be a multiple of it
HELDOUT_LABEL = "the held-out text (localllm/data/heldout.txt)"


@dataclass(frozen=True, slots=True)
class QuantizePlan:
    """What a quantization will do, checked before anything is written."""

    source: ModelRef
    source_quant: str
    target: str
    name: str
    dest: Path
    estimate: int  # bytes of the result, about
    free: int  # bytes free where it will be written
    group_size: int | None = None  # MLX types
    fallback: int = 0  # tensors (GGUF) or layers (MLX) the type cannot cover
    tensors: int = 0
    warnings: tuple[str, ...] = ()

    @property
    def backend(self) -> str:
        return "mlx" if self.target in MLX_TYPES else "llamacpp"


@dataclass(frozen=True, slots=True)
class QuantizeResult:
    folder: Path
    ref: ModelRef
    seconds: float
    fallback: int
    tensors: int


def default_name(source: ModelRef, target: str) -> str:
    base = re.sub(r"[^A-Za-z0-9._-]+", "--", source.name).strip("-")
    return f"{base}-{target}"


def _quant_of(ref: ModelRef) -> str:
    from localllm.models.gguf import read_meta

    return read_meta(ref.path, ref.format).quant


def _is_quantized(quant: str) -> bool:
    return quant.upper() not in UNQUANTIZED and quant.lower() not in ("f16", "f32", "bf16")


def plan_quantize(
    source: ModelRef,
    target: str,
    *,
    models_dir: Path,
    name: str | None = None,
    allow_requantize: bool = False,
    group_size: int = 64,
) -> QuantizePlan:
    """Check a quantization before it runs; QuantizeFailed says why it cannot."""
    where = source.name
    if target not in TYPES:
        raise QuantizeFailed(where, f"unknown type '{target}'; choose one of {', '.join(TYPES)}")
    if target in GGUF_TYPES and source.format != "gguf":
        raise QuantizeFailed(
            where,
            f"it is an MLX model and llama.cpp quantizes GGUF files; "
            f"choose {' or '.join(MLX_TYPES)}",
        )
    if target in MLX_TYPES and group_size not in MLX_GROUP_SIZES:
        raise QuantizeFailed(
            where,
            f"group size {group_size} is not one MLX quantizes with "
            f"({', '.join(map(str, MLX_GROUP_SIZES))})",
        )
    quant = _quant_of(source)
    warnings: list[str] = []
    if _is_quantized(quant) and target != "f16":
        if not allow_requantize:
            raise QuantizeFailed(
                where,
                f"it is already quantized ({quant}); quantizing it again to {target} compounds "
                "the rounding error of both. Quantize from an F16/F32 model, or pass "
                "--allow-requantize to do it anyway (converting to f16 is always allowed)",
            )
        warnings.append(
            f"requantizing {quant} to {target}: the result carries the error of both "
            "quantizations; its perplexity will be worse than quantizing from F16"
        )
    name = name or default_name(source, target)
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", name):
        raise QuantizeFailed(where, f"'{name}' cannot be a store name (letters, digits, . _ -)")
    dest = models_dir / name
    if dest.exists() or (models_dir / f"{name}.gguf").exists():
        raise QuantizeFailed(
            where, f"{dest} already exists; choose another --name or remove it (localllm rm)"
        )
    if target in GGUF_TYPES:
        estimate, fallback, tensors = _estimate_gguf(source, target)
    else:
        estimate, fallback, tensors = _estimate_mlx(source, MLX_TYPES[target], group_size)
    if fallback:
        warnings.append(fallback_note(target, fallback, tensors, group_size))
    free = _writable_free(models_dir, where)
    if estimate > free:
        raise QuantizeFailed(
            where,
            f"the result needs about {format_bytes(estimate)} and only {format_bytes(free)} "
            f"is free in {models_dir}; free {format_bytes(estimate - free)} or more first",
        )
    return QuantizePlan(
        source=source,
        source_quant=quant,
        target=target,
        name=name,
        dest=dest,
        estimate=estimate,
        free=free,
        group_size=group_size if target in MLX_TYPES else None,
        fallback=fallback,
        tensors=tensors,
        warnings=tuple(warnings),
    )


def fallback_note(target: str, fallback: int, tensors: int, group_size: int) -> str:
    if target in MLX_TYPES:
        # before a run only the hidden size is known, not how many layers it affects
        which = (
            f"{fallback} of {tensors} layers" if tensors else "layers that read the hidden state"
        )
        why = f"their rows are not a multiple of the group size {group_size}"
        return f"{which} stay unquantized: {why}"
    if target in _FALLBACK_BPW:
        return (
            f"{fallback} of {tensors} tensors fall back to another type: K-quants need rows "
            f"that are a multiple of {QK_K}"
        )
    return f"{fallback} of {tensors} tensors fall back to another type"


def _estimate_gguf(source: ModelRef, target: str) -> tuple[int, int, int]:
    """Bytes of the result, tensors expected to fall back, tensors in all.

    Follows llama.cpp's choices where they change the size: the output layer (or the
    tied embedding) keeps Q6_K, Q8_0 where its rows cannot be split into K-quant blocks;
    the _M K-quants give half the layers' attn_v and ffn_down Q6_K.
    """
    meta = read_gguf(source.path)
    names = {n for n, _ in meta.tensor_types}
    output = "output.weight" if "output.weight" in names else "token_embd.weight"
    total, fallback = meta.data_start, 0
    for (tname, _), (row, count) in zip(meta.tensor_types, meta.tensor_shapes, strict=True):
        if row == count:  # 1-D: norms and biases stay F32
            total += count * 4
            continue
        odd = row % QK_K != 0
        rate = _BPW[target]
        if target in _FALLBACK_BPW:
            if odd and tname != output:
                fallback += 1
            rate = _FALLBACK_BPW[target] if odd else rate
            if tname.endswith(("attn_v.weight", "ffn_down.weight")):
                rate = (rate + (8.5 if odd else 6.5625)) / 2
        if tname == output and target != "f16":
            rate = max(rate, 8.5 if odd else 6.5625)
        total += int(count * rate / 8)
    return total, fallback, len(meta.tensor_types)


def _estimate_mlx(source: ModelRef, bits: int, group_size: int) -> tuple[int, int, int]:
    """Bytes of an MLX quantization: bits plus a 16-bit scale and bias per group for
    matrices whose rows split into groups, 16 bits for the rest; with layer counts when
    the source is a GGUF (its header has every tensor's row length)."""
    from localllm.models.gguf import read_meta

    meta = read_meta(source.path, source.format)
    rate = bits + 32 / group_size
    extra = 4 * 1024 * 1024  # tokenizer and config files
    if not meta.tensor_shapes:  # an MLX folder: total parameters only
        fallback = 1 if meta.n_embd and meta.n_embd % group_size else 0
        return int(meta.params * rate / 8) + extra, fallback, 0
    total, fallback, matrices = extra, 0, 0
    for row, count in meta.tensor_shapes:
        if row == count:
            total += count * 2
            continue
        matrices += 1
        fallback += row % group_size != 0
        total += int(count * (16 if row % group_size else rate) / 8)
    return total, fallback, matrices


def _writable_free(models_dir: Path, where: str) -> int:
    """Free bytes in the store folder, after checking it can be written (made if missing)."""
    try:
        models_dir.mkdir(parents=True, exist_ok=True)
        probe = tempfile.mkdtemp(prefix=STAGING_PREFIX + "probe-", dir=models_dir)
        os.rmdir(probe)
        return shutil.disk_usage(models_dir).free
    except OSError as exc:
        raise QuantizeFailed(
            where, f"cannot write to the store {models_dir} ({exc.strerror or exc})"
        ) from None


# -- running -----------------------------------------------------------------------------


def run_child(
    job: dict[str, Any],
    *,
    on_event: Callable[[dict[str, Any]], None],
    what: str,
    cancel: threading.Event | None = None,
) -> dict[str, Any]:
    """Run a job in `python -m localllm.engine.quantize_child`; its final event, or raise.

    Events arrive as JSON lines on the child's stdout; its stderr (native logs) is kept
    in a temporary file and its last lines explain a failure.
    """
    with tempfile.TemporaryFile("w+", encoding="utf-8", errors="replace") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "localllm.engine.quantize_child", json.dumps(job)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
        )
        final: dict[str, Any] | None = None
        if cancel is not None:
            threading.Thread(target=_kill_on, args=(cancel, proc), daemon=True).start()
        try:
            for event in _events(proc):
                if "done" in event or "error" in event:
                    final = event
                else:
                    on_event(event)
            rc = proc.wait()
        except BaseException:
            proc.kill()
            proc.wait()
            raise
        if cancel is not None and cancel.is_set():
            raise QuantizeFailed(what, "cancelled; nothing was added to the store")
        if final is not None and "error" in final:
            raise QuantizeFailed(what, str(final["error"]))
        if rc != 0 or final is None:
            err.seek(0)
            tail = " | ".join(line.strip() for line in err.read().splitlines()[-3:] if line)
            how = f"signal {-rc}" if rc < 0 else f"exit code {rc}"
            raise QuantizeFailed(what, f"the worker process died ({how}); last log: {tail or '-'}")
        return dict(final["done"])


def _kill_on(cancel: threading.Event, proc: subprocess.Popen[str]) -> None:
    while proc.poll() is None:
        if cancel.wait(0.1):
            proc.kill()
            return


def _events(proc: subprocess.Popen[str]) -> Iterator[dict[str, Any]]:
    assert proc.stdout is not None
    for line in proc.stdout:
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if isinstance(event, dict):
            yield event


def quantize(
    plan: QuantizePlan,
    models_dir: Path,
    *,
    progress: Callable[[float], None] | None = None,
    n_threads: int | None = None,
    cancel: threading.Event | None = None,
) -> QuantizeResult:
    """Run a checked plan; the model appears in the store only when it is complete."""
    from localllm.hardware import physical_cores

    report = progress or (lambda _f: None)
    sweep_stale(models_dir)
    source = plan.source
    if plan.backend == "mlx" and source.format == "gguf":
        from localllm.models.convert import ensure_import

        source = ensure_import(source, models_dir)  # MLX quantizes an MLX model
    staging = staging_dir(models_dir, STAGING_PREFIX, plan.name)
    started = time.perf_counter()
    try:
        out = staging / "model"
        job: dict[str, Any] = {
            "kind": "mlx" if plan.backend == "mlx" else "gguf",
            "source": str(source.path),
            "dest": str(out / f"{plan.name}.gguf") if plan.backend == "llamacpp" else str(out),
            "threads": n_threads or physical_cores(),
        }
        if plan.backend == "mlx":
            job.update(bits=MLX_TYPES[plan.target], group_size=plan.group_size)
        else:
            job["ftype"] = GGUF_TYPES[plan.target]
        out.mkdir()

        def on_event(event: dict[str, Any]) -> None:
            if "progress" in event:
                report(min(float(event["progress"]), 0.99))

        done = run_child(job, on_event=on_event, what=plan.source.name, cancel=cancel)
        seconds = time.perf_counter() - started
        fallback = int(done.get("fallback", plan.fallback))
        tensors = int(done.get("tensors", plan.tensors))
        _write_provenance(out, plan, seconds, fallback, tensors)
        os.replace(out, plan.dest)  # the store sees the model only now, complete
    except OSError as exc:
        raise QuantizeFailed(plan.source.name, f"writing the result failed ({exc})") from None
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    report(1.0)
    from localllm.models.store import dir_size

    if plan.backend == "mlx":
        ref = ModelRef(plan.name, plan.dest, "mlx", "store", dir_size(plan.dest))
    else:
        gguf = plan.dest / f"{plan.name}.gguf"
        ref = ModelRef(plan.name, gguf, "gguf", "store", gguf.stat().st_size)
    return QuantizeResult(plan.dest, ref, seconds, fallback, tensors)


def _write_provenance(
    folder: Path, plan: QuantizePlan, seconds: float, fallback: int, tensors: int
) -> None:
    src = plan.source
    fingerprint = ""
    try:
        from localllm.models.gguf import read_meta

        fingerprint = getattr(read_meta(src.path, src.format), "vocab_fingerprint", "")
    except LocalLLMError:
        pass
    data = {
        "format": "mlx" if plan.backend == "mlx" else "gguf",
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "source": {
            "kind": "quantize",
            "name": src.name,
            "path": str(src.path),
            "format": src.format,
            "quant": plan.source_quant,
            "vocab_fingerprint": fingerprint,
        },
        "quantize": {
            "type": plan.target,
            "group_size": plan.group_size,
            "seconds": round(seconds, 2),
            "fallback_tensors": fallback,
            "tensors": tensors,
            "requantized": _is_quantized(plan.source_quant) and plan.target != "f16",
        },
    }
    (folder / PROVENANCE).write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")


def quantized_from(folder: Path) -> str | None:
    """'q4_0 of starter-f16 (2026-12-02)' for a quantized model's folder, else None."""
    prov = read_provenance(folder) or {}
    source, q = prov.get("source") or {}, prov.get("quantize") or {}
    if source.get("kind") != "quantize":
        return None
    return f"{q.get('type')} of {source.get('name')} ({str(prov.get('created', '?'))[:10]})"


def measure_in_child(
    refs: list[ModelRef],
    *,
    models_dir: Path,
    text_file: Path | None = None,
    max_tokens: int | None = None,
    n_threads: int | None = None,
    progress: Callable[[float], None] | None = None,
    cancel: threading.Event | None = None,
) -> list[dict[str, Any]]:
    """Size, decode tokens/s and perplexity of each model, measured in a child process."""
    report = progress or (lambda _f: None)
    job = {
        "kind": "measure",
        "models": [
            {"name": r.name, "path": str(r.path), "format": r.format, "size": r.size_bytes}
            for r in refs
        ],
        "models_dir": str(models_dir),
        "text": str(text_file) if text_file else None,
        "max_tokens": max_tokens,
        "threads": n_threads,
    }

    def on_event(event: dict[str, Any]) -> None:
        if "progress" in event:
            report(float(event["progress"]))

    done = run_child(job, on_event=on_event, what=", ".join(r.name for r in refs), cancel=cancel)
    return list(done["results"])


def report_table(rows: list[dict[str, Any]]) -> list[tuple[str, ...]]:
    """The report as a header and one row per model, perplexity change against the first."""
    base = rows[0]
    table: list[tuple[str, ...]] = [
        ("MODEL", "BACKEND", "TYPE", "SIZE", "DECODE TOK/S", "PERPLEXITY")
    ]
    for i, r in enumerate(rows):
        delta = "" if i == 0 else f" ({(r['ppl'] / base['ppl'] - 1) * 100:+.1f}%)"
        table.append(
            (
                str(r["name"]),
                str(r["backend"]),
                str(r["quant"]),
                format_bytes(int(r["size"])),
                f"{r['decode_tps']:.1f}",
                f"{r['ppl']:.3f}{delta}",
            )
        )
    return table


def report_footer(rows: list[dict[str, Any]], text: str = HELDOUT_LABEL) -> str:
    return (
        f"perplexity over {rows[0]['scored']:,} scored tokens of {text} "
        f"({rows[0]['text_tokens']:,} tokens in all); lower is better"
    )
