"""How big a piece of a long prompt to read per step while another answer streams.

One chat answer streams on the starter while a ~1,600-token prompt arrives. The scheduler
reads that prompt `PREFILL_CHUNK` tokens a step beside the stream's token, so the chunk
trades the two users against each other: bigger chunks read the prompt sooner, smaller
ones keep the stream flowing. For each chunk size, in alternating order over `--rounds`
rounds: the prompt's time to its first token, and the stream's longest and median gap
between tokens while the prompt is read.

    python -m benchmarks.bench_prefill_chunk [--rounds 2]
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import tempfile
import threading
import time
from pathlib import Path

from benchmarks.common import machine
from localllm.backends.base import Message, SamplingParams
from localllm.config import Settings
from localllm.engine import scheduler
from localllm.engine.engine import Engine
from localllm.engine.request import Request

SIZES = [32, 64, 128, 256]


def measure(engine: Engine, chunk: int, salt: str) -> tuple[float, float, float]:
    """(the prompt's first token in s, the stream's longest and median gap in s)."""
    scheduler.PREFILL_CHUNK = chunk
    times: list[float] = []
    story = [Message("user", f"({salt}) Write a long story about the sea.")]
    params = SamplingParams(temperature=0.0, max_tokens=400, repeat_penalty=1.0)

    def chat() -> None:
        for chunk_ in engine.generate(Request(params, messages=story)):
            if chunk_.tokens:
                times.append(time.perf_counter())

    streaming = threading.Thread(target=chat)
    streaming.start()
    while len(times) < 5:  # the answer is decoding now
        time.sleep(0.005)
    words = " ".join(f"item{i} is {i * 7 % 13}" for i in range(230))
    prompt = f"({salt}) {words}. Which item is the largest?"
    t0 = time.perf_counter()
    first = 0.0
    for part in engine.generate(Request(SamplingParams(temperature=0.0, max_tokens=1),
                                        prompt=prompt)):
        if not first and part.tokens:
            first = time.perf_counter()
    first = first or time.perf_counter()
    streaming.join()
    gaps = [b - a for a, b in itertools.pairwise(times) if t0 <= a <= first]
    return first - t0, max(gaps), statistics.median(gaps)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    print(machine())
    rows: dict[int, list[tuple[float, float, float]]] = {size: [] for size in SIZES}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        engine = Engine(Settings(n_threads=2, parallel=4, data_dir=root / "data",
                                 cache_dir=root / "cache", prompt_cache_ram_mb=0,
                                 prompt_cache_disk_mb=0))
        try:
            engine.load("starter")
            for rnd in range(args.rounds):
                for size in SIZES if rnd % 2 == 0 else SIZES[::-1]:
                    rows[size].append(measure(engine, size, f"{rnd}-{size}"))
                    ttft, worst, med = rows[size][-1]
                    print(f"chunk {size}: prompt {ttft:.2f} s, stream gap longest "
                          f"{worst * 1000:.0f} ms, median {med * 1000:.0f} ms", flush=True)
        finally:
            engine.close()
    print("\n| chunk | prompt's first token | stream's longest gap | median gap |")
    print("|---:|---:|---:|---:|")
    for size, got in rows.items():
        ttft = statistics.median(r[0] for r in got)
        worst = statistics.median(r[1] for r in got)
        med = statistics.median(r[2] for r in got)
        print(f"| {size} | {ttft:.2f} s | {worst * 1000:.0f} ms | {med * 1000:.0f} ms |")


if __name__ == "__main__":
    main()
