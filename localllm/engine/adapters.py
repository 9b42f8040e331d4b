"""LoRA adapters per request: which ones a request runs with, and what its KV is keyed on.

A model loads its adapters once (`--lora FILE[:SCALE]`, ids 0, 1, ... in that order).
A request that names none runs with their global scales (llama-server's rule; POST
/lora-adapters sets them); one that sends `lora: [{"id", "scale"}]` runs with those
scales, and every adapter it leaves out is off. The scheduler batches together only
requests that run with the same adapters (a llama.cpp context applies one set per
decode), and the prompt cache keys a KV state on them: the same tokens read under
another adapter are another state.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
from collections.abc import Sequence
from dataclasses import dataclass

from localllm.backends.base import Adapter, Scales, global_scales
from localllm.errors import InvalidRequest


@dataclass(frozen=True, slots=True)
class Applied:
    """The adapters a request runs with, and the prompt-cache tag of the KV it writes."""

    scales: Scales = ()
    tag: str = ""  # "": the base model


BASE = Applied()


def applied(adapters: Sequence[Adapter], asked: Scales | None) -> Applied:
    """What a request runs with: the global scales when it names no adapters (`asked`
    None), else the ones it names (each id once, the others off)."""
    if asked is None:
        scales = global_scales(adapters)
    else:
        check_ids(adapters, asked)
        scales = tuple(sorted((i, s) for i, s in asked if s))
    if not scales:
        return BASE
    return Applied(scales, tag(adapters, scales))


def check_ids(adapters: Sequence[Adapter], asked: Scales) -> None:
    """InvalidRequest (`lora`) naming the ids there are when `asked` names another one,
    names one twice or gives a scale that is not a finite number."""
    seen: set[int] = set()
    for i, scale in asked:
        if not 0 <= i < len(adapters):
            have = (
                f"its adapters are ids 0 to {len(adapters) - 1} (GET /lora-adapters lists them)"
                if adapters
                else "it was loaded without any (start it with --lora FILE)"
            )
            raise InvalidRequest(f"LoRA adapter id {i} is not loaded: {have}", param="lora")
        if i in seen:
            raise InvalidRequest(f"LoRA adapter id {i} is named twice", param="lora")
        if not math.isfinite(scale):
            raise InvalidRequest(
                f"the scale of LoRA adapter {i} must be a finite number", param="lora"
            )
        seen.add(i)


def tag(adapters: Sequence[Adapter], scales: Scales) -> str:
    """The adapters' identity (file and its stamp when loaded) and scales, hashed: stable
    across restarts, so the disk tier of the prompt cache can key on it."""
    parts = [f"{adapters[i].path}|{adapters[i].stamp}|{scale!r}" for i, scale in scales]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:12]


def describe(adapters: Sequence[Adapter]) -> list[dict[str, object]]:
    """llama-server's GET /lora-adapters rows."""
    return [{"id": i, "path": a.path, "scale": a.scale} for i, a in enumerate(adapters)]


def set_global(adapters: list[Adapter], asked: Scales) -> None:
    """POST /lora-adapters: the scales requests that name no adapters get from now on; an
    adapter left out is off (llama-server's rule)."""
    check_ids(adapters, asked)
    wanted = dict(asked)
    for i, a in enumerate(adapters):
        adapters[i] = dataclasses.replace(a, scale=float(wanted.get(i, 0.0)))
