"""A model's projector: the `mmproj` GGUF that lets a llama.cpp model read images (and
audio, for some); for an MLX folder, its vision config (mlx-vlm reads it). Hub
repositories ship the projector beside the model (`mmproj-model-f16.gguf`,
`mmproj-F16.gguf`, ...); `localllm pull` fetches it into the model's folder; the store
never lists it as a model of its own."""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Iterable
from pathlib import Path

from localllm.errors import LocalLLMError
from localllm.models.gguf import projector_kinds

_SHARD = re.compile(r"-\d{5}-of-\d{5}(?=\.gguf$)")

# which of several projectors to take: full precision first (what their makers ship as
# the reference), then the smaller ones
_PREFERENCE = ("f16", "bf16", "f32", "q8_0")


def is_projector(name: str) -> bool:
    """Whether a GGUF file name is a projector's (as every GGUF repository names them)."""
    return "mmproj" in name.rsplit("/", 1)[-1].lower()


def best(names: Iterable[str]) -> str | None:
    """The projector to use among several (file names or repository paths): F16 before
    BF16, F32 and Q8_0, then the first by name."""

    def rank(name: str) -> tuple[int, str]:
        stem = name.lower().rsplit("/", 1)[-1].removesuffix(".gguf")
        parts = stem.replace("-", ".").replace("_", ".").split(".")
        for i, want in enumerate(_PREFERENCE):
            if want.replace("_", ".") in ".".join(parts) and want.split("_")[0] in parts:
                return i, name.lower()
        return len(_PREFERENCE), name.lower()

    return min(names, key=rank, default=None)


def beside(model: Path) -> Path | None:
    """The projector for a GGUF model found next to it: in a folder of its own model, any
    `*mmproj*.gguf` there; in a folder of several models (the store's top folder), only
    one named for it (`NAME.mmproj.gguf`, `NAME-mmproj*.gguf`, `mmproj-NAME*.gguf`)."""
    folder = model.parent
    try:
        files = [p for p in folder.iterdir() if p.suffix.lower() == ".gguf" and p.is_file()]
    except OSError:
        return None
    found = [p for p in files if is_projector(p.name) and p != model]
    if not found:
        return None
    models = {_SHARD.sub("", p.name.lower()) for p in files if not is_projector(p.name)}
    if len(models) > 1:
        stem = _SHARD.sub("", model.name.lower()).removesuffix(".gguf")
        named = (f"{stem}.mmproj", f"{stem}-mmproj", f"mmproj-{stem}")
        found = [p for p in found if p.name.lower().startswith(named)]
    name = best(p.name for p in found)
    return folder / name if name is not None else None


def kinds(model: Path) -> frozenset[str]:
    """What the model reads beside text through the projector beside it ("image",
    "audio"), from the projector's header (read once per file version); empty when there
    is none or it is damaged."""
    if model.is_dir():  # an MLX folder: a vision-language model reads images (mlx-vlm)
        return frozenset({"image"}) if _vision_config(model / "config.json") else frozenset()
    found = beside(model)
    if found is None:
        return frozenset()
    try:
        st = found.stat()
    except OSError:
        return frozenset()
    return _kinds(found, st.st_mtime_ns, st.st_size)


def _vision_config(config: Path) -> bool:
    try:
        data = json.loads(config.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(data, dict) and isinstance(data.get("vision_config"), dict)


@functools.lru_cache(maxsize=128)
def _kinds(path: Path, _mtime_ns: int, _size: int) -> frozenset[str]:
    try:
        return projector_kinds(path)
    except LocalLLMError:
        return frozenset()
