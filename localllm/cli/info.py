"""localllm info: a model described from its header and the load plan the engine would follow."""

from __future__ import annotations

import argparse
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

from localllm.cli.common import (
    backend_flag,
    device_of,
    kv_flag,
    positive_int,
    print_json,
    sampling_line,
)
from localllm.config import Settings
from localllm.errors import LocalLLMError
from localllm.models import projector

if TYPE_CHECKING:
    from localllm.backends.base import ModelRef
    from localllm.models import fit


def add_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    info = sub.add_parser(
        "info", parents=[common], help="describe a model (reads its header, not its weights)"
    )
    info.add_argument("model", help="model name, path or HF repo")
    info.add_argument("--json", action="store_true", help="machine-readable output")
    info.add_argument(
        "--ctx", type=positive_int, dest="n_ctx", help="context size for the memory estimate"
    )
    backend_flag(info)
    kv_flag(info)
    info.set_defaults(run=run)


def run(settings: Settings, args: argparse.Namespace) -> int:
    from localllm.backends.base import default_n_ctx
    from localllm.engine.load_plan import Planner
    from localllm.engine.placement import plan
    from localllm.models.convert import find_import
    from localllm.models.gguf import capabilities, read_meta
    from localllm.models.sampling import recommended
    from localllm.models.store import ModelStore
    from localllm.units import format_bytes, format_params

    store = ModelStore.from_settings(settings)
    ref = store.resolve(args.model)
    meta = read_meta(ref.path, ref.format)
    rec = recommended(ref)
    load = Planner(settings, store).plan(ref, strict=False)  # what a load would do
    profile = load.profile
    kv_type, kv_scale = profile.kv_dtype, profile.kv_scale
    kv_per_token = math.ceil(meta.kv_bytes_per_token * kv_scale)
    try:
        chosen = plan(ref, settings.backend, settings.models_dir)
        backend_line = f"{chosen.backend} ({chosen.text})"
        device = device_of(chosen.backend)
    except LocalLLMError as exc:
        backend_line, device = f"none: {exc.message}", ""
    need, n_seq = load.need, load.need.n_seq
    n_ctx = load.n_ctx or default_n_ctx(meta.n_ctx_train)
    fim = "yes" if meta.fim_ids else "no"
    fields = [
        ("name", ref.name),
        ("path", str(ref.path)),
        ("source", ref.source),
        ("format", ref.format),
        ("architecture", meta.arch),
        ("parameters", f"{format_params(meta.params)} ({meta.params:,})"),
        ("quantization", meta.quant),
        ("size", f"{format_bytes(meta.file_size)} ({meta.file_size:,} bytes)"),
        ("trained context", f"{meta.n_ctx_train} tokens"),
        ("default context", f"{n_ctx} tokens"),
        ("layers", str(meta.n_layers)),
        ("heads", f"{meta.n_head} (KV {meta.n_head_kv})"),
        ("vocabulary", f"{meta.vocab_size} tokens (fingerprint {meta.vocab_fingerprint})"),
        (
            "KV cache",
            f"{format_bytes(kv_per_token)} per token ({kv_type}), "
            f"{format_bytes(kv_per_token * n_ctx)} at {n_ctx} tokens",
        ),
        (
            "parallel",
            f"{n_seq} sequences of {n_ctx} tokens decoded together: "
            f"KV {format_bytes(kv_per_token * n_ctx * n_seq)}",
        ),
        ("prompt cache", _cache_capacity(settings, kv_per_token)),
        ("memory", _memory_line(settings, need, profile.gpu_offload)),
        ("chat template", "yes" if meta.chat_template else "no (ChatML is used)"),
        ("fill-in-middle", fim),
        ("capabilities", ", ".join(capabilities(meta, ref.format, projector.kinds(ref.path)))),
        ("sampling", sampling_line(rec)),
    ]
    described = len(fields)  # what follows (imports, provenance, drafts) is text
    mmproj = projector.beside(ref.path) if ref.format == "gguf" else None
    if mmproj is not None:  # what reads its images
        reads = " and ".join(sorted(projector.kinds(ref.path))) or "nothing it can use"
        fields.append(("projector", f"{mmproj} (reads {reads})"))
    if ref.format == "gguf":
        imported = find_import(settings.models_dir, ref.path)
        fields.append(("MLX import", imported.name if imported else "none"))
    if ref.source == "store":
        fields.extend(_provenance_fields(ref.path if ref.path.is_dir() else ref.path.parent))
    fields.append(("drafts", _drafts_line(settings, ref)))
    fields.append(("backend", backend_line))
    if device:
        fields.append(("device", device))
    if getattr(args, "json", False):
        print_json(
            {
                "name": ref.name,
                "path": str(ref.path),
                "source": ref.source,
                "format": ref.format,
                "architecture": meta.arch,
                "parameters": meta.params,
                "quantization": meta.quant,
                "size_bytes": meta.file_size,
                "trained_context": meta.n_ctx_train,
                "default_context": n_ctx,
                "layers": meta.n_layers,
                "heads": meta.n_head,
                "kv_heads": meta.n_head_kv,
                "vocabulary": meta.vocab_size,
                "vocab_fingerprint": meta.vocab_fingerprint,
                "kv_bytes_per_token": kv_per_token,
                "kv_type": kv_type,
                "parallel": n_seq,
                "kv_bytes": kv_per_token * n_ctx * n_seq,
                "memory_bytes": need.total,
                "chat_template": bool(meta.chat_template),
                "fill_in_middle": bool(meta.fim_ids),
                "capabilities": capabilities(meta, ref.format, projector.kinds(ref.path)),
                "sampling": {"recommended": rec.values, "source": rec.source},
                "backend": backend_line,
                "device": device or None,
                **{
                    key.lower().replace(" ", "_"): value
                    for key, value in fields[described:]
                    if key not in ("backend", "device")
                },
            }
        )
        return 0
    width = max(len(k) for k, _ in fields)
    for key, value in fields:
        print(f"{key.ljust(width)}  {value}")
    return 0


def _provenance_fields(folder: Path) -> list[tuple[str, str]]:
    """Where a store model came from: an import, a pull or a quantization."""
    from localllm.provenance import read_provenance

    prov = read_provenance(folder) or {}
    source = prov.get("source") or {}
    kind = source.get("kind")
    if kind == "pull":
        return [
            (
                "pulled from",
                f"{source.get('repo')} @ {str(source.get('commit'))[:12]} "
                f"({source.get('endpoint')}, {source.get('date')})",
            )
        ]
    if kind == "quantize":
        q = prov.get("quantize") or {}
        group = f", group size {q['group_size']}" if q.get("group_size") else ""
        fell = q.get("fallback_tensors") or 0
        note = f"; {fell} of {q.get('tensors')} tensors fell back" if fell else ""
        again = " (requantized)" if q.get("requantized") else ""
        return [
            (
                "quantized from",
                f"{source.get('name')} ({source.get('quant')}, {source.get('path')}) "
                f"to {q.get('type')}{group}{again} on {prov.get('created')}{note}",
            )
        ]
    if source.get("identity"):
        return [("imported from", str(source["identity"].get("path", "?")))]
    return []


def _drafts_line(settings: Settings, ref: ModelRef) -> str:
    """Local models that can draft for this one (speculative decoding, --draft)."""
    from localllm.models.store import ModelStore, compatible_drafts
    from localllm.units import format_bytes

    drafts = compatible_drafts(ref, ModelStore.from_settings(settings).models())
    if not drafts:
        return "none among local models (same vocabulary, smaller); prompt lookup needs none"
    listed = ", ".join(f"{d.name} ({format_bytes(d.size_bytes)})" for d in drafts[:5])
    return f"{listed}; use one with --draft NAME"


def _memory_line(settings: Settings, need: fit.Estimate, gpu_offload: bool) -> str:
    """An estimate against free memory, and a way out if it won't fit."""
    from localllm.models import fit

    offload = settings.n_gpu_layers != 0 and gpu_offload
    free = fit.free_memory(gpu_offload=offload, budget_mb=settings.memory_budget_mb)
    if fit.fits(need, free):
        return f"needs {need.text()}; {free.text()}: fits"
    return f"needs {need.text()}; {free.text()}: does NOT fit ({fit.refusal(need, free).hint})"


def _cache_capacity(settings: Settings, kv_per_token: int) -> str:
    """How much conversation the prompt cache's RAM budget holds for this model."""
    from localllm.engine.prompt_cache import default_ram_budget
    from localllm.units import format_bytes

    ram = settings.prompt_cache_ram_mb
    budget = ram * 1024 * 1024 if ram is not None else default_ram_budget()
    tokens = budget // kv_per_token if kv_per_token else 0
    disk = settings.prompt_cache_disk_mb
    where = f", and {format_bytes(disk * 1024 * 1024)} on disk" if disk else ", no disk tier"
    return f"{format_bytes(budget)} RAM holds about {tokens:,} tokens of saved KV{where}"
