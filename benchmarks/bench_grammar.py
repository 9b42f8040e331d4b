"""What constrained decoding costs: decode speed under a JSON schema against free text,
and the time of a tool-call round trip, in one run on one server.

    python -m benchmarks.bench_grammar [--rounds 7] [--tokens 128] [--backend llamacpp]

Each round sends, one at a time and streamed, a free-text request and a request whose
answer must match a schema that keeps it going (a string of at least 2,000
characters), both for `--tokens` tokens. Decode speed is tokens after the first over
the time from the first frame to the last, so the prompt's reading is left out; the
ratio is taken per round and its median reported. Then a tool-call round trip (the
generic format: a required call, then the answer after the tool's result, under
`tool_choice: "none"`) is timed end to end, against the same two requests sent
without tools, each asking for as many tokens as its counterpart made. Last, in this
process, what the grammar costs on its own: building a request's matcher, and a mask.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import httpx

from benchmarks.common import Server, machine

SCHEMA = {
    "type": "object",
    "properties": {"story": {"type": "string", "minLength": 2000}},
    "required": ["story"],
}
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string", "maxLength": 40}},
                "required": ["city"],
            },
        },
    }
]


def decode_tps(base: str, body: dict) -> tuple[float, int]:
    """(tokens/s after the first token, tokens) for one streamed request."""
    body = {**body, "stream": True, "stream_options": {"include_usage": True}}
    first = last = 0.0
    tokens = 0
    with httpx.stream("POST", base + "/v1/chat/completions", json=body, timeout=300) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data: {"):
                continue
            event = json.loads(line[6:])
            if event.get("usage"):
                tokens = event["usage"]["completion_tokens"]
            if event["choices"] and event["choices"][0]["delta"].get("content"):
                last = time.perf_counter()
                first = first or last
    return ((tokens - 1) / (last - first) if last > first else 0.0), tokens


def chat(base: str, body: dict) -> tuple[dict, float]:
    t = time.perf_counter()
    r = httpx.post(base + "/v1/chat/completions", json=body, timeout=300)
    r.raise_for_status()
    return r.json(), time.perf_counter() - t


def round_trip(base: str, salt: int) -> tuple[float, float]:
    """(seconds with tools, seconds for the same token counts without)."""
    ask = [{"role": "user", "content": f"({salt}) What is the weather in Paris?"}]
    first, t1 = chat(
        base,
        {
            "messages": ask,
            "tools": TOOLS,
            "tool_choice": "required",
            "parallel_tool_calls": False,
            "temperature": 0,
        },
    )
    message = first["choices"][0]["message"]
    call = message["tool_calls"][0]
    history = [
        *ask,
        message,
        {"role": "tool", "tool_call_id": call["id"], "content": '{"temp_c": 18}'},
    ]
    second, t2 = chat(
        base,
        {
            "messages": history,
            "tools": TOOLS,
            "tool_choice": "none",
            "max_tokens": 48,
            "temperature": 0,
        },
    )
    n1 = first["usage"]["completion_tokens"]
    n2 = second["usage"]["completion_tokens"]
    _, p1 = chat(base, {"messages": ask, "max_tokens": n1, "temperature": 0})
    follow = [
        *ask,
        {"role": "assistant", "content": "Let me check."},
        {"role": "user", "content": "It is 18 C there. Tell me."},
    ]
    _, p2 = chat(base, {"messages": follow, "max_tokens": n2, "temperature": 0})
    return t1 + t2, p1 + p2


def matcher_costs() -> tuple[float, float]:
    """(ms to build a request's matcher for a tool grammar, ms per token mask) on the
    starter's vocabulary, in-process (the tokenizer table built first, as the engine
    caches it)."""
    from localllm.backends import tools
    from localllm.backends.base import LoadOptions, ModelRef
    from localllm.backends.llamacpp import LlamaCppBackend
    from localllm.engine import grammar
    from localllm.models.starter import starter_path

    path = starter_path()
    assert path is not None
    model = LlamaCppBackend().load(
        ModelRef("starter", path, "gguf", "starter"), LoadOptions(n_ctx=512, n_threads=1)
    )
    try:
        grammar.tokenizer(model)
        spec = tools.ToolSpec(tuple(TOOLS), tools.ToolChoice("auto"))
        compiled = grammar.from_lark(tools.lark_grammar("generic", spec, json.dumps), param="tools")
        t = time.perf_counter()
        for _ in range(20):
            constraint = grammar.Constraint(model, compiled)
        build = (time.perf_counter() - t) / 20 * 1000
        t = time.perf_counter()
        for _ in range(200):
            constraint.allowed()
        mask = (time.perf_counter() - t) / 200 * 1000
        return build, mask
    finally:
        model.close()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--backend", default="llamacpp")
    args = ap.parse_args()
    srv = Server("--backend", args.backend)
    try:
        free_body = {
            "messages": [{"role": "user", "content": "Tell me a long story about a fox."}],
            "max_tokens": args.tokens,
            "temperature": 0.7,
            "seed": 1,
        }
        schema_body = {
            **free_body,
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "story", "schema": SCHEMA},
            },
        }
        decode_tps(srv.base, free_body)  # warm-up: load, first grammar tokenizer
        decode_tps(srv.base, schema_body)
        ratios, free_rates, schema_rates = [], [], []
        for i in range(args.rounds):
            salt = {
                "messages": [
                    {"role": "user", "content": f"({i}) Tell me a long story about a fox."}
                ]
            }
            free, n_free = decode_tps(srv.base, {**free_body, **salt})
            held, n_held = decode_tps(srv.base, {**schema_body, **salt})
            if min(n_free, n_held) < args.tokens // 2:
                print(f"round {i}: short answers ({n_free}, {n_held} tokens), not counted")
                continue
            free_rates.append(free)
            schema_rates.append(held)
            ratios.append(held / free)
            print(
                f"round {i}: free {free:.1f} tok/s, schema {held:.1f} tok/s, "
                f"ratio {held / free:.3f}"
            )
        trips = [round_trip(srv.base, i) for i in range(3)]
    finally:
        srv.stop()
    print(f"\nmachine: {machine()}, backend {args.backend}")
    print(
        f"decode under a JSON schema / free text: median {statistics.median(ratios):.3f} "
        f"({statistics.median(schema_rates):.1f} vs {statistics.median(free_rates):.1f} "
        f"tok/s, {len(ratios)} rounds)"
    )
    with_tools = statistics.median(t for t, _ in trips)
    plain = statistics.median(p for _, p in trips)
    print(
        f"tool-call round trip (call + answer): {with_tools * 1000:.0f} ms; the same token "
        f"counts without tools {plain * 1000:.0f} ms ({with_tools / plain:.2f}x)"
    )
    build, mask = matcher_costs()
    print(
        f"a request's tool-grammar matcher: {build:.2f} ms to build; a token's mask {mask:.3f} ms"
    )


if __name__ == "__main__":
    main()
