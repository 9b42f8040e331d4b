"""What keys, origin checks and accounting cost: decode speed through a server that
requires a key against one that has none, in the same run, and /metrics with 100 keys.

    python -m benchmarks.bench_auth [--rounds 11] [--tokens 128]

Two `localllm serve` processes on the starter, each with its own data directory; one
has 100 keys (with usage counted for them), the other none. Requests alternate between
them, one at a time, streamed as a client reads them; tokens/s counts from the first
token to the last. Then /metrics is fetched from the keyed server (with its key) over
one kept-alive connection and timed, request to full body.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from benchmarks.common import Server, machine


def stream_tps(base: str, tokens: int, key: str | None, salt: int) -> float:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    body = {
        "messages": [{"role": "user", "content": f"({salt}) Tell me a long story about a fox."}],
        "max_tokens": tokens,
        "temperature": 0,
        "stream": True,
    }
    first = last = 0.0
    count = 0
    with httpx.stream("POST", base + "/v1/chat/completions", json=body, headers=headers,
                      timeout=120) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data: {"):
                continue
            delta = json.loads(line[6:])["choices"]
            if delta and delta[0]["delta"].get("content"):
                count += 1  # frames, not tokens: see the per-run token count below
                last = time.perf_counter()
                if not first:
                    first = last
    return count / (last - first) if last > first else 0.0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=11)
    ap.add_argument("--tokens", type=int, default=128)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp())
    env_keyed = {"LOCALLLM_DATA_DIR": str(tmp / "keyed"), "LOCALLLM_CACHE_DIR": str(tmp / "c1")}
    env_open = {"LOCALLLM_DATA_DIR": str(tmp / "open"), "LOCALLLM_CACHE_DIR": str(tmp / "c2")}
    keys = []
    for i in range(100):
        done = subprocess.run(
            [sys.executable, "-m", "localllm", "keys", "add", f"client-{i}"],
            env={**__import__("os").environ, **env_keyed}, capture_output=True, text=True,
            check=True,
        )
        keys.append(done.stdout.strip().splitlines()[-1])
    # frames every 0 ms: one frame per token, so frames/s is tokens/s
    keyed = Server("--threads", "2", env={**env_keyed, "LOCALLLM_STREAM_INTERVAL_MS": "0"})
    open_ = Server("--threads", "2", env={**env_open, "LOCALLLM_STREAM_INTERVAL_MS": "0"})
    try:
        for warm in (keyed, open_):
            stream_tps(warm.base, 16, keys[0] if warm is keyed else None, -1)
        with_key, without = [], []
        for i in range(args.rounds):
            pair = [(keyed, keys[i % len(keys)]), (open_, None)]
            if i % 2:
                pair.reverse()
            for server, key in pair:
                tps = stream_tps(server.base, args.tokens, key, i)
                (with_key if key else without).append(tps)
        ratios = [a / b for a, b in zip(with_key, without, strict=True)]
        times = []
        # one kept-alive connection, as Prometheus scrapes (a new httpx client per request
        # costs ~15 ms of its own setup, which is not the server's)
        with httpx.Client(headers={"Authorization": f"Bearer {keys[0]}"}) as scraper:
            for _ in range(50):
                t0 = time.perf_counter()
                r = scraper.get(keyed.base + "/metrics")
                times.append((time.perf_counter() - t0) * 1000)
                r.raise_for_status()
    finally:
        keyed.stop()
        open_.stop()
    print(f"machine: {machine()}")
    print(f"rounds: {args.rounds}, {args.tokens} tokens each, order alternating")
    print(f"with a key (100 keys):  median {statistics.median(with_key):.1f} tok/s  {with_key}")
    print(f"without keys:           median {statistics.median(without):.1f} tok/s  {without}")
    print(f"ratio per round: median {statistics.median(ratios):.3f}, "
          f"ratio of medians {statistics.median(with_key) / statistics.median(without):.3f}")
    print(f"/metrics with 100 keys: median {statistics.median(times):.2f} ms, "
          f"max {max(times):.2f} ms over 50")


if __name__ == "__main__":
    main()
