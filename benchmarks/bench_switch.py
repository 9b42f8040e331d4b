"""Switching between two models: both resident vs a cold load each time.

Two store models (the starter GGUF under two names), llama.cpp, n_ctx 2048, two
threads. Each request asks one model for one token with a short prompt, alternating
between the two; the figure is the time from submitting the request to its last
chunk. Resident: the default settings (both stay loaded). Cold: max_loaded_models = 1,
so every switch unloads one model and loads the other. The prompt cache is off, so
the two runs differ only in the load.

    python -m benchmarks.bench_switch
"""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path

from benchmarks.common import machine
from localllm.backends.base import Message, SamplingParams
from localllm.config import Settings
from localllm.engine.engine import Engine
from localllm.engine.request import Request
from localllm.models.starter import starter_path

SWITCHES = 12


def run(root: Path, label: str, **kw: object) -> list[float]:
    settings = Settings(
        n_threads=2,
        n_ctx=2048,
        data_dir=root / "data",
        cache_dir=root / "cache",
        prompt_cache_disk_mb=0,
        prompt_cache_ram_mb=0,
        **kw,  # type: ignore[arg-type]
    )
    engine = Engine(settings)
    try:
        engine.load("first")
        ask = SamplingParams(temperature=0.0, max_tokens=1)
        times = []
        for i in range(SWITCHES + 1):
            model = "second" if i % 2 == 0 else "first"
            t0 = time.perf_counter()
            list(engine.generate(Request(ask, messages=[Message("user", "Hi")], model=model)))
            if i:  # the first request loads `second` in both runs
                times.append(time.perf_counter() - t0)
        print(f"{label}: loads {engine.totals['loads']}, unloads {engine.totals['unloads']}")
        return times
    finally:
        engine.close()


def main() -> None:
    root = Path(tempfile.mkdtemp(prefix="bench-switch-"))
    models = root / "data" / "models"
    models.mkdir(parents=True)
    starter = starter_path()
    assert starter is not None
    (models / "first.gguf").symlink_to(starter)
    (models / "second.gguf").symlink_to(starter)
    resident = run(root, "resident")
    cold = run(root, "cold", max_loaded_models=1)
    r, c = statistics.median(resident), statistics.median(cold)
    print(f"\nmachine: {machine()}")
    print(f"switch to a resident model: median {r * 1000:.0f} ms over {len(resident)} switches")
    print(f"switch with a cold load:    median {c * 1000:.0f} ms over {len(cold)} switches")
    print(f"resident / cold: {r / c:.3f} ({c / r:.1f}x faster)")


if __name__ == "__main__":
    main()
