"""llama-server's `samplers` list, as llama.vim and llama.vscode send it on /infill and on
/v1/chat/completions: the filters named run (in localllm's order), a filter left out is
off. Shared by the llama.cpp and OpenAI routes."""

from __future__ import annotations

from dataclasses import dataclass

from localllm.errors import InvalidRequest

# the names localllm honours. "infill" (llama.cpp's end-of-fill handling) is taken as a
# name llama.vim always sends: the fill ends at the model's end token. "penalties" and
# "temperature" run whenever the request sets them.
KNOWN = frozenset({"top_k", "top_p", "min_p", "temperature", "penalties", "infill"})


@dataclass(frozen=True, slots=True)
class Filters:
    top_k: int | None
    top_p: float | None
    min_p: float | None


def chosen(
    names: list[str] | None, top_k: int | None, top_p: float | None, min_p: float | None
) -> Filters:
    """The truncation filters a request runs: as given without a list; with one, those
    it leaves out are off (top_k 0, top_p 1, min_p 0). An unknown name is a 400."""
    if names is None:
        return Filters(top_k, top_p, min_p)
    unknown = sorted(set(names) - KNOWN)
    if unknown:
        raise InvalidRequest(
            f"unknown sampler {unknown[0]!r}; known: {', '.join(sorted(KNOWN))}",
            param="samplers",
        )
    listed = set(names)
    return Filters(
        top_k if "top_k" in listed else 0,
        top_p if "top_p" in listed else 1.0,
        min_p if "min_p" in listed else 0.0,
    )


def deadline(t_max_predict_ms: int | None) -> float | None:
    """llama-server's t_max_predict_ms as the engine's newline deadline in seconds (0 or
    none: no bound, as in llama-server)."""
    return t_max_predict_ms / 1000.0 if t_max_predict_ms else None
