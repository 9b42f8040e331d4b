"""Where a model in the store came from: the `localllm.json` beside its files (a pull,
an MLX import of a GGUF, a quantization), read by the store, the backends and the CLI."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

PROVENANCE = "localllm.json"


def read_provenance(folder: Path) -> dict[str, Any] | None:
    try:
        data = json.loads((folder / PROVENANCE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def imported_quant(folder: Path) -> str | None:
    """The GGUF quant an MLX import kept as is (its weights are the GGUF's), else None."""
    prov = read_provenance(folder) or {}
    if prov.get("importer_version") is None:
        return None  # not an import: a quantization or a pull has its own weights
    quant = (prov.get("source") or {}).get("quant")
    return str(quant) if quant else None
