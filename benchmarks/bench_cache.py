"""The engine's prompt cache, three ways, each in one run (issue: KV cache reuse).

(a) A 1,500-token shared prefix plus a 20-token question: time to first token cold,
    and warm after another conversation has used the model in between (the prefix
    state is parked and restored).
(b) Four conversations, six turns each, round robin, each with its own ~400-token
    system prompt: prompt tokens actually prefilled and time to first token per
    turn, for localllm's engine, the same engine with no cache (nothing kept, an
    unrelated prompt before each turn), llama-cpp-python's `Llama` (one state, reused
    by longest prefix), and one conversation alone on localllm (the warm reference).
(c) A follow-up after a restart of the engine, with and without the disk tier.
(d) A new conversation in the one slot a ~2,800-token conversation held, which the
    cache parks first (to RAM, and to disk when the disk tier is on): time to first
    token, against the same after a short conversation.

Starter model, two threads, greedy, 16 new tokens per answer, llama.cpp backend.

    python -m benchmarks.bench_cache
"""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path

from benchmarks.common import machine
from localllm.backends.base import Message, SamplingParams
from localllm.backends.llamacpp_native import plain_cpu_buffers
from localllm.config import Settings
from localllm.engine.engine import Engine
from localllm.engine.request import Request

THREADS = 2
ANSWER = SamplingParams(temperature=0.0, max_tokens=16)
TOPICS = ("rivers", "mountains", "deserts", "forests")


def engine(root: Path, **kw: object) -> Engine:
    values: dict = {"n_threads": THREADS, "n_ctx": 4096, "data_dir": root / "data",
                    "cache_dir": root / "cache", "prompt_cache_ram_mb": 2048,
                    "prompt_cache_disk_mb": 0}
    values.update(kw)
    return Engine(Settings(**values))


def ask(e: Engine, messages: list[Message]) -> tuple[str, float, int, int]:
    """Answer text, time to first token (s), prompt tokens, prefilled prompt tokens."""
    t0 = time.perf_counter()
    first, text, final = None, [], None
    for chunk in e.generate(Request(ANSWER, messages=messages)):
        if first is None and chunk.tokens:
            first = time.perf_counter() - t0
        text.append(chunk.text)
        final = chunk
    assert final is not None and final.stats is not None
    s = final.stats
    return "".join(text), first or 0.0, s.prompt_tokens, s.prompt_tokens - s.cached_tokens


def prefix_text(words: int) -> str:
    lines = [f"Rule {i}: answers about the archive cite the shelf and the box number."
             for i in range(words)]
    return " ".join(lines)


def part_a(root: Path) -> None:
    e = engine(root / "a")
    try:
        shared = Message("system", prefix_text(86))  # about 1,500 tokens
        other = Message("system", prefix_text(86).replace("archive", "museum"))
        ask(e, [Message("user", "Zebra crossing")])
        q1 = Message("user", "Where is the first volume of the town records kept, exactly?")
        q2 = Message("user", "Which shelf holds the maps of the harbour from the old survey?")
        _, cold, n_prompt, _ = ask(e, [shared, q1])
        ask(e, [other, q1])  # another conversation takes the model in between
        _, warm, _, prefilled = ask(e, [shared, q2])
        print(f"(a) prefix + question: {n_prompt} prompt tokens; first token cold "
              f"{cold * 1000:.0f} ms, warm {warm * 1000:.0f} ms after another conversation "
              f"({prefilled} tokens prefilled); warm/cold = {warm / cold:.3f}")
    finally:
        e.close()


def conversations(e_ask: object, rounds: int = 6) -> tuple[list[float], int, int]:
    """Run four conversations round robin; return per-turn TTFT, prompt and prefilled sums."""
    chats = {t: [Message("system", f"You are a guide to {t}. " + prefix_text(30))]
             for t in TOPICS}
    ttfts, total, prefilled = [], 0, 0
    for turn in range(rounds):
        for topic in TOPICS:
            msgs = chats[topic]
            msgs.append(Message("user", f"Tell me fact {turn + 1} about {topic}."))
            text, ttft, n, pre = e_ask(msgs)  # type: ignore[operator]
            msgs.append(Message("assistant", text))
            ttfts.append(ttft)
            total += n
            prefilled += pre
    return ttfts, total, prefilled


def part_b(root: Path) -> None:
    import llama_cpp

    from localllm.models.store import ModelStore

    e = engine(root / "b")
    cold = engine(root / "b-cold", prompt_cache_ram_mb=0)
    try:
        t_ours, total, pre_ours = conversations(lambda m: ask(e, m))

        def ask_cold(m: list[Message]) -> tuple[str, float, int, int]:
            ask(cold, [Message("user", "Zebra crossing")])
            return ask(cold, m)

        t_cold, _, pre_cold = conversations(ask_cold)
        alone = engine(root / "b-alone")
        try:
            one = {"rivers": [Message("system", "You are a guide to rivers. "
                                                + prefix_text(30))]}
            t_alone = []
            for turn in range(6):
                msgs = one["rivers"]
                msgs.append(Message("user", f"Tell me fact {turn + 1} about rivers."))
                text, ttft, _, _ = ask(alone, msgs)
                msgs.append(Message("assistant", text))
                t_alone.append(ttft)
        finally:
            alone.close()
        # llama-cpp-python's Llama on the same prompt tokens (rendered by localllm)
        ref = ModelStore(Path("/nonexistent")).resolve("starter")
        with plain_cpu_buffers():
            llm = llama_cpp.Llama(str(ref.path), n_ctx=4096, n_threads=THREADS, verbose=False)
        render = e.residency.default.model.render_chat  # type: ignore[union-attr]

        def ask_llama(m: list[Message]) -> tuple[str, float, int, int]:
            tokens = render(m)
            held = list(llm._input_ids)
            common = 0
            while common < min(len(held), len(tokens) - 1) and held[common] == tokens[common]:
                common += 1
            t0 = time.perf_counter()
            first, parts = None, []
            for ev in llm.create_completion(tokens, max_tokens=16, temperature=0.0,
                                            stream=True):
                if first is None:
                    first = time.perf_counter() - t0
                parts.append(ev["choices"][0]["text"])
            return "".join(parts), first or 0.0, len(tokens), len(tokens) - common

        t_llama, _, pre_llama = conversations(ask_llama)
        warm_ref = statistics.median(t_alone[1:])
        worst = max(t_ours[len(TOPICS):])  # turns 2-6: every conversation has history
        print(f"(b) 4 conversations x 6 turns round robin, {total} prompt tokens in all")
        print("| run | prompt tokens prefilled | share of the no-cache run | "
              "first token, median | first token, worst (turns 2-6) |")
        print("|---|---:|---:|---:|---:|")
        for name, pre, t in (("localllm engine (prompt cache)", pre_ours, t_ours),
                             ("localllm engine, no cache", pre_cold, t_cold),
                             ("llama-cpp-python `Llama` (one state)", pre_llama, t_llama)):
            print(f"| {name} | {pre} | {pre / pre_cold:.1%} | "
                  f"{statistics.median(t) * 1000:.0f} ms | "
                  f"{max(t[len(TOPICS):]) * 1000:.0f} ms |")
        print(f"one conversation alone on localllm, turns 2-6: first token median "
              f"{warm_ref * 1000:.0f} ms; worst interleaved turn / that = "
              f"{worst / warm_ref:.2f}")
    finally:
        e.close()
        cold.close()


def part_c(root: Path) -> None:
    shared = Message("system", prefix_text(86))
    turn1 = [shared, Message("user", "Where is the first volume of the town records kept?")]
    for disk_mb in (1024, 0):
        where = root / f"c-{disk_mb}"
        first = engine(where, prompt_cache_disk_mb=disk_mb)
        text, _, _, _ = ask(first, turn1)
        first.close()  # the restart
        again = engine(where, prompt_cache_disk_mb=disk_mb)
        try:
            follow = [*turn1, Message("assistant", text), Message("user", "And the second?")]
            _, ttft, n, pre = ask(again, follow)
        finally:
            again.close()
        label = "with the disk tier" if disk_mb else "without the disk tier"
        print(f"(c) follow-up after a restart {label}: {n} prompt tokens, {pre} prefilled, "
              f"first token {ttft * 1000:.0f} ms")


def part_d(root: Path) -> None:
    new = [Message("user", "Name three rivers of Europe.")]
    for disk_mb in (1024, 0):
        e = engine(root / f"d-{disk_mb}", prompt_cache_disk_mb=disk_mb, parallel=1)
        try:
            ask(e, [Message("user", "Zebra crossing")])
            _, after_short, _, _ = ask(e, new)
            _, _, n_long, _ = ask(e, [Message("system", prefix_text(160)), *new])
            _, after_long, _, _ = ask(e, new)
        finally:
            e.close()
        label = "with the disk tier" if disk_mb else "without the disk tier"
        print(f"(d) new conversation {label}: first token {after_long * 1000:.0f} ms after a "
              f"{n_long}-token one, {after_short * 1000:.0f} ms after a short one")


def main() -> None:
    print(f"Machine: {machine()}")
    with tempfile.TemporaryDirectory(prefix="bench-cache-") as tmp:
        root = Path(tmp)
        part_a(root)
        part_b(root)
        part_c(root)
        part_d(root)


if __name__ == "__main__":
    main()
