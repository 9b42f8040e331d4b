"""What the model lists say about each model, from its header (read once per file
version): the routes of every API share these."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from localllm.backends.base import ModelRef
from localllm.models.gguf import ModelMeta, read_meta


@lru_cache(maxsize=64)
def _meta(path: Path, fmt: str, _mtime_ns: int) -> ModelMeta:
    return read_meta(path, fmt)


def meta_of(ref: ModelRef) -> ModelMeta:
    return _meta(ref.path, ref.format, ref.path.stat().st_mtime_ns)


def capabilities(meta: ModelMeta, fmt: str = "gguf") -> list[str]:
    """Every model can call tools here (a template without tools gets the generic format);
    fill-in-the-middle where the vocabulary has the tokens; embeddings on llama.cpp."""
    out = ["completion", "tools"]
    if meta.fim_ids:
        out.append("insert")
    if fmt == "gguf":
        out.append("embedding")
    return out
