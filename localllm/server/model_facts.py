"""What the model lists say about each model, from its header (read once per file
version): the routes of every API share these."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from localllm.backends.base import ModelRef
from localllm.errors import LocalLLMError
from localllm.models.gguf import ModelMeta, capabilities, read_meta

__all__ = ["capabilities", "damage_of", "meta_of"]


@lru_cache(maxsize=256)
def _meta(path: Path, fmt: str, _mtime_ns: int, _size: int) -> ModelMeta | LocalLLMError:
    # a damaged file's error is kept too: a listing reads each file version once
    try:
        return read_meta(path, fmt)
    except LocalLLMError as exc:
        return exc


def meta_of(ref: ModelRef) -> ModelMeta:
    """The header facts of a model (read once per file version); its error when the
    header is damaged or the file is not a model."""
    stat = ref.path.stat()
    found = _meta(ref.path, ref.format, stat.st_mtime_ns, stat.st_size)
    if isinstance(found, LocalLLMError):
        raise found
    return found


def damage_of(ref: ModelRef) -> str | None:
    """Why a listed model cannot be used (what a listing marks it with), or None."""
    try:
        meta_of(ref)
    except LocalLLMError as exc:
        return exc.public_message
    except OSError as exc:
        return f"the file cannot be read ({exc.strerror})"
    return None
