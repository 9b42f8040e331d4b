"""Decode speed and time to first token, four ways, in one run (issue: foundation).

(a) a bare decode loop over llama-cpp-python's low-level API (sample + llama_decode),
(b) llama-cpp-python's `Llama.create_completion(stream=True)`,
(c) localllm's `engine.single.stream()` (one sequence through the scheduler),
(d) the localllm endpoint streamed through the official `openai` client,
(e) the same endpoint read with plain httpx (what the server costs without the
    client library's own per-event work).

Every variant uses the starter model, two threads, greedy decoding, the same prompt
text and the same number of new tokens. Rounds interleave the variants so that
machine noise hits them alike; each round's prompt starts differently, so no
variant answers from a cache (the prompt's first token changes). The median round is
reported; time to first token comes from separate short rounds, since prefill is noisy.

    python benchmarks/bench_decode.py [--tokens 128] [--rounds 5]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import openai

from benchmarks.common import Server, machine
from localllm.backends.base import LoadOptions, SamplingParams
from localllm.backends.llamacpp import LlamaCppBackend
from localllm.backends.llamacpp_native import has_amx, plain_cpu_buffers
from localllm.engine import single
from localllm.models.store import ModelStore

THREADS = 2
NO_STORE = Path("/nonexistent")  # only the bundled starter model is used
Result = tuple[float, float, int]  # ttft seconds, decode tokens/s, tokens


WORDS = (
    "Amber",
    "Birch",
    "Cedar",
    "Dune",
    "Ember",
    "Fjord",
    "Grove",
    "Harbor",
    "Iris",
    "Jade",
    "Kelp",
    "Lagoon",
    "Maple",
    "Nectar",
    "Onyx",
    "Pine",
    "Quartz",
    "Reef",
    "Sage",
    "Tide",
)


def prompt_text(k: int) -> str:
    # The first token differs every round, so no variant can reuse a cached prefix.
    return (
        f"{WORDS[k % len(WORDS)]}{k}<|im_start|>system\nYou are a storyteller.<|im_end|>\n"
        "<|im_start|>user\nWrite a long story about a lighthouse keeper.<|im_end|>\n"
        "<|im_start|>assistant\n"
    )


def _rate(t0: float, t_first: float, t_last: float, n: int) -> Result:
    return (t_first - t0, (n - 1) / (t_last - t_first) if n > 1 else 0.0, n)


def bare_loop(path: str) -> Callable[[list[int], int], Result]:
    import llama_cpp as ll

    ll.llama_backend_init()
    mp = ll.llama_model_default_params()
    mp.use_extra_bufts = not has_amx()  # as the backend loads on a CPU with AMX
    model = ll.llama_model_load_from_file(path.encode(), mp)
    cp = ll.llama_context_default_params()
    cp.n_ctx, cp.n_batch, cp.n_ubatch = 4096, 512, 512
    cp.n_threads = cp.n_threads_batch = THREADS
    ctx = ll.llama_init_from_model(model, cp)
    mem = ll.llama_get_memory(ctx)
    smpl = ll.llama_sampler_chain_init(ll.llama_sampler_chain_default_params())
    ll.llama_sampler_chain_add(smpl, ll.llama_sampler_init_greedy())
    one = (ll.llama_token * 1)()

    def run(tokens: list[int], n: int) -> Result:
        ll.llama_memory_clear(mem, True)
        t0 = time.perf_counter()
        arr = (ll.llama_token * len(tokens))(*tokens)
        ll.llama_decode(ctx, ll.llama_batch_get_one(arr, len(tokens)))
        t_first = 0.0
        for i in range(n):
            tok = ll.llama_sampler_sample(smpl, ctx, -1)
            if i == 0:
                t_first = time.perf_counter()
            if i < n - 1:
                one[0] = tok
                ll.llama_decode(ctx, ll.llama_batch_get_one(one, 1))
        return _rate(t0, t_first, time.perf_counter(), n)

    return run


def llama_class(path: str) -> Callable[[list[int], int], Result]:
    import llama_cpp

    with plain_cpu_buffers():
        llm = llama_cpp.Llama(
            path, n_ctx=4096, n_threads=THREADS, n_threads_batch=THREADS, verbose=False
        )

    def run(tokens: list[int], n: int) -> Result:
        t0 = time.perf_counter()
        t_first = t_last = 0.0
        count = 0
        for ev in llm.create_completion(tokens, max_tokens=n, temperature=0.0, stream=True):
            if ev["choices"][0]["finish_reason"] is not None:  # type: ignore[index]
                break  # the closing event carries no token
            t_last = time.perf_counter()
            if count == 0:
                t_first = t_last
            count += 1
        return _rate(t0, t_first, t_last, count)

    return run


def ours(ref_path: str) -> Callable[[list[int], int], Result]:
    ref = ModelStore(NO_STORE).resolve(ref_path)
    model = LlamaCppBackend().load(ref, LoadOptions(n_threads=THREADS))

    def run(tokens: list[int], n: int) -> Result:
        t0 = time.perf_counter()
        t_first = t_last = 0.0
        count = 0
        params = SamplingParams(temperature=0.0, max_tokens=n)
        for chunk in single.stream(model, tokens, params, should_stop=lambda: False):
            if chunk.tokens:
                t_last = time.perf_counter()
                if count == 0:
                    t_first = t_last
                count += len(chunk.tokens)
        return _rate(t0, t_first, t_last, count)

    return run


def endpoint(base: str) -> Callable[[list[int], int], Result]:
    client = openai.OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0)

    def run(tokens: list[int], n: int) -> Result:
        t0 = time.perf_counter()
        t_first = t_last = 0.0
        count = 0
        for ev in client.completions.create(
            model="starter",
            prompt=tokens,
            max_tokens=n,
            temperature=0.0,
            stream=True,
            stream_options={"include_usage": True},
        ):
            if ev.usage is not None:
                count = ev.usage.completion_tokens
            elif ev.choices and ev.choices[0].text:
                t_last = time.perf_counter()
                if t_first == 0.0:
                    t_first = t_last
        return _rate(t0, t_first, t_last, count)

    return run


def raw_sse(base: str) -> Callable[[list[int], int], Result]:
    """The endpoint read with plain httpx: separates the server's cost from the client's."""
    client = httpx.Client(timeout=60)

    def run(tokens: list[int], n: int) -> Result:
        t0 = time.perf_counter()
        t_first = t_last = 0.0
        count = 0
        body = {
            "prompt": tokens,
            "max_tokens": n,
            "temperature": 0.0,
            "repeat_penalty": 1.0,  # plain greedy, as the raw run (no recommended penalty)
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        with client.stream("POST", base + "/v1/completions", json=body) as r:
            for line in r.iter_lines():
                if not line.startswith("data: {"):
                    continue
                event = json.loads(line[6:])
                if event.get("usage"):
                    count = event["usage"]["completion_tokens"]
                elif event["choices"] and event["choices"][0]["text"]:
                    t_last = time.perf_counter()
                    if t_first == 0.0:
                        t_first = t_last
        return _rate(t0, t_first, t_last, count)

    return run


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--ttft-rounds", type=int, default=15)
    args = ap.parse_args()
    ref = ModelStore(NO_STORE).resolve("starter")
    path = str(ref.path)
    server = Server("--threads", str(THREADS))
    try:
        c_model = ours("starter")
        variants = {
            "a": ("bare low-level loop", bare_loop(path)),
            "b": ("Llama.create_completion stream", llama_class(path)),
            "c": ("engine.single.stream()", c_model),
            "d": ("endpoint via openai client", endpoint(server.base)),
            "e": ("endpoint via plain httpx", raw_sse(server.base)),
        }
        tokenizer = LlamaCppBackend().load(ref, LoadOptions(n_threads=1))
        results: dict[str, list[Result]] = {k: [] for k in variants}
        for _, fn in variants.values():  # warm-up round, not counted
            fn(tokenizer.tokenize(prompt_text(0), special=True), 8)
        # (d) and (e) share one server and so one KV cache: each variant gets its own
        # prompt in every round (same shape, a different first token) so none hits a cache.
        offset = {key: 100 * i for i, key in enumerate(variants)}

        def prompt_for(key: str, r: int) -> list[int]:
            return tokenizer.tokenize(prompt_text(r + offset[key]), special=True)

        for r in range(1, args.rounds + 1):
            for key, (_, fn) in variants.items():
                results[key].append(fn(prompt_for(key, r), args.tokens))
        # time to first token on its own: many short rounds, since prefill time is noisy
        ttfts: dict[str, list[float]] = {k: [] for k in variants}
        for r in range(1000, 1000 + args.ttft_rounds):
            for key, (_, fn) in variants.items():
                ttfts[key].append(fn(prompt_for(key, r), 2)[0])
    finally:
        server.stop()

    med = {
        k: (statistics.median(ttfts[k]), statistics.median(x[1] for x in v), min(x[2] for x in v))
        for k, v in results.items()
    }
    print(f"Machine: {machine()}")
    tokens = prompt_for("a", 1)
    print(
        f"Prompt about {len(tokens)} tokens, {args.tokens} new tokens, greedy, "
        f"{THREADS} threads, median of {args.rounds} interleaved rounds; "
        f"time to first token: median of {args.ttft_rounds} separate 2-token rounds\n"
    )
    print("| variant | decode tokens/s | vs (a) | time to first token | tokens |")
    print("|---|---:|---:|---:|---:|")
    for key, (label, _) in variants.items():
        ttft, tps, n = med[key]
        print(
            f"| ({key}) {label} | {tps:.1f} | {tps / med['a'][1]:.3f} | {ttft * 1000:.1f} ms "
            f"| {n} |"
        )
    paired = statistics.median(d - c for d, c in zip(ttfts["d"], ttfts["c"], strict=True))
    print(
        f"\nTTFT (d) - (c): {(med['d'][0] - med['c'][0]) * 1000:+.1f} ms between medians, "
        f"{paired * 1000:+.1f} ms median of the per-round differences"
    )


if __name__ == "__main__":
    main()
