"""The KV cache's element type (`kv_cache_type`: f16, q8_0, q4_0) on the starter model,
llama.cpp, each type against f16 in the same run.

For each type, a model loaded with a 4,096-token context and two threads:
- KV bytes per token: the saved state of a 2,048-token prompt (what llama.cpp keeps for
  it, read back with `llama_state_seq_get_data`), divided by its tokens;
- prompt: tokens/s reading that 2,048-token prompt cold;
- decode: greedy tokens/s of 64 tokens after it (the attention then reads 2,048 cached
  positions per token, where a quantized cache costs or saves the most);
- perplexity on the first PPL_TOKENS tokens of the shipped held-out text, in windows of
  1,024 (second halves scored), as `localllm eval --kv-cache-type T` reports it.
The order of the types alternates between rounds; the figures are medians (perplexity,
the same every time, is scored in the first round).

    python -m benchmarks.bench_kv_types [--rounds N]
    python -m benchmarks.bench_kv_types --model starter-mlx --depth 512 --ppl-tokens 2048 \
        --window 512   # MLX (after `localllm convert starter --to mlx`): smaller, it is slow
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import time

from benchmarks.common import machine
from localllm.backends.base import SamplingParams
from localllm.config import load_settings
from localllm.engine import single
from localllm.engine.evaluate import heldout_text, load_for_eval, perplexity
from localllm.models.starter import starter_path
from localllm.models.store import ModelStore

TYPES = ("f16", "q8_0", "q4_0")
THREADS = 2
DEPTH = 2048
PPL_TOKENS = 8192
WINDOW = 1024


def one(kv_type: str, text: str, args: argparse.Namespace, *, score: bool) -> dict[str, float]:
    settings = dataclasses.replace(load_settings(), n_threads=THREADS)  # the user's store
    ref = ModelStore.from_settings(settings).resolve(args.model)
    model = load_for_eval(
        ref, models_dir=settings.models_dir, window=4096, n_threads=THREADS, kv_type=kv_type
    )
    try:
        prompt = model.tokenize(text)[: args.depth]
        params = SamplingParams(temperature=0.0, max_tokens=64)
        t0 = time.perf_counter()
        stats = None
        # exact=False: the prompt read in the engine's own batches, as a request is
        for chunk in single.stream(model, prompt, params, should_stop=lambda: False, exact=False):
            stats = chunk.stats or stats
        assert stats is not None
        state = model.save_kv(exact=False)
        out = {
            "kv_per_token": state.nbytes / len(state.tokens),
            "prompt_tps": args.depth / stats.ttft_s,
            "decode_tps": stats.decode_tps,
            "wall_s": time.perf_counter() - t0,
        }
        if score:  # the same every time: scored in the first round only
            ppl = perplexity(model, text, window=args.window, max_tokens=args.ppl_tokens)
            out["ppl"] = ppl.value
        return out
    finally:
        model.close()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--model", default="starter", help="a model in the store")
    parser.add_argument("--depth", type=int, default=DEPTH, help="prompt tokens")
    parser.add_argument("--ppl-tokens", type=int, default=PPL_TOKENS)
    parser.add_argument("--window", type=int, default=WINDOW)
    args = parser.parse_args()
    assert starter_path().exists()
    text = heldout_text()
    runs: dict[str, list[dict[str, float]]] = {t: [] for t in TYPES}
    for r in range(args.rounds):
        for kv_type in TYPES if r % 2 == 0 else tuple(reversed(TYPES)):
            runs[kv_type].append(one(kv_type, text, args, score=r == 0))
            print(kv_type, runs[kv_type][-1], flush=True)
    med = {
        t: {k: statistics.median(x[k] for x in runs[t] if k in x) for k in runs[t][0]}
        for t in TYPES
    }
    base = med["f16"]
    print(f"\n{machine()}; {args.model}; {args.rounds} rounds, medians\n")
    print(
        "| KV type | KV bytes / token | vs f16 | prompt tok/s | vs f16 | decode tok/s at "
        f"{args.depth} | vs f16 | perplexity ({args.ppl_tokens} tokens) | vs f16 |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for t in TYPES:
        m = med[t]
        print(
            f"| {t} | {m['kv_per_token']:,.0f} | {m['kv_per_token'] / base['kv_per_token']:.2f}x"
            f" | {m['prompt_tps']:.0f} | {m['prompt_tps'] / base['prompt_tps']:.2f}x"
            f" | {m['decode_tps']:.1f} | {m['decode_tps'] / base['decode_tps']:.2f}x"
            f" | {m['ppl']:.3f} | {m['ppl'] / base['ppl']:.3f}x |"
        )


if __name__ == "__main__":
    main()
