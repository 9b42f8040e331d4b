"""MLX backend decode speed against mlx-lm's own `stream_generate`, and against llama.cpp,
in one run (issue: the MLX backend).

(a) `mlx_lm.stream_generate` on the imported starter model (the same folder, the same
    greedy sampler, the weights in the same dtype as the backend uses),
(b) localllm's MLX backend on that folder, one sequence through the scheduler
    (`engine.single.stream()`),
(c) localllm's llama.cpp backend on the starter GGUF itself, the same way.

Rounds interleave the variants; each round's prompt starts with another word so no
variant reads its prompt from a cache. Decode tokens/s counts the tokens after the
first over the time after the first (what both mlx-lm and localllm report).

    python -m benchmarks.bench_mlx [--tokens 48] [--rounds 5]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from importlib.metadata import version
from pathlib import Path

from benchmarks.common import machine
from localllm.backends.base import LoadOptions, Message, SamplingParams
from localllm.backends.llamacpp import LlamaCppBackend
from localllm.backends.mlx import MlxBackend, mlx_device
from localllm.engine import single
from localllm.models.convert import ensure_import
from localllm.models.store import ModelStore

THREADS = 2
WORDS = ("Amber", "Birch", "Cedar", "Dune", "Ember", "Fjord", "Grove", "Harbor", "Iris", "Jade")
NEVER = lambda: False  # noqa: E731


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=48)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()

    import mlx.core as mx
    from mlx_lm import stream_generate
    from mlx_lm.utils import load_tokenizer

    gguf_ref = ModelStore(Path("/nonexistent")).resolve("starter")
    store = Path(tempfile.mkdtemp(prefix="bench-mlx-"))
    t0 = time.perf_counter()
    mlx_ref = ensure_import(gguf_ref, store)
    import_s = time.perf_counter() - t0
    ours = MlxBackend().load(mlx_ref, LoadOptions(n_ctx=1024))
    # mlx-lm on the very same module object: same weights, same dtype (float32 on a CPU)
    model = ours._model
    tokenizer = load_tokenizer(mlx_ref.path)
    cpp = LlamaCppBackend().load(gguf_ref, LoadOptions(n_threads=THREADS, n_ctx=1024))
    greedy = SamplingParams(temperature=0.0, max_tokens=args.tokens)

    def prompt(word: str) -> list[int]:
        text = f"{word}: write a long story about a lighthouse keeper."
        return ours.render_chat([Message("user", text)])

    def run_mlx_lm(tokens: list[int]) -> float:
        responses = list(
            stream_generate(model, tokenizer, mx.array(tokens), max_tokens=args.tokens)
        )
        return float(responses[-1].generation_tps)

    def run_ours(m: object, tokens: list[int]) -> float:
        final = list(single.stream(m, tokens, greedy, should_stop=NEVER))[-1]  # type: ignore[attr-defined]
        return float(final.stats.decode_tps)

    results: dict[str, list[float]] = {"a": [], "b": [], "c": []}
    for r in range(args.rounds):
        tokens = prompt(WORDS[r % len(WORDS)])
        keys = ["a", "b", "c"] if r % 2 == 0 else ["c", "b", "a"]
        for key in keys:
            if key == "a":
                results[key].append(run_mlx_lm(tokens))
            else:
                results[key].append(run_ours(ours if key == "b" else cpp, tokens))
        print(f"round {r + 1}: " + ", ".join(f"{k} {v[-1]:.2f}" for k, v in results.items()),
              flush=True)
    med = {k: statistics.median(v) for k, v in results.items()}
    print(f"Machine: {machine()}; mlx {version('mlx')}, mlx-lm {version('mlx-lm')}, "
          f"MLX device {mlx_device()}")
    print(f"GGUF -> MLX import of the starter model: {import_s:.2f} s")
    print(f"{args.rounds} rounds, {args.tokens} new tokens, greedy")
    print("| variant | decode tokens/s (median) | per round |")
    print("|---|---:|---|")
    names = {"a": "(a) `mlx_lm.stream_generate`", "b": "(b) localllm MLX `stream()`",
             "c": "(c) localllm llama.cpp `stream()` (GGUF, 2 threads)"}
    for k, name in names.items():
        print(f"| {name} | {med[k]:.2f} | {', '.join(f'{v:.2f}' for v in results[k])} |")
    ratios = [b / a for a, b in zip(results["a"], results["b"], strict=True)]
    print(f"b/a per round: {', '.join(f'{x:.3f}' for x in ratios)}; "
          f"median {statistics.median(ratios):.3f}")
    print(f"c/b (llama.cpp over MLX): median {med['c'] / med['b']:.1f}x")


if __name__ == "__main__":
    main()
