"""What publishing the engine's status after each step costs the decode: the engine's
tokens/s with the snapshot published (as shipped) and with publishing switched off, side
by side in one run, the two interleaved over `--rounds` rounds; and the time of one
publish with two requests running.

Run: python -m benchmarks.bench_status
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import threading
import time
from pathlib import Path

from benchmarks.common import machine
from localllm.backends.base import Message, SamplingParams
from localllm.config import Settings
from localllm.engine.engine import Engine
from localllm.engine.request import Request

THREADS = 2
TOKENS = 160


def decode_tps(engine: Engine) -> float:
    """Greedy tokens/s after the first token of one request."""
    request = Request(
        SamplingParams.asked(temperature=0.0, max_tokens=TOKENS),
        messages=[Message("user", "Write a long story about a lighthouse keeper.")],
        deterministic=False,
    )
    final = None
    for chunk in engine.generate(request):
        if chunk.finish_reason is not None:
            final = chunk
    assert final is not None and final.stats is not None
    return final.stats.decode_tps


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    print(machine())
    with tempfile.TemporaryDirectory() as tmp:
        settings = Settings(
            n_threads=THREADS,
            data_dir=Path(tmp) / "data",
            cache_dir=Path(tmp) / "cache",
            prompt_cache_disk_mb=0,
            speculate="off",  # the same plain decode in both columns
        )
        engine = Engine(settings)
        try:
            engine.load("starter")
            shipped = engine.worker.publish
            results: dict[str, list[float]] = {"published": [], "not published": []}
            for _ in range(args.rounds):
                for label in results:
                    engine.worker.publish = shipped if label == "published" else lambda: None  # type: ignore[method-assign]
                    results[label].append(decode_tps(engine))
            engine.worker.publish = shipped  # type: ignore[method-assign]
            cost = publish_cost(engine)
        finally:
            engine.close()
    on, off = (statistics.median(results[k]) for k in ("published", "not published"))
    for label, values in results.items():
        print(f"{label:>14}: median {statistics.median(values):6.1f} tokens/s  {values}")
    pairs = [a / b for a, b in zip(results["published"], results["not published"], strict=True)]
    print(f"ratio published / not published: {on / off:.3f} (ratio of medians); "
          f"{statistics.median(pairs):.3f} (median of per-round ratios, "
          f"{min(pairs):.3f}-{max(pairs):.3f})")
    print(f"one publish with two requests running: {cost * 1e6:.0f} us")


def publish_cost(engine: Engine) -> float:
    """Median seconds of one Worker.publish() while two requests decode (timed on this thread
    between steps: the snapshot reads what the worker has, as it does after a step)."""
    done = threading.Event()

    def run() -> None:
        decode_tps(engine)
        done.set()

    threads = [threading.Thread(target=run) for _ in range(2)]
    for t in threads:
        t.start()
    while not engine.status().loaded[0].active and not done.is_set():
        time.sleep(0.001)
    samples = []
    for _ in range(200):
        t0 = time.perf_counter()
        try:
            engine.worker.publish()
        except RuntimeError:  # a table changed under this reader: try again
            continue
        samples.append(time.perf_counter() - t0)
    for t in threads:
        t.join()
    return statistics.median(samples)


if __name__ == "__main__":
    main()
