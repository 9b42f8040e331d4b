"""Does a cached prefix give exactly the cold output? And what do aligned batches cost?

For each prompt (a long shared system prompt plus a question), greedy output of a
cold run is compared with a re-run on the full cached prompt and with a run after
another question that shares only the system prompt. `--one-batch` evaluates the
prompt the way the backend first did (one batch), for comparison. The prefill of
1,000 tokens is then timed with the batch alignment set to 32, 64 and 512.

    python -m benchmarks.bench_prefix_exact [--one-batch]
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from benchmarks.common import machine
from localllm.backends import common, llamacpp
from localllm.backends.base import LoadOptions, Message, SamplingParams
from localllm.engine import single
from localllm.models.store import ModelStore

SYSTEM = "You are a helpful assistant who knows a lot about history, geography and science. " * 8
QUESTIONS = [
    "Tell me about the history of Rome. " * 20,
    "What is a cat?",
    "Explain photosynthesis in detail.",
    "Write about the sea. " * 40,
    "List five rivers in Europe.",
    "Describe a volcano. " * 10,
    "Why is the sky blue?",
]
NEVER = lambda: False  # noqa: E731


def one_batch(
    self: llamacpp.LlamaCppModel, tokens: Sequence[int], should_stop: Callable[[], bool]
) -> bool:
    ll = self._ll
    arr = (ll.llama_token * len(tokens))(*tokens)
    if ll.llama_decode(self._ctx, ll.llama_batch_get_one(arr, len(tokens))) != 0:
        raise RuntimeError("decode failed")
    self._kv.tokens.extend(tokens)
    self._kv.canonical = len(self._kv.tokens)  # and call all of it reusable
    return True


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--one-batch", action="store_true")
    args = ap.parse_args()
    if args.one_batch:
        llamacpp.LlamaCppModel._decode = one_batch  # type: ignore[method-assign]
        common.ALIGN = 1  # and reuse any prefix length
    ref = ModelStore(Path("/nonexistent")).resolve("starter")
    m = llamacpp.LlamaCppBackend().load(ref, LoadOptions(n_threads=2))
    params = SamplingParams(temperature=0.0, max_tokens=32)

    def out(prompt: list[int]) -> list[int]:
        return [t for c in single.stream(m, prompt, params, should_stop=NEVER) for t in c.tokens]

    differ = 0
    for q in QUESTIONS:
        prompt = m.render_chat([Message("system", SYSTEM), Message("user", q)])
        m._reset_kv()
        cold = out(prompt)
        full = out(prompt)
        out(m.render_chat([Message("system", SYSTEM), Message("user", "Unrelated.")]))
        partial = out(prompt)
        differ += not (cold == full == partial)
    print(f"Machine: {machine()}")
    mode = "one batch" if args.one_batch else f"aligned to {common.ALIGN}"
    print(
        f"prompt evaluation {mode}: {differ} of {len(QUESTIONS)} prompts gave other tokens "
        "on a cache hit than cold"
    )
    if args.one_batch:
        return
    words = m.tokenize("word " * 1000)
    for align in (32, 64, 512):
        common.ALIGN = align
        m._reset_kv()
        t0 = time.perf_counter()
        m._decode(words, NEVER)
        print(
            f"prefill of {len(words)} tokens, batches aligned to {align}: "
            f"{time.perf_counter() - t0:.2f} s"
        )


if __name__ == "__main__":
    main()
