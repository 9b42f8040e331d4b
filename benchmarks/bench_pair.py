"""One stream, four streams, a follow-up and a repeat, paired with llama-server on a noisy
machine.

bench_concurrency starts each server afresh for every round and measures each figure
once a round; on a shared two-core VM whose speed moves by a third from minute to
minute, that leaves a few samples per figure. Here both servers stay up side by side
(idle, each costs the other nothing) and take turns request by request, so every
sample of one has a sample of the other taken within seconds of it:

- one stream: three 200-token greedy chat answers a turn; the decode rate after the
  first token (tokens - 1 over the time from the first token to the last);
- four streams: four concurrent 128-token chats; all their tokens over the wall time
  (bench_concurrency's aggregate), and the slowest first token;
- a follow-up: two turns after 300-token answers (bench_concurrency's), the first token
  of each; then the same short chat request three times again: the first token of each.

The ratio of medians and the share of turns localllm won are printed for each.
Set LLAMA_SERVER to llama-server's path (see bench_concurrency).
Run: python -m benchmarks.bench_pair [--rounds 8] [--model PATH]
"""

from __future__ import annotations

import argparse
import os
import statistics
import uuid
from typing import Any

from benchmarks.bench_concurrency import (
    LlamaServer,
    chat,
    concurrent,
    follow_ups,
    localllm_flags,
    repeats,
    setup,
    story,
)
from benchmarks.common import Server


def one_stream(base: str) -> tuple[int, list[float]]:
    """Tokens of three answers, and their decode rates (tokens/s after the first token)."""
    tokens, rates = 0, []
    for _ in range(3):
        r = chat(base, story("the sea", uuid.uuid4().hex[:8]), 200)
        tokens += r.tokens
        if r.tokens > 1 and r.total > r.ttft:
            rates.append((r.tokens - 1) / (r.total - r.ttft))
    return tokens, rates


def main() -> None:
    args = setup(argparse.ArgumentParser(), rounds=8)
    binary = os.environ.get("LLAMA_SERVER")
    if not binary:
        raise SystemExit("set LLAMA_SERVER to llama-server's path")
    flags = localllm_flags()
    servers: dict[str, Any] = {}
    try:
        servers["localllm"] = Server(*flags)
        servers["llama-server"] = LlamaServer(binary)
        names = list(servers)
        one: dict[str, list[float]] = {n: [] for n in names}
        four: dict[str, list[float]] = {n: [] for n in names}
        first: dict[str, list[float]] = {n: [] for n in names}
        follow: dict[str, list[float]] = {n: [] for n in names}
        again: dict[str, list[float]] = {n: [] for n in names}
        won = {"one": 0, "four": 0}
        for rnd in range(args.rounds):
            order = names if rnd % 2 == 0 else names[::-1]
            turn_one: dict[str, float] = {}
            turn_four: dict[str, float] = {}
            for name in order:
                base = servers[name].base
                _, rates = one_stream(base)
                one[name] += rates
                turn_one[name] = statistics.median(rates)
                agg, _, slowest = concurrent(base, uuid.uuid4().hex[:8])
                four[name].append(agg)
                first[name].append(slowest * 1000)
                turn_four[name] = agg
                salt = uuid.uuid4().hex[:8]
                follow[name] += [r.ttft * 1000 for r in follow_ups(base, salt, turns=2)]
                again[name] += [r.ttft * 1000 for r in repeats(base, salt)]
            won["one"] += turn_one["localllm"] >= turn_one["llama-server"]
            won["four"] += turn_four["localllm"] >= turn_four["llama-server"]
            print(
                rnd, {n: (round(turn_one[n], 1), round(turn_four[n], 1)) for n in names}, flush=True
            )
    finally:
        for server in servers.values():
            server.stop()

    def line(what: str, rows: dict[str, list[float]], wins: int | None) -> None:
        a, b = (statistics.median(rows[n]) for n in names)
        span = "  ".join(f"{n} {min(rows[n]):.1f}-{max(rows[n]):.1f}" for n in names)
        tail = f", localllm ahead in {wins} of {args.rounds} turns" if wins is not None else ""
        print(f"{what:34} {a:8.1f} {b:8.1f}  ratio {a / b:.3f}{tail}  ({span})")

    print(f"\nmedians over {args.rounds} turns{'':12}{names[0]:>8} {names[1]:>8}")
    line("one stream, decode tokens/s", one, won["one"])
    line("four streams, aggregate tokens/s", four, won["four"])
    line("four streams, slowest first token ms", first, None)
    line("follow-up, first token ms", follow, None)
    line("the same request again, first token ms", again, None)


if __name__ == "__main__":
    main()
