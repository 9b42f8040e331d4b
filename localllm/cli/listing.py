"""localllm list: the models on this machine and the remote engines' models."""

from __future__ import annotations

import argparse
from typing import Any

from localllm.cli.common import (
    origin,
    print_json,
    print_table,
)
from localllm.config import Settings
from localllm.errors import LocalLLMError


def add_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    listing = sub.add_parser("list", parents=[common], help="list local models")
    listing.add_argument("--json", action="store_true", help="machine-readable output")
    listing.set_defaults(run=run)


def run(settings: Settings, args: argparse.Namespace) -> int:
    from localllm.models import projector
    from localllm.models.gguf import read_meta
    from localllm.models.store import ModelStore
    from localllm.units import format_bytes, format_params

    rows = [("NAME", "FORMAT", "PARAMS", "QUANT", "SIZE", "CONTEXT", "INPUT", "SOURCE")]
    records: list[dict[str, Any]] = []
    for ref in ModelStore.from_settings(settings).models():
        # what it reads: text, and images or audio through a projector (models/projector.py)
        reads = ["text", *sorted(projector.kinds(ref.path))]
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
                ",".join(reads),
                origin(ref, settings.models_dir),
            )
        )
        records.append(
            {
                "name": ref.name,
                "format": ref.format,
                "input": reads,
                "size_bytes": ref.size_bytes,
                "source": origin(ref, settings.models_dir),
                "path": str(ref.path),
                **record,
            }
        )
    for m in _remote_models(settings):
        ctx = str(m.n_ctx) if m.n_ctx else "?"
        rows.append((m.name, "remote", "?", "?", "-", ctx, "?", f"remote {m.remote}"))
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
        print_json(records)
        return 0
    print_table(rows)
    return 0


def _remote_models(settings: Settings) -> list[Any]:
    """The remote engines' models (each engine asked for its list, a few seconds at most)."""
    from localllm.engine.remote_route import Remotes

    return Remotes(settings).models_sync()
