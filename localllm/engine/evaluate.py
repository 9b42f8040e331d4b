"""Model quality and speed figures: perplexity on a held-out text, decode tokens/s.

Perplexity follows llama.cpp's `llama-perplexity`: the text is cut into windows
of `window` tokens, each evaluated from a fresh context, and only the second
half of each window is scored, so every scored token has at least half a
window of context. The figure is exp(mean negative log-likelihood).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from localllm.backends.base import (
    LoadedModel,
    LoadOptions,
    Message,
    ModelRef,
    SamplingParams,
)
from localllm.engine import single
from localllm.errors import InvalidRequest

DEFAULT_WINDOW = 512
SPEED_PROMPT = "Write a short story about a lighthouse keeper who finds a message in a bottle."
SPEED_TOKENS = 64


def heldout_text() -> str:
    """The public-domain prose the project ships for perplexity (see localllm/data/README.md)."""
    return resources.files("localllm").joinpath("data/heldout.txt").read_text(encoding="utf-8")


def read_text(path: Path | None) -> str:
    """A given text file, or the shipped held-out text; InvalidRequest for an unreadable file."""
    if path is None:
        return heldout_text()
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise InvalidRequest(f"cannot read {path} as UTF-8 text ({exc})") from None


@dataclass(frozen=True, slots=True)
class Perplexity:
    value: float
    scored: int  # tokens whose probability was counted
    windows: int
    text_tokens: int  # tokens in the whole text


def perplexity(
    model: LoadedModel,
    text: str,
    *,
    window: int = DEFAULT_WINDOW,
    max_tokens: int | None = None,
    progress: Callable[[float], None] | None = None,
) -> Perplexity:
    """Perplexity of `text` under `model`, over its first `max_tokens` tokens (all by default)."""
    window = min(window, model.info.n_ctx)
    tokens = model.tokenize(text)
    use = tokens if max_tokens is None else tokens[:max_tokens]
    n_windows = len(use) // window
    if n_windows < 1:
        raise InvalidRequest(
            f"perplexity needs at least one window of {window} tokens; "
            f"the text gives {len(use)} (of {len(tokens)} tokens in all)"
        )
    total, scored = 0.0, 0
    for w in range(n_windows):
        chunk = use[w * window : (w + 1) * window]
        lps = model.logprobs(chunk, start=window // 2)
        total -= sum(lps)
        scored += len(lps)
        if progress is not None:
            progress((w + 1) / n_windows)
    return Perplexity(math.exp(total / scored), scored, n_windows, len(tokens))


def decode_speed(model: LoadedModel, n_tokens: int = SPEED_TOKENS) -> float:
    """Greedy decode tokens/s for a fixed short prompt (after the first token)."""
    prompt = model.render_chat([Message("user", SPEED_PROMPT)])
    params = SamplingParams(temperature=0.0, max_tokens=n_tokens)
    tps = 0.0
    for chunk in single.stream(model, prompt, params, should_stop=lambda: False):
        if chunk.stats is not None:
            tps = chunk.stats.decode_tps
    return tps


@dataclass(frozen=True, slots=True)
class Measurement:
    name: str
    backend: str
    quant: str
    size_bytes: int
    decode_tps: float
    ppl: Perplexity


def load_for_eval(
    ref: ModelRef,
    *,
    backend: str = "auto",
    models_dir: Path,
    window: int = DEFAULT_WINDOW,
    n_threads: int | None = None,
    kv_type: str = "f16",
    loras: tuple[tuple[str, float], ...] = (),
) -> LoadedModel:
    """Load a model with a context of one window, on the backend `plan` picks (with
    `loras`, scored with those adapters at those scales)."""
    from localllm.engine.placement import plan, prepare

    chosen = plan(ref, backend, models_dir)
    loader, target = prepare(ref, chosen, models_dir)
    options = LoadOptions(n_ctx=window, n_threads=n_threads, kv_type=kv_type, loras=loras)
    return loader.load(target, options)


def measure(
    ref: ModelRef,
    text: str,
    *,
    models_dir: Path,
    backend: str = "auto",
    window: int = DEFAULT_WINDOW,
    max_tokens: int | None = None,
    n_threads: int | None = None,
    progress: Callable[[float], None] | None = None,
) -> Measurement:
    """Size, decode speed and perplexity of one model (loaded for this and closed)."""
    model = load_for_eval(
        ref, backend=backend, models_dir=models_dir, window=window, n_threads=n_threads
    )
    try:
        tps = decode_speed(model)
        ppl = perplexity(model, text, window=window, max_tokens=max_tokens, progress=progress)
        return Measurement(ref.name, model.info.backend, model.info.quant, ref.size_bytes, tps, ppl)
    finally:
        model.close()
