"""Which sampling gives the starter (SmolLM2-135M-Instruct Q4_1) its best answers, on
both kinds of question a user asks:

- short questions with checkable answers (benchmarks/short_answers.py: capitals,
  arithmetic, one-word definitions, "reply with the single word X", code one-liners),
  each asked with several seeds and scored right or wrong;
- long answers (code, a story, an explanation) with several seeds, each read by the
  chat's loop guard (tui/loop_guard.py): an answer that repeats a line or sentence
  verbatim four times in a row, or a block of lines three times, counts as a loop. Also
  counted: answers that hit the token limit, and how varied the words are (distinct
  word pairs over all pairs, a loop's words repeat).

DRY (llama.cpp's "don't repeat yourself" sampler, as llama-server offers it) is measured
through a sampler chain built here (the product does not offer it).

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
from benchmarks.short_answers import SHORT, right
from localllm.agent.loop_guard import LoopGuard
from localllm.backends.base import Message, SamplingParams
from localllm.config import Settings
from localllm.engine.engine import Engine
from localllm.engine.request import Request

PROMPTS = {
    "code": "Write a Python function that checks whether a number is prime, with a short "
    "explanation.",
    "story": "Write a short story about a lighthouse keeper who finds a message in a bottle.",
    "explain": "Explain how a refrigerator keeps food cold, in simple terms.",
}
# every candidate sets the repeat penalty itself: one left unset takes the starter's
# default (models/sampling.py), and "no penalty" would not be what it says
CARD = {"temperature": 0.2, "top_p": 0.9}
NONE = {"repeat_penalty": 1.0}
ANSWER_ONLY = {"penalize_prompt": False}  # the penalty counts the answer's tokens only
CANDIDATES: dict[str, dict[str, Any]] = {
    "t 0.2, top-p 0.9, no penalty": {**CARD, **NONE},
    "t 0.2, repeat 1.1 over the last 64 (prompt too)": {**CARD, "repeat_penalty": 1.1},
    "t 0.2, repeat 1.1 over the answer only": {**CARD, "repeat_penalty": 1.1, **ANSWER_ONLY},
    "t 0.2, repeat 1.2 over the answer only": {**CARD, "repeat_penalty": 1.2, **ANSWER_ONLY},
    "t 0.2, DRY 0.8/1.75/2": {**CARD, **NONE, "dry": 0.8},
    "t 0.5, repeat 1.1 over the answer only": {
        "temperature": 0.5, "top_p": 0.9, "repeat_penalty": 1.1, **ANSWER_ONLY
    },
}
SHORT_TOKENS = 48
DRY_BASE, DRY_ALLOWED = 1.75, 2  # llama-server's defaults beside a multiplier of 0.8
# llama-server's dry_penalty_last_n of -1 means the context; this llama.cpp's sampler
# reads -1 as 0 (off), so the window is given in tokens: more than any prompt and answer
DRY_LAST_N = 4096
DRY_BREAKERS = ("\n", ":", '"', "*")


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


def _answer(engine: Engine, prompt: str, values: dict[str, Any], **more: Any) -> Any:
    values = {k: v for k, v in values.items() if k != "dry"}
    params = SamplingParams.asked(**values, **more)
    return list(engine.generate(Request(params, messages=[Message("user", prompt)])))


def run(engine: Engine, values: dict[str, Any], seeds: list[int], tokens: int) -> Tally:
    tally = Tally()
    for seed in seeds:
        for name, prompt in PROMPTS.items():
            chunks = _answer(engine, prompt, values, seed=seed, max_tokens=tokens)
            tally.add(name, "".join(c.text for c in chunks), chunks[-1].finish_reason)
    return tally


def short(engine: Engine, values: dict[str, Any], seeds: list[int]) -> tuple[int, int, list]:
    """Right answers of all the short ones, and the prompts missed (with an answer)."""
    ok, n, missed = 0, 0, []
    for seed in seeds:
        for _kind, prompt, pattern in SHORT:
            chunks = _answer(engine, prompt, values, seed=seed, max_tokens=SHORT_TOKENS)
            text = "".join(c.text for c in chunks)
            n += 1
            if right(text, pattern):
                ok += 1
            elif seed == seeds[0]:
                missed.append((prompt, text[:80]))
    return ok, n, missed


def dry_chain(multiplier: float) -> Any:
    """localllm's llama.cpp sampler chain with DRY after the penalties (llama-server's
    order), primed with the whole prompt as llama-server primes it."""
    import ctypes

    def chain(ll: Any, vocab: Any, params: SamplingParams, history: Any) -> Any:
        c = ll.llama_sampler_chain_init(ll.llama_sampler_chain_default_params())
        add = ll.llama_sampler_chain_add
        breakers = (ctypes.c_char_p * len(DRY_BREAKERS))(*(b.encode() for b in DRY_BREAKERS))
        add(
            c,
            ll.llama_sampler_init_dry(
                vocab, multiplier, DRY_BASE, DRY_ALLOWED, DRY_LAST_N, breakers, len(DRY_BREAKERS)
            ),
        )
        if params.temperature <= 0:
            add(c, ll.llama_sampler_init_greedy())
        else:
            add(c, ll.llama_sampler_init_top_k(params.top_k))
            add(c, ll.llama_sampler_init_top_p(params.top_p, 1))
            add(c, ll.llama_sampler_init_min_p(params.min_p, 1))
            add(c, ll.llama_sampler_init_temp(params.temperature))
            add(c, ll.llama_sampler_init_dist((params.seed or 0) & 0xFFFFFFFF))
        for tok in history:
            ll.llama_sampler_accept(c, tok)
        return c

    return chain


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seeds", type=int, default=8)
    parser.add_argument("--short-seeds", type=int, default=3)
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
            restore = _with_dry(values.get("dry"))
            try:
                ok, n, missed = short(engine, values, list(range(1, args.short_seeds + 1)))
                tally = run(engine, values, list(range(1, args.seeds + 1)), args.tokens)
            finally:
                restore()
            rows.append(
                {
                    "candidate": label,
                    "values": values,
                    "short_right": ok,
                    "short": n,
                    "missed": missed,
                    "answers": tally.answers,
                    "loops": tally.loops,
                    "looped": sorted(set(tally.looped)),
                    "at_limit": tally.at_limit,
                    "distinct_pairs": round(len(tally.distinct) / max(1, tally.pairs), 3),
                    "seconds": round(time.perf_counter() - t0, 1),
                }
            )
            print(json.dumps(rows[-1]), flush=True)
    finally:
        engine.close()
    if args.json:
        print(json.dumps({"machine": machine(), "rows": rows}, indent=2))
        return
    print(
        f"\n{machine()}; short: {len(SHORT)} prompts x {args.short_seeds} seeds, "
        f"{SHORT_TOKENS} tokens; long: {args.seeds} seeds x {len(PROMPTS)} prompts, "
        f"{args.tokens} tokens"
    )
    print(
        "| sampling | short answers right | long answers looping | at the token limit "
        "| distinct word pairs |"
    )
    print("|---|---:|---:|---:|---:|")
    for r in rows:
        print(
            f"| {r['candidate']} | {r['short_right']}/{r['short']} | {r['loops']}/{r['answers']}"
            f" | {r['at_limit']}/{r['answers']} | {r['distinct_pairs']:.3f} |"
        )


def _with_dry(multiplier: float | None) -> Any:
    """Swap DRY into the llama.cpp backend's sampler chain for one candidate; the undo."""
    from localllm.backends import llamacpp

    if not multiplier:
        return lambda: None
    original = llamacpp.sampler_chain
    llamacpp.sampler_chain = dry_chain(multiplier)  # type: ignore[assignment]

    def restore() -> None:
        llamacpp.sampler_chain = original  # type: ignore[assignment]

    return restore


if __name__ == "__main__":
    main()
