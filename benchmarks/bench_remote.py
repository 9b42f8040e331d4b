"""What fronting a remote engine costs: the same streamed chat requests sent straight to
an engine and through `localllm serve` registered in front of it, alternating, in one run.

    LLAMA_SERVER=/path/to/llama-server python -m benchmarks.bench_remote [--rounds 10]

The engine is llama.cpp's own server with 8 slots (a batching engine, as vLLM is); without
LLAMA_SERVER it is llama-cpp-python's server, which answers one request at a time, and the
concurrent part is skipped. Reported, medians over the rounds:

- one stream: time to the first token, decode speed (the engine's completion tokens
  after the first, over the time from the first to the last piece), and the paired
  difference in first-token time (localllm minus engine, same round);
- eight streams at once: all their tokens over the time until the last one ends.

With --separate-cores (on a machine with at least two), the engine runs on the first core
(one thread) and localllm and this client on the others, as they would on separate
machines: otherwise the proxy's own CPU time comes out of the engine's.

Each request has its own prompt (a number in it), so neither path finds the other's in
the engine's cache; the order alternates every round. Greedy, 64 tokens.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import psutil

from benchmarks.common import Server, machine, same_kernels
from localllm.models.starter import starter_path
from tests.remote_engines import LlamaCppServer

THREADS = 2
SLOTS = 8
ENGINE_CORES = {0}


class LlamaServer(Server):
    """llama.cpp's server: 8 slots of 1,024 tokens, the backend's kernels."""

    def __init__(self, binary: str, threads: int = THREADS) -> None:
        self.binary = binary
        self.threads = threads
        super().__init__()

    def command(self, *args: str) -> list[str]:
        t = str(self.threads)
        return [self.binary, "-m", str(starter_path()), "--port", str(self.port),
                "-t", t, "-tb", t, "-c", str(1024 * SLOTS), "-np", str(SLOTS), *same_kernels(),
                *args]


def one(base: str, model: str, n: int, tokens: int) -> dict[str, float]:
    body = {
        "model": model,
        "messages": [{"role": "user", "content": f"Request {n}: tell me about the sea."}],
        "max_tokens": tokens,
        "temperature": 0,
        "repeat_penalty": 1.0,  # plain greedy through both paths
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    start = time.perf_counter()
    first = last = None
    pieces = 0
    completion = 0
    with httpx.stream("POST", base + "/v1/chat/completions", json=body, timeout=300) as reply:
        reply.raise_for_status()
        for line in reply.iter_lines():
            if not line.startswith("data:") or line.endswith("[DONE]"):
                continue
            event = json.loads(line[5:])
            completion = (event.get("usage") or {}).get("completion_tokens", completion)
            if event.get("choices") and event["choices"][0].get("delta", {}).get("content"):
                last = time.perf_counter()
                first = first or last
                pieces += 1
    end = time.perf_counter()
    first, last = first or end, last or end
    return {
        "ttft_ms": (first - start) * 1000,
        "decode_tps": (completion - 1) / (last - first) if last > first else 0.0,
        "tokens": float(completion),
        "pieces": float(pieces),
        "total_s": end - start,
    }


def many(base: str, model: str, n: int, tokens: int) -> float:
    """Eight streams at once: completion tokens per second over the wall time."""
    start = time.perf_counter()
    with ThreadPoolExecutor(SLOTS) as pool:
        rows = list(pool.map(lambda i: one(base, model, n * 100 + i, tokens), range(SLOTS)))
    return sum(r["tokens"] for r in rows) / (time.perf_counter() - start)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--separate-cores", action="store_true")
    args = ap.parse_args()
    others = set(range(os.cpu_count() or 1)) - ENGINE_CORES
    if args.separate_cores and not others:
        raise SystemExit("--separate-cores needs at least two cores")
    model = starter_path()
    assert model is not None
    binary = os.environ.get("LLAMA_SERVER")
    with tempfile.TemporaryDirectory() as tmp:
        threads = 1 if args.separate_cores else THREADS
        if binary:
            engine: Any = LlamaServer(binary, threads)
        else:
            engine = LlamaCppServer(Path(tmp), model, "smol", threads=threads)
        name = "llama-server (8 slots)" if binary else "llama-cpp-python's server"
        mid = "starter" if binary else "smol"
        remotes = json.dumps([{"name": "team", "url": engine.base + "/v1"}])
        front = Server(
            "--threads", str(THREADS), "--ctx", "512",
            env={"LOCALLLM_REMOTES": remotes, "LOCALLLM_DATA_DIR": tmp + "/data",
                 "LOCALLLM_CACHE_DIR": tmp + "/cache"},
        )
        if args.separate_cores:
            os.sched_setaffinity(engine.proc.pid, ENGINE_CORES)
            os.sched_setaffinity(front.proc.pid, others)
            os.sched_setaffinity(0, others)
        paths = [("engine", engine.base, mid), ("localllm", front.base, f"team/{mid}")]
        try:
            for _, base, m in paths:  # warm both paths once
                one(base, m, -1, 4)
            runs: dict[str, list[dict[str, float]]] = {"engine": [], "localllm": []}
            crowd: dict[str, list[float]] = {"engine": [], "localllm": []}
            # CPU seconds localllm and the engine spend per token sent through localllm
            cpu = {"localllm": 0.0, "engine": 0.0, "tokens": 0.0}
            procs = {"localllm": psutil.Process(front.proc.pid),
                     "engine": psutil.Process(engine.proc.pid)}
            for r in range(args.rounds):
                for label, base, m in paths if r % 2 == 0 else paths[::-1]:
                    before = {k: sum(p.cpu_times()[:2]) for k, p in procs.items()}
                    row = one(base, m, r * 2 + len(runs[label]), args.tokens)
                    runs[label].append(row)
                    if label == "localllm":
                        for k, p in procs.items():
                            cpu[k] += sum(p.cpu_times()[:2]) - before[k]
                        cpu["tokens"] += row["tokens"]
                    if binary:
                        crowd[label].append(many(base, m, r * 2 + len(crowd[label]), args.tokens))
        finally:
            front.stop()
            engine.stop()
    print(f"machine: {machine()}")
    where = "engine on core 0, one thread; localllm and client on the rest" if (
        args.separate_cores) else "all on the same cores"
    print(f"engine: {name}; {args.rounds} rounds, {args.tokens} tokens, greedy, streamed; "
          f"{where}")
    med: dict[str, dict[str, float]] = {}
    for label, rows in runs.items():
        med[label] = {k: statistics.median(row[k] for row in rows) for k in rows[0]}
        m = med[label]
        line = (f"{label:9s} first token {m['ttft_ms']:6.1f} ms  decode {m['decode_tps']:6.1f} "
                f"tok/s  pieces {m['pieces']:3.0f}")
        if crowd[label]:
            line += f"  8 streams {statistics.median(crowd[label]):6.1f} tok/s"
        print(line)
    e, f = med["engine"], med["localllm"]
    added = statistics.median(
        b["ttft_ms"] - a["ttft_ms"] for a, b in zip(runs["engine"], runs["localllm"], strict=True)
    )
    print(f"localllm / engine: decode {f['decode_tps'] / e['decode_tps']:.3f}x; "
          f"first token +{added:.1f} ms (median of paired differences)", end="")
    if crowd["engine"]:
        ratio = statistics.median(crowd["localllm"]) / statistics.median(crowd["engine"])
        print(f"; 8 streams {ratio:.3f}x")
    else:
        print()
    per_token = {k: cpu[k] / (cpu["tokens"] or 1.0) * 1000 for k in ("localllm", "engine")}
    print(f"CPU per token through localllm (one stream): localllm "
          f"{per_token['localllm']:.2f} ms, engine {per_token['engine']:.2f} ms")


if __name__ == "__main__":
    main()
