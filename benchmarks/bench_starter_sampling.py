"""Which sampling gives the starter (SmolLM2-135M-Instruct Q4_1) its best answers: each
candidate answers a fixed set of prompts (code, a story, an explanation) with several
seeds, and each answer is read by the chat's loop guard (tui/loop_guard.py): an answer
that repeats a line or sentence verbatim four times in a row, or a block of lines three
times, counts as a loop. Also counted: answers that hit the token limit, and how varied
the words are (distinct word pairs over all pairs, a loop's words repeat).

The chosen values become the starter's defaults (models/sampling.py); a request's or a
conversation's own values still win. Run: python -m benchmarks.bench_starter_sampling
"""

from __future__ import annotations

import argparse
import itertools
import json
import time
from dataclasses import dataclass, field
from typing import Any

from benchmarks.common import machine
from localllm.backends.base import Message, SamplingParams
from localllm.config import Settings
from localllm.engine.engine import Engine
from localllm.engine.request import Request
from localllm.tui.loop_guard import LoopGuard

PROMPTS = {
    "code": "Write a Python function that checks whether a number is prime, with a short "
    "explanation.",
    "story": "Write a short story about a lighthouse keeper who finds a message in a bottle.",
    "explain": "Explain how a refrigerator keeps food cold, in simple terms.",
}
CANDIDATES: dict[str, dict[str, float]] = {
    "card (t 0.2, top-p 0.9)": {"temperature": 0.2, "top_p": 0.9},
    "t 0.2, repeat 1.1": {"temperature": 0.2, "top_p": 0.9, "repeat_penalty": 1.1},
    "t 0.5, top-p 0.9": {"temperature": 0.5, "top_p": 0.9},
    "t 0.5, repeat 1.1": {"temperature": 0.5, "top_p": 0.9, "repeat_penalty": 1.1},
    "t 0.7, top-p 0.9, repeat 1.1": {"temperature": 0.7, "top_p": 0.9, "repeat_penalty": 1.1},
    "t 0.3, presence 0.5": {"temperature": 0.3, "top_p": 0.9, "presence_penalty": 0.5},
}


@dataclass
class Tally:
    answers: int = 0
    loops: int = 0
    at_limit: int = 0
    pairs: int = 0
    distinct: set[tuple[str, str]] = field(default_factory=set)
    looped: list[str] = field(default_factory=list)

    def add(self, prompt: str, text: str, finish: str | None) -> None:
        guard = LoopGuard()
        guard.feed(text + "\n")
        self.answers += 1
        if guard.tripped is not None:
            self.loops += 1
            self.looped.append(prompt)
        self.at_limit += finish == "length"
        words = text.split()
        self.pairs += max(0, len(words) - 1)
        self.distinct |= set(itertools.pairwise(words))


def run(engine: Engine, values: dict[str, float], seeds: list[int], tokens: int) -> Tally:
    tally = Tally()
    for seed in seeds:
        for name, prompt in PROMPTS.items():
            params = SamplingParams.asked(seed=seed, max_tokens=tokens, **values)
            chunks = list(engine.generate(Request(params, messages=[Message("user", prompt)])))
            tally.add(name, "".join(c.text for c in chunks), chunks[-1].finish_reason)
    return tally


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seeds", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=400)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--only", nargs="*", help="candidates whose label holds one of these")
    args = parser.parse_args()
    engine = Engine(Settings(model="starter", prompt_cache_disk_mb=0))
    engine.load("starter")
    rows: list[dict[str, Any]] = []
    try:
        for label, values in CANDIDATES.items():
            if args.only and not any(o in label for o in args.only):
                continue
            t0 = time.perf_counter()
            tally = run(engine, values, list(range(1, args.seeds + 1)), args.tokens)
            rows.append({
                "candidate": label,
                "values": values,
                "answers": tally.answers,
                "loops": tally.loops,
                "looped": sorted(set(tally.looped)),
                "at_limit": tally.at_limit,
                "distinct_pairs": round(len(tally.distinct) / max(1, tally.pairs), 3),
                "seconds": round(time.perf_counter() - t0, 1),
            })
            print(json.dumps(rows[-1]), flush=True)
    finally:
        engine.close()
    if args.json:
        print(json.dumps({"machine": machine(), "rows": rows}, indent=2))
        return
    print(f"\n{machine()}; {args.seeds} seeds x {len(PROMPTS)} prompts, {args.tokens} tokens")
    print("| sampling | loops | at the token limit | distinct word pairs |")
    print("|---|---:|---:|---:|")
    for r in rows:
        print(f"| {r['candidate']} | {r['loops']}/{r['answers']} | {r['at_limit']}/{r['answers']}"
              f" | {r['distinct_pairs']:.3f} |")


if __name__ == "__main__":
    main()
