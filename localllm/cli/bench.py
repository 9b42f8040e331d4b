"""localllm bench: the figures a user compares servers by, measured over HTTP against a
running server (this machine's localllm, or `--url` for any OpenAI-compatible server, such
as llama-server, for a paired figure).

Each round measures, with greedy decoding and prompts made unique per round (a salt at
their start, so no cache helps across rounds):
- one stream: a chat answer of `--tokens` tokens, decode tokens/s after its first token
  and the time to that token;
- four streams at once: aggregate tokens/s (all tokens over the wall time) and the
  slowest first token;
- a cold prompt of about 1,500 tokens: the time to its first token;
- a follow-up: the next turn of a conversation whose first turn was just answered, the
  time to its first token and the share of its prompt the server reports as cached.
The medians over `--rounds` rounds are printed (`--json`: as JSON).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from localllm.cli.common import positive_int, print_json, print_table, server_flags
from localllm.config import Settings

if TYPE_CHECKING:
    import httpx

TOPICS = ("the sea", "a mountain village", "an old clockmaker", "a journey by train")
WORDS = (
    "river",
    "stone",
    "lantern",
    "orchard",
    "harbour",
    "meadow",
    "copper",
    "violin",
    "thunder",
    "garden",
    "compass",
    "whisper",
    "glacier",
    "saffron",
    "ember",
    "canyon",
)


def add_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    bench = sub.add_parser(
        "bench",
        parents=[common],
        help="speed figures of a running server: one stream, four streams, cold prompt, follow-up",
    )
    bench.add_argument(
        "--url", help="an OpenAI-compatible server to measure instead (e.g. llama-server)"
    )
    bench.add_argument("--model", help="the model to ask for (default: the server's first)")
    bench.add_argument(
        "--rounds", type=positive_int, default=3, help="rounds; medians are shown (default 3)"
    )
    bench.add_argument(
        "--tokens", type=positive_int, default=128, help="tokens per answer (default 128)"
    )
    bench.add_argument("--json", action="store_true", help="the figures as JSON")
    server_flags(bench)
    bench.set_defaults(run=run)


@dataclass
class Answer:
    ttft: float  # seconds to the first text
    decode_tps: float  # tokens/s after the first
    tokens: int
    prompt_tokens: int
    cached: int
    wall: float
    text: str


def run(settings: Settings, args: argparse.Namespace) -> int:
    import httpx

    base = (args.url or settings.base_url().removesuffix("/v1")).rstrip("/")
    base = base.removesuffix("/v1")
    try:
        model = args.model or _first_model(httpx, base)
    except (httpx.HTTPError, ValueError, KeyError, IndexError) as exc:
        sys.stderr.write(
            f"localllm: error: no OpenAI-compatible server answers at {base} ({exc}); start "
            "`localllm serve`, or give --url\n"
        )
        return 1
    rows: dict[str, list[float]] = {}
    # one client for every request, as an IDE or SDK keeps one: a new client per request
    # would put its own setup (~20 ms of CPU) into every first-token figure. A new
    # connection for each request, though: llama-server closes some kept-alive ones after
    # a streamed answer, and a request sent on one of those fails
    limits = httpx.Limits(max_keepalive_connections=0)
    client = httpx.Client(base_url=base, timeout=600, limits=limits)
    try:
        for r in range(args.rounds):
            sys.stderr.write(f"round {r + 1}/{args.rounds} on {model} at {base}\n")
            for key, value in _round(client, model, args.tokens).items():
                rows.setdefault(key, []).append(value)
    except httpx.HTTPStatusError as exc:
        said = exc.response.text[:300]
        sys.stderr.write(f"localllm: error: {base} answered {exc.response.status_code}: {said}\n")
        return 1
    except httpx.HTTPError as exc:
        sys.stderr.write(f"localllm: error: {base} stopped answering ({exc})\n")
        return 1
    finally:
        client.close()
    medians = {k: round(statistics.median(v), 3) for k, v in rows.items()}
    if args.json:
        print_json({"url": base, "model": model, "rounds": args.rounds, **medians})
        return 0
    print(f"{model} at {base}, medians of {args.rounds} round(s)")
    print_table([("figure", "value")] + [(k, _shown(k, v)) for k, v in medians.items()])
    return 0


def _shown(key: str, value: float) -> str:
    if key.endswith("_s"):
        return f"{value * 1000:,.0f} ms"
    if key.endswith("_tps"):
        return f"{value:,.1f} tokens/s"
    if key.endswith("_tokens"):
        return f"{value:,.0f}"
    return f"{value:.3f}"


def _first_model(httpx: Any, base: str) -> str:
    reply = httpx.get(base + "/v1/models", timeout=10)
    reply.raise_for_status()
    return str(reply.json()["data"][0]["id"])


def _round(client: httpx.Client, model: str, tokens: int) -> dict[str, float]:
    salt = uuid.uuid4().hex[:8]
    one = _chat(client, model, _story(TOPICS[0], salt + "-one"), tokens)
    many: list[Answer] = []
    lock = threading.Lock()

    def worker(topic: str) -> None:
        answer = _chat(client, model, _story(topic, salt + "-four"), tokens)
        with lock:
            many.append(answer)

    t0 = time.perf_counter()
    threads = [threading.Thread(target=worker, args=(t,)) for t in TOPICS]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    if len(many) < len(TOPICS):
        raise ValueError("a concurrent stream failed")
    cold = _chat(client, model, [{"role": "user", "content": _long_text(salt)}], 1)
    first = _story(TOPICS[1], salt + "-turn")
    answer = _chat(client, model, first, 64)
    follow = [
        *first,
        {"role": "assistant", "content": answer.text},
        {"role": "user", "content": "Now give it a title."},
    ]
    again = _chat(client, model, follow, 8)
    return {
        "one_stream_decode_tps": one.decode_tps,
        "one_stream_first_token_s": one.ttft,
        "four_streams_aggregate_tps": sum(a.tokens for a in many) / wall,
        "four_streams_slowest_first_token_s": max(a.ttft for a in many),
        "cold_prompt_first_token_s": cold.ttft,
        "cold_prompt_tokens": float(cold.prompt_tokens),
        "follow_up_first_token_s": again.ttft,
        "follow_up_cached_share": again.cached / again.prompt_tokens if again.prompt_tokens else 0,
    }


def _story(topic: str, salt: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": f"({salt}) Write a long story about {topic}."}]


def _long_text(salt: str, words: int = 1100) -> str:
    """About 1,500 tokens of plain words, unique to this round."""
    seed = int(salt, 16)
    picked = [WORDS[(seed // (i + 1) + i * 7) % len(WORDS)] for i in range(words)]
    return f"({salt}) Summarise this list in one word: " + " ".join(picked)


def _chat(
    client: httpx.Client, model: str, messages: list[dict[str, str]], max_tokens: int
) -> Answer:
    """One streamed chat answer, timed from the request to its first and last text."""
    body = {
        "model": model,
        "messages": messages,
        "max_tokens": max_tokens,
        "temperature": 0,
        # plain greedy on any server: a model's recommended penalty (the starter's) would
        # otherwise apply on localllm's side alone and the pair would not do the same work
        "repeat_penalty": 1.0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    t0 = time.perf_counter()
    first = last = 0.0
    usage: dict[str, Any] = {}
    timings: dict[str, Any] = {}
    parts: list[str] = []
    with client.stream("POST", "/v1/chat/completions", json=body) as reply:
        if reply.status_code != 200:
            reply.read()
            reply.raise_for_status()
        for line in reply.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[6:])
            usage = event.get("usage") or usage
            timings = event.get("timings") or timings  # llama-server's own figures
            for choice in event.get("choices") or []:
                text = (choice.get("delta") or {}).get("content") or ""
                if text:
                    last = time.perf_counter() - t0
                    first = first or last
                    parts.append(text)
    wall = time.perf_counter() - t0
    tokens = int(usage.get("completion_tokens") or timings.get("predicted_n") or 0)
    details = usage.get("prompt_tokens_details") or {}
    cached = int(details.get("cached_tokens") or timings.get("cache_n") or 0)
    prompt = int(usage.get("prompt_tokens") or 0) or int(timings.get("prompt_n") or 0) + cached
    span = last - first
    tps = (tokens - 1) / span if tokens > 1 and span > 0 else 0.0
    return Answer(first or wall, tps, tokens, prompt, cached, wall, "".join(parts))
