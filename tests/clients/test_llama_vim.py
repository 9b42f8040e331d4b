"""llama.vim's own requests, replayed: ggml-org/llama.vim, autoload/llama.vim at commit
a1c8e6e40cb45df59b78add5b65d575386832465 (2026-01-31).

- s:ring_update (lines 551-566): the ring buffer's warm-up, n_predict 0, no samplers;
- llama#fim (lines 796-825): the completion, `response_fields` flattened;
- llama#inst (lines 1396-1404) and llama#inst_send (lines 1491-1499): the instruct mode
  on /v1/chat/completions, with llama-server's own fields (id_slot, samplers, n_predict,
  cache_prompt, response_fields).

Each `input_extra` chunk carries `time`, Vim's reltime() (a pair of numbers), which the
plugin keeps for its own ring buffer: accepted and ignored (server/tolerance.py).
"""

from __future__ import annotations

import json
from typing import Any

import httpx

# what llama.vim's s:pick_chunk stores: the chunk's text, reltime() and the buffer's name
EXTRA = [
    {"text": f"def helper_{i}(x):\n    return x * {i}\n", "time": [1764000000 + i, 123456],
     "filename": f"src/mod{i}.py"}
    for i in range(4)
]
RESPONSE_FIELDS = [
    "content", "timings/prompt_n", "timings/prompt_ms", "timings/prompt_per_token_ms",
    "timings/prompt_per_second", "timings/predicted_n", "timings/predicted_ms",
    "timings/predicted_per_token_ms", "timings/predicted_per_second", "truncated",
    "tokens_cached",
]


def ring_update() -> dict[str, Any]:
    return {
        "id_slot": 0,
        "input_prefix": "",
        "input_suffix": "",
        "input_extra": EXTRA,
        "prompt": "",
        "n_predict": 0,
        "temperature": 0.0,
        "samplers": [],
        "stream": False,
        "cache_prompt": True,
        "t_max_prompt_ms": 1,
        "t_max_predict_ms": 1,
        "response_fields": [""],
    }


def fim(t_max_predict_ms: int = 250) -> dict[str, Any]:
    # the first request of a position uses 250 ms (llama#fim), later ones the config's 1000
    return {
        "id_slot": 0,
        "input_prefix": "import math\n\ndef area(r):\n",
        "input_suffix": "\n\nprint(area(2))\n",
        "input_extra": EXTRA,
        "prompt": "    return ",
        "n_predict": 128,
        "stop": [],
        "n_indent": 4,
        "top_k": 40,
        "top_p": 0.90,
        "samplers": ["top_k", "top_p", "infill"],
        "stream": False,
        "cache_prompt": True,
        "t_max_prompt_ms": 500,
        "t_max_predict_ms": t_max_predict_ms,
        "response_fields": RESPONSE_FIELDS,
    }


MESSAGES = [
    {"role": "system", "content": "You are a text-editing assistant. Respond ONLY with the "
     "result of applying INSTRUCTION to SELECTION."},
    {"role": "user", "content": "SELECTION:\nx = 1\ny = 2\n\nINSTRUCTION:\nRename x to a."},
]


def test_ring_update_warms_the_cache(http: httpx.Client):
    reply = http.post("/infill", json=ring_update())
    assert reply.status_code == 200, reply.text
    # response_fields [""] names nothing: llama-server answers an empty object
    assert reply.json() == {}


def test_fim_request_is_answered_in_the_fields_asked(http: httpx.Client):
    http.post("/infill", json=ring_update())
    reply = http.post("/infill", json=fim())
    assert reply.status_code == 200, reply.text
    body = reply.json()
    assert set(body) == set(RESPONSE_FIELDS)
    assert isinstance(body["content"], str)
    assert body["truncated"] is False  # the extra chunks fit: no "context is full" warning
    assert 1 <= body["timings/predicted_n"] <= 128
    assert body["tokens_cached"] > 0  # the ring chunks were read by the warm-up


def test_instruct_warm_up_reads_the_prompt_only(http: httpx.Client):
    body = {
        "id_slot": 1,
        "messages": MESSAGES,
        "samplers": [],
        "n_predict": 0,
        "stream": False,
        "cache_prompt": True,
        "response_fields": [""],
    }
    reply = http.post("/v1/chat/completions", json=body)
    assert reply.status_code == 200, reply.text
    answer = reply.json()
    assert answer["choices"][0]["message"]["content"] == ""
    assert answer["usage"]["prompt_tokens"] > 20


def test_instruct_send_streams(http: httpx.Client):
    body = {
        "id_slot": 1,
        "messages": MESSAGES,
        "min_p": 0.1,
        "temperature": 0.1,
        "samplers": ["min_p", "temperature"],
        "stream": True,
        "cache_prompt": True,
    }
    with http.stream("POST", "/v1/chat/completions", json={**body, "max_tokens": 24}) as reply:
        assert reply.status_code == 200, reply.read()
        lines = [line for line in reply.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "data: [DONE]"
    frames = [json.loads(line[6:]) for line in lines[:-1]]
    text = "".join(f["choices"][0]["delta"].get("content") or "" for f in frames if f["choices"])
    assert text.strip()
    assert frames[-1]["choices"][0]["finish_reason"] in ("stop", "length")


def test_unknown_sampler_is_still_refused(http: httpx.Client):
    reply = http.post("/v1/chat/completions", json={"messages": MESSAGES, "samplers": ["xtc"]})
    assert reply.status_code == 400
    assert "xtc" in reply.json()["error"]["message"]
