"""Every figure of bench_concurrency, paired with llama-server on a noisy machine.

bench_concurrency starts each server afresh for every round and measures each figure
once a round; on a shared two-core VM whose speed moves by a third from minute to
minute, that leaves a few samples per figure. Here both servers stay up side by side
(idle, each costs the other nothing) and take turns, figure by figure, so every sample
of one has a sample of the other taken within seconds of it:

- one stream: three 200-token greedy chat answers a turn; the decode rate after the
  first token (tokens - 1 over the time from the first token to the last);
- four streams: four concurrent 128-token chats; all their tokens over the wall time
  (bench_concurrency's aggregate), and the slowest first token;
- a 16-token completion on the idle server, and the same while a chat answer streams;
- a follow-up: two turns after 300-token answers (bench_concurrency's), the first token
  of each; then the same short chat request three times again: the first token of each;
- interleaved conversations (four, each with a ~1,000-token system prompt, six turns):
  the first token of turns 2-6;
- a cold prompt of about 1,600 tokens: the whole request (one token).

The ratio of medians is printed for each, and for the figures measured once a turn the
share of turns localllm did better. Set LLAMA_SERVER to llama-server's path (see
bench_concurrency).
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
    cold_prefill,
    completion_during_chat,
    concurrent,
    follow_ups,
    interleaved,
    localllm_flags,
    repeats,
    setup,
    story,
)
from benchmarks.common import Server

# (label, higher is better, measured once a turn: the share of turns is printed)
FIGURES = {
    "one": ("one stream, decode tokens/s", True, True),
    "four": ("four streams, aggregate tokens/s", True, True),
    "slowest": ("four streams, slowest first token ms", False, False),
    "idle": ("16-token completion, idle, ms", False, True),
    "busy": ("the same during a chat answer, ms", False, True),
    "follow": ("follow-up, first token ms", False, False),
    "again": ("the same request again, first token ms", False, False),
    "inter": ("interleaved, first token of turns 2-6 ms", False, False),
    "cold": ("cold prompt of ~1,600 tokens, s", False, True),
}


def one_stream(base: str) -> tuple[int, list[float]]:
    """Tokens of three answers, and their decode rates (tokens/s after the first token)."""
    tokens, rates = 0, []
    for _ in range(3):
        r = chat(base, story("the sea", uuid.uuid4().hex[:8]), 200)
        tokens += r.tokens
        if r.tokens > 1 and r.total > r.ttft:
            rates.append((r.tokens - 1) / (r.total - r.ttft))
    return tokens, rates


def one_turn(base: str) -> dict[str, list[float]]:
    """Every figure once on one server: its samples, by FIGURES' keys."""
    _, rates = one_stream(base)
    agg, _, slowest = concurrent(base, uuid.uuid4().hex[:8])
    idle, busy = completion_during_chat(base, uuid.uuid4().hex[:8])
    salt = uuid.uuid4().hex[:8]
    follow = [r.ttft * 1000 for r in follow_ups(base, salt, turns=2)]
    again = [r.ttft * 1000 for r in repeats(base, salt)]
    inter = [r.ttft * 1000 for r in interleaved(base, uuid.uuid4().hex[:8])]
    cold, _ = cold_prefill(base, uuid.uuid4().hex[:8])
    return {
        "one": rates,
        "four": [agg],
        "slowest": [slowest * 1000],
        "idle": [idle * 1000],
        "busy": [busy * 1000],
        "follow": follow,
        "again": again,
        "inter": inter,
        "cold": [cold],
    }


def main() -> None:
    args = setup(argparse.ArgumentParser(), rounds=8)
    binary = os.environ.get("LLAMA_SERVER")
    if not binary:
        raise SystemExit("set LLAMA_SERVER to llama-server's path")
    flags = localllm_flags()
    servers: dict[str, Any] = {}
    rows: dict[str, dict[str, list[float]]] = {key: {} for key in FIGURES}
    won = dict.fromkeys(FIGURES, 0)
    try:
        servers["localllm"] = Server(*flags)
        servers["llama-server"] = LlamaServer(binary)
        names = list(servers)
        for key in FIGURES:
            rows[key] = {n: [] for n in names}
        for rnd in range(args.rounds):
            order = names if rnd % 2 == 0 else names[::-1]
            turn = {name: one_turn(servers[name].base) for name in order}
            for key, (_, higher, _) in FIGURES.items():
                mine, theirs = (statistics.median(turn[n][key]) for n in names)
                won[key] += mine >= theirs if higher else mine <= theirs
                for n in names:
                    rows[key][n] += turn[n][key]
            print(
                rnd,
                {n: {k: round(statistics.median(v), 1) for k, v in turn[n].items()} for n in names},
                flush=True,
            )
    finally:
        for server in servers.values():
            server.stop()

    def line(key: str) -> None:
        what, _, per_turn = FIGURES[key]
        a, b = (statistics.median(rows[key][n]) for n in names)
        span = "  ".join(f"{n} {min(rows[key][n]):.2f}-{max(rows[key][n]):.2f}" for n in names)
        share = f", localllm better in {won[key]} of {args.rounds} turns"
        print(
            f"{what:42} {a:8.2f} {b:8.2f}  ratio {a / b:.3f}{share if per_turn else ''}  ({span})"
        )

    print(f"\nmedians over {args.rounds} turns{'':20}{names[0]:>8} {names[1]:>8}")
    for key in FIGURES:
        line(key)


if __name__ == "__main__":
    main()
