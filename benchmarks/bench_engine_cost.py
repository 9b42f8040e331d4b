"""The engine's own cost per token per sequence: everything but the model's arithmetic.

The scripted model (backends/fake.py) answers at zero delay, so what a token costs here
is the Python around a step: scheduling, sampling's bookkeeping, the text assembled and
checked for stop strings, the chunk handed to the event loop, the typed deltas made from
it (engine/output.py) and, through the endpoint, the SSE framing and the HTTP write.
Three figures, each over `--tokens` tokens for 1 and for 4 concurrent streams:

- worker: the engine in-process, chunks read from its streams on an asyncio loop and
  turned into deltas, as a route does (no HTTP);
- endpoint: `/v1/chat/completions` streamed to a client in another process (uvicorn in
  this one, the app as `localllm serve` builds it);
- the worker thread's time by stage, from cProfile on that thread (its own time per
  module, so each stage's share is what it spends itself).

A GPU that decodes 1,000 tokens/s per stream leaves 1,000 µs per token; the goal (#33) is
at most 150 µs of that for the engine. Run: python -m benchmarks.bench_engine_cost
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import dataclasses
import json
import pstats
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

from benchmarks.common import free_port, machine
from localllm.backends.base import Message, SamplingParams
from localllm.backends.fake import FakeBackend, Script, write_fake_model
from localllm.config import Settings
from localllm.engine.engine import Engine
from localllm.engine.output import Delta
from localllm.engine.request import Request
from localllm.server import framing

STAGES = {  # module file -> stage, for the worker thread's profile
    "scheduler.py": "scheduling",
    "sequence.py": "scheduling",
    "worker.py": "worker loop and status",
    "engine.py": "worker loop and status",
    "client.py": "worker loop and status",
    "fake.py": "the scripted model (stands for the backend)",
    "textstream.py": "detokenizing and stop strings",
    "common.py": "final stats",
    "stream.py": "hand-off to the event loop",
    "request.py": "hand-off to the event loop",
    "lifecycle.py": "request start and end",
    "output.py": "the output pipeline (typed deltas)",
    "reasoning.py": "the output pipeline (typed deltas)",
    "tools.py": "the output pipeline (typed deltas)",
    "framing.py": "framing (SSE)",
    "base_events.py": "the event loop",
    "events.py": "the event loop",
    "selector_events.py": "the event loop",
    "selectors.py": "the event loop",
    "prompt_cache.py": "request start and end",
    "prompt.py": "request start and end",
}


def ask(n: int) -> Request:
    params = SamplingParams.asked(max_tokens=n, temperature=0.0)
    return Request(params, messages=[Message("user", "count")])


async def _read(engine: Engine, n: int, interval_s: float) -> int:
    """One request read as a streaming route reads it: typed deltas paced as the server
    paces them (`stream_interval_ms`), each framed as an SSE event."""
    stream = engine.submit(ask(n))
    tokens = 0

    def encode(delta: Delta) -> list[bytes]:
        nonlocal tokens
        tokens += len(delta.text)  # the scripted reply is one byte per token
        return [framing.sse({"choices": [{"delta": {"content": delta.text}}]})]

    async for _frame in framing.paced(stream, encode, interval_s=interval_s,
                                      on_error=lambda exc: b""):
        pass
    return tokens


def worker_figure(engine: Engine, streams: int, n: int) -> float:
    """µs per token per sequence, the engine in-process."""

    async def run() -> int:
        interval = engine.settings.stream_interval_ms / 1000
        counts = await asyncio.gather(*(_read(engine, n, interval) for _ in range(streams)))
        return sum(counts)

    t0 = time.perf_counter()
    total = asyncio.run(run())
    seconds = time.perf_counter() - t0
    return seconds / total * streams * 1e6


CLIENT = """
import httpx, json, sys, threading, time
url, n, streams = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
counts = [0] * streams
def one(i):
    body = {"model": "fake", "messages": [{"role": "user", "content": "count"}],
            "max_tokens": n, "temperature": 0, "stream": True}
    with httpx.stream("POST", url, json=body, timeout=600) as r:
        for line in r.iter_lines():
            if line.startswith("data: {"):
                d = json.loads(line[6:])["choices"]
                if d and d[0]["delta"].get("content"):
                    counts[i] += 1
t0 = time.perf_counter()
ts = [threading.Thread(target=one, args=(i,)) for i in range(streams)]
[t.start() for t in ts]; [t.join() for t in ts]
print(json.dumps({"seconds": time.perf_counter() - t0, "frames": sum(counts)}))
"""


def endpoint_figure(port: int, streams: int, n: int) -> tuple[float, int]:
    """µs per token per sequence through the endpoint, and the content frames seen."""
    url = f"http://127.0.0.1:{port}/v1/chat/completions"
    run = subprocess.run([sys.executable, "-c", CLIENT, url, str(n), str(streams)],
                         capture_output=True, text=True, check=True)
    got = json.loads(run.stdout)
    return got["seconds"] / (n * streams) * streams * 1e6, int(got["frames"])


def serve(engine: Engine, settings: Settings) -> tuple[int, Any]:
    import uvicorn

    from localllm.server.app import create_app

    port = free_port()
    config = uvicorn.Config(create_app(settings, engine), port=port, log_level="error")
    server = uvicorn.Server(config)
    threading.Thread(target=server.run, daemon=True).start()
    while not server.started:
        time.sleep(0.05)
    return port, server


def profiled(engine: Engine, streams: int, n: int) -> dict[str, dict[str, float]]:
    """Each thread's own time per stage, µs per token per sequence: the worker's, and the
    event loop's (where the deltas are made and framed)."""
    worker, reader = cProfile.Profile(), cProfile.Profile()
    engine.worker.on_worker(worker.enable)
    reader.enable()
    worker_figure(engine, streams, n)
    reader.disable()
    engine.worker.on_worker(worker.disable)
    return {"worker": _stages(worker, n), "event loop": _stages(reader, n)}


def _stages(prof: cProfile.Profile, n: int) -> dict[str, float]:
    stats = pstats.Stats(prof)
    by_stage: dict[str, float] = defaultdict(float)
    for (path, _line, name), row in stats.stats.items():  # type: ignore[attr-defined]
        own = row[2]
        if "acquire" in name or "'poll' of 'select" in name:
            continue  # a thread waiting for work: not a cost
        stage = STAGES.get(Path(path).name, "other (library code: queues, asyncio, numpy)")
        if "socket" in name and "send" in name:
            stage = "hand-off to the event loop"  # waking the loop: its self-pipe
        by_stage[stage] += own
    return {k: v / n * 1e6 for k, v in by_stage.items()}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tokens", type=int, default=3000, help="tokens per stream")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    print(machine())
    home = Path(tempfile.mkdtemp())
    ref = write_fake_model(home / "fake.gguf", n_ctx_train=args.tokens + 512)
    settings = Settings(data_dir=home / "data", cache_dir=home / "cache", parallel=4,
                        prompt_cache_disk_mb=0, model=str(ref.path), speculate="off")
    settings = dataclasses.replace(settings, n_ctx=args.tokens + 256)
    engine = Engine(settings, backends=[FakeBackend(Script(reply="x" * (args.tokens + 8)))])
    engine.load(str(ref.path))
    port, server = serve(engine, settings)
    try:
        rows: dict[str, list[float]] = defaultdict(list)
        for _ in range(args.rounds):
            for streams in (1, 4):
                rows[f"worker, {streams} stream(s)"].append(
                    worker_figure(engine, streams, args.tokens))
                us, _frames = endpoint_figure(port, streams, args.tokens)
                rows[f"endpoint, {streams} stream(s)"].append(us)
        print(f"\nµs per token per sequence ({args.tokens} tokens a stream, "
              f"{args.rounds} rounds: median, min-max)")
        for name, values in rows.items():
            values.sort()
            print(f"  {name:40s} {values[len(values) // 2]:8.1f}  "
                  f"({values[0]:.1f}-{values[-1]:.1f})")
        for streams in (1, 4):
            for thread, stages in profiled(engine, streams, args.tokens).items():
                print(f"\n{thread} thread, own time by stage, {streams} stream(s), µs per "
                      f"token per sequence (under cProfile, which inflates each call): "
                      f"{sum(stages.values()):.1f} in all")
                for stage, us in sorted(stages.items(), key=lambda kv: -kv[1]):
                    print(f"  {stage:48s} {us:8.1f}")
    finally:
        server.should_exit = True
        engine.close()


if __name__ == "__main__":
    main()
