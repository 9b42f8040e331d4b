"""Many clients at once: localllm's endpoint beside llama.cpp's own llama-server, in one run.

Both serve the starter model on two threads with four parallel sequences of 4,096
tokens each, and are asked the same things over HTTP, one server at a time, in
alternating order over `--rounds` rounds:

- four concurrent chat streams of up to 128 tokens: aggregate tokens/s (all tokens
  over the wall time), against one stream alone, and the slowest first token;
- a 16-token `/v1/completions` request sent while a chat answer streams, against the
  same request on the idle server;
- follow-up turns after answers of up to 300 tokens: time to the first token of the
  next turn and the share of its prompt that came from the cache;
- four conversations taking turns (six turns each, a ~1,000-token system prompt of
  their own): median time to the first token of turns 2-6;
- a cold prompt of about 1,600 tokens: time to its first token;
- the same chat request again (a client's retry, a regenerate at temperature 0): the
  median time to the first token of three repeats.

`--mlx` measures instead localllm on the MLX backend (the starter imported): four
concurrent streams of 32 tokens against one stream alone.

llama-server comes from the llama.cpp source in the pinned llama-cpp-python sdist
(see docs/benchmarks.md); set LLAMA_SERVER to its path (LD_LIBRARY_PATH to its
folder). Without it only localllm is measured. Run: python -m benchmarks.bench_concurrency
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from benchmarks.common import Server, machine, same_kernels
from localllm.models.starter import starter_path

THREADS = 2
PARALLEL = 4
CTX = 4096
MODEL = {"path": "", "id": "starter"}  # --model: another GGUF on both servers
TOPICS = ["the sea", "a mountain village", "an old clockmaker", "a journey by train"]
# one client kept for the whole run, as a real client keeps one: a new httpx client per
# request spends ~23 ms of this machine's CPU on its TLS context inside every timed figure.
# A new connection for each request (~0.2 ms here): llama-server (the pinned build) closes
# some kept-alive connections after a streamed answer, and a request sent on one fails
# ("Server disconnected"; 4 of 12 short chats in a row here, localllm 0 of 12)
HTTP = httpx.Client(timeout=300, limits=httpx.Limits(max_keepalive_connections=0))


@dataclass
class Result:
    ttft: float
    total: float
    tokens: int
    prompt_tokens: int = 0
    cached: int = 0
    text: str = ""


class LlamaServer(Server):
    """llama.cpp's own server on the same model, threads and slots."""

    def __init__(self, binary: str) -> None:
        self.binary = binary
        super().__init__()

    def command(self, *args: str) -> list[str]:
        cmd = [self.binary, "-m", MODEL["path"] or str(starter_path()), "--port", str(self.port)]
        cmd += ["-t", str(THREADS), "-tb", str(THREADS)]
        cmd += ["-c", str(CTX * PARALLEL), "-np", str(PARALLEL)]
        return [*cmd, *same_kernels(), *args]


def stream(base: str, path: str, body: dict[str, Any]) -> Result:
    """One streamed request: time to first text, total time, tokens, cache figures."""
    body = {**body, "stream": True, "stream_options": {"include_usage": True}}
    t0 = time.perf_counter()
    ttft, usage, timings, parts = 0.0, {}, {}, []
    with HTTP.stream("POST", base + path, json=body) as resp:
        resp.raise_for_status()
        for line in resp.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[6:])
            usage = event.get("usage") or usage
            timings = event.get("timings") or timings
            for choice in event.get("choices") or []:
                text = (choice.get("delta") or {}).get("content") or choice.get("text") or ""
                if text and not ttft:
                    ttft = time.perf_counter() - t0
                parts.append(text)
    total = time.perf_counter() - t0
    tokens = int(usage.get("completion_tokens") or timings.get("predicted_n") or 0)
    prompt = int(usage.get("prompt_tokens") or 0)
    details = usage.get("prompt_tokens_details") or {}
    cached = int(details.get("cached_tokens") or timings.get("cache_n") or 0)
    return Result(ttft, total, tokens, prompt, cached, "".join(parts))


def chat(base: str, messages: list[dict[str, str]], max_tokens: int) -> Result:
    # plain greedy on both servers: a model's recommended penalty (the starter's 1.1)
    # would otherwise be applied by localllm alone
    body = {
        "model": MODEL["id"],
        "messages": messages,
        "max_tokens": max_tokens,
        "temperature": 0,
        "repeat_penalty": 1.0,
    }
    return stream(base, "/v1/chat/completions", body)


def story(topic: str, salt: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": f"({salt}) Write a long story about {topic}."}]


def concurrent(base: str, salt: str, tokens: int = 128) -> tuple[float, float, float]:
    """(aggregate tok/s of 4 streams, one stream's tok/s, slowest first token)."""
    one = chat(base, story(TOPICS[0], salt + "-solo"), tokens)
    results: list[Result] = []

    def run(topic: str) -> None:
        results.append(chat(base, story(topic, salt), tokens))

    threads = [threading.Thread(target=run, args=(t,)) for t in TOPICS]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    return (
        sum(r.tokens for r in results) / wall,
        one.tokens / one.total,
        max(r.ttft for r in results),
    )


def completion_during_chat(base: str, salt: str) -> tuple[float, float]:
    """(latency of a 16-token completion on the idle server, the same during a chat)."""
    body = {"model": MODEL["id"], "prompt": f"def fibonacci_{salt.replace('-', '_')}(n):"}
    body |= {"max_tokens": 16, "temperature": 0, "repeat_penalty": 1.0}
    idle = stream(base, "/v1/completions", body).total
    busy: list[float] = []
    chatting = threading.Thread(target=chat, args=(base, story(TOPICS[1], salt), 200))
    chatting.start()
    time.sleep(1.0)  # the chat is decoding now
    busy.append(stream(base, "/v1/completions", {**body, "prompt": body["prompt"] + " "}).total)
    chatting.join()
    return idle, busy[0]


def follow_ups(base: str, salt: str, turns: int = 3) -> list[Result]:
    messages = story(TOPICS[2], salt)
    out = []
    answer = chat(base, messages, 300).text
    for i in range(turns):
        messages = [*messages, {"role": "assistant", "content": answer}]
        messages.append({"role": "user", "content": f"Continue the story, part {i + 2}."})
        r = chat(base, messages, 300)
        out.append(r)
        answer = r.text
    return out


def interleaved(base: str, salt: str, turns: int = 6) -> list[Result]:
    """Four conversations taking turns, each with its own system prompt of about 1,000
    tokens (an agent's instructions): the replies to turns 2 and later."""
    convs = []
    for c, topic in enumerate(TOPICS):
        rules = " ".join(
            f"Rule {i}: when asked about {topic}, cite source {i * 7 % 29} of shelf {c}."
            for i in range(60)
        )
        convs.append([{"role": "system", "content": f"({salt}-{c}) {rules}"}])
    later: list[Result] = []
    for turn in range(turns):
        for c, messages in enumerate(convs):
            messages.append({"role": "user", "content": f"Question {turn + 1} about {TOPICS[c]}?"})
            r = chat(base, messages, 32)
            messages.append({"role": "assistant", "content": r.text})
            if turn:
                later.append(r)
    return later


def cold_prefill(base: str, salt: str) -> tuple[float, int]:
    words = " ".join(f"item{i} is {i * 7 % 13}" for i in range(230))
    content = f"({salt}) Here is a list: {words}. Which item is the largest?"
    r = chat(base, [{"role": "user", "content": content}], 1)
    return r.total, r.prompt_tokens


def repeats(base: str, salt: str, times: int = 3) -> list[Result]:
    """A short chat request, then the very same request `times` times more."""
    messages = story(TOPICS[3], salt + "-again")
    chat(base, messages, 32)
    return [chat(base, messages, 32) for _ in range(times)]


def measure(base: str, salt: str, *, concurrency: bool = True) -> dict[str, float]:
    figures: dict[str, float] = {}
    if concurrency:
        agg, one, slowest = concurrent(base, salt)
        idle, busy = completion_during_chat(base, salt)
        figures = {
            "aggregate_tps": agg,
            "single_tps": one,
            "slowest_ttft_ms": slowest * 1000,
            "completion_idle_ms": idle * 1000,
            "completion_busy_ms": busy * 1000,
        }
    ups = follow_ups(base, salt)
    if concurrency:
        inter = interleaved(base, salt)
        figures["interleaved_ttft_ms"] = statistics.median(r.ttft for r in inter) * 1000
        figures["interleaved_prompt_tokens"] = statistics.median(r.prompt_tokens for r in inter)
    cold, n_cold = cold_prefill(base, salt)
    again = repeats(base, salt)
    share = [r.cached / r.prompt_tokens for r in ups if r.prompt_tokens]
    return {
        **figures,
        "followup_ttft_ms": statistics.median(r.ttft for r in ups) * 1000,
        "followup_cached_share": statistics.median(share) if share else 0.0,
        "cold_prefill_s": cold,
        "cold_prompt_tokens": n_cold,
        "repeat_ttft_ms": statistics.median(r.ttft for r in again) * 1000,
    }


def mlx_rounds(rounds: int) -> None:
    """The MLX backend on this machine's CPU: 4 streams together against one alone."""
    ratios = []
    for rnd in range(rounds):
        server = Server(
            "--threads",
            str(THREADS),
            "--parallel",
            str(PARALLEL),
            "--backend",
            "mlx",
            "--ctx",
            "1024",
        )
        try:
            agg, one, _ = concurrent(server.base, uuid.uuid4().hex[:8], tokens=32)
        finally:
            server.stop()
        ratios.append(agg / one)
        print(f"mlx round {rnd}: 4 streams {agg:.1f} tok/s, one {one:.1f} tok/s", flush=True)
    print(f"median 4-stream aggregate / one stream on MLX: {statistics.median(ratios):.2f}x")


def setup(parser: argparse.ArgumentParser, rounds: int) -> argparse.Namespace:
    """`parser` with --rounds and --model, parsed; MODEL set, the machine printed."""
    parser.add_argument("--rounds", type=int, default=rounds)
    parser.add_argument("--model", help="a GGUF file for the servers (default: the starter)")
    args = parser.parse_args()
    if args.model:
        MODEL.update(path=str(Path(args.model).resolve()), id=Path(args.model).stem)
    print(machine())
    return args


def localllm_flags() -> list[str]:
    """localllm's threads, slots and model, as llama-server gets them."""
    flags = ["--threads", str(THREADS), "--parallel", str(PARALLEL)]
    return flags + (["--model", MODEL["path"]] if MODEL["path"] else [])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mlx", action="store_true", help="the MLX backend, 4 vs 1 stream")
    args = setup(parser, rounds=3)
    if args.mlx:
        mlx_rounds(args.rounds)
        return
    binary = os.environ.get("LLAMA_SERVER")
    names = ["localllm", "localllm --deterministic"] + (["llama-server"] if binary else [])
    rows: dict[str, list[dict[str, float]]] = {name: [] for name in names}
    for rnd in range(args.rounds):
        order = names if rnd % 2 == 0 else names[::-1]
        for name in order:
            server: Any = (
                LlamaServer(str(binary))
                if name == "llama-server"
                else Server(*localllm_flags(), *name.split()[1:])
            )
            try:
                # a fresh salt per run: nothing comes from an earlier run's cache
                salt = uuid.uuid4().hex[:8]
                rows[name].append(measure(server.base, salt, concurrency="--det" not in name))
            finally:
                server.stop()
            print(name, {k: round(v, 3) for k, v in rows[name][-1].items()}, flush=True)
    keys = list(rows["localllm"][0])
    print(f"\nmedians over {args.rounds} rounds")
    print(f"{'':24}" + "".join(f"{n:>26}" for n in names))
    for key in keys:
        cells = [
            f"{statistics.median(r[key] for r in rows[n]):26.3f}"
            if key in rows[n][0]
            else " " * 25 + "-"
            for n in names
        ]
        print(f"{key:24}" + "".join(f"{c:>26}" for c in cells))


if __name__ == "__main__":
    main()
