"""llama.vscode's own requests, replayed: ggml-org/llama.vscode at commit
3938fb3568b98e3ddfcf2ce3dd52d9570552b579 (2026-08-19).

- src/llama-server.ts createRequestPayload: the completion (id_slot, n_cmpl from the
  max_parallel_completions setting, 3 by default, the sampler list, t_max_*), and the
  preparation request (n_predict 0) sent with new extra context;
- createChatEditRequestPayload: edit mode on /v1/chat/completions with cache_prompt;
- src/extra-context.ts: each chunk is {text, time: Date.now(), filename};
- src/completion.ts getComplFromContent: a result with `content`, or a list of them.
Defaults from src/configuration.ts: n_predict 128, t_max_prompt_ms 500,
t_max_predict_ms 2500.
"""

from __future__ import annotations

from typing import Any

import httpx

CHUNKS = [
    {"text": f"export function f{i}(x: number) {{\n  return x + {i};\n}}\n",
     "time": 1764000000000 + i, "filename": f"/work/src/f{i}.ts"}
    for i in range(3)
]


def completion(n_cmpl: int = 3, **extra: Any) -> dict[str, Any]:
    return {
        "id_slot": 0,
        "input_prefix": "function add(a: number, b: number) {\n",
        "input_suffix": "\n}\n",
        "input_extra": CHUNKS,
        "prompt": "  return ",
        "n_predict": 128,
        "n_cmpl": n_cmpl,
        "top_k": 40,
        "top_p": 0.99,
        "stream": False,
        "samplers": ["top_k", "top_p", "infill"],
        "cache_prompt": True,
        "n_indent": 2,
        "t_max_prompt_ms": 500,
        "t_max_predict_ms": 2500,
        **extra,
    }


def preparation() -> dict[str, Any]:
    return {
        "id_slot": 0,
        "input_prefix": "",
        "input_suffix": "",
        "input_extra": CHUNKS,
        "prompt": "",
        "n_predict": 0,
        "samplers": [],
        "cache_prompt": True,
        "t_max_prompt_ms": 500,
        "t_max_predict_ms": 1,
    }


def completions_of(data: Any) -> list[str]:
    """What getComplFromContent reads from the answer."""
    if isinstance(data, dict):
        assert "content" in data
        return [data["content"]]
    return list(dict.fromkeys(item["content"] for item in data))


def test_preparation_then_three_completions(http: httpx.Client):
    assert http.post("/infill", json=preparation()).status_code == 200
    reply = http.post("/infill", json=completion(seed=7))
    assert reply.status_code == 200, reply.text
    data = reply.json()
    assert isinstance(data, list) and len(data) == 3
    assert [item["index"] for item in data] == [0, 1, 2]
    assert all(item["tokens_cached"] > 0 for item in data)
    assert completions_of(data)  # at least one suggestion the plugin can show
    # the first is the greedy answer: the same as a single completion of the same body
    alone = http.post("/infill", json=completion(n_cmpl=1, seed=7)).json()
    assert data[0]["content"] == alone["content"]


def test_too_many_completions_name_the_bound(http: httpx.Client):
    reply = http.post("/infill", json=completion(n_cmpl=9))
    assert reply.status_code == 400
    assert "n_cmpl" in reply.text and "8" in reply.text


def test_time_bound_ends_the_answer_at_a_newline(http: httpx.Client):
    """t_max_predict_ms as llama-server applies it: once the time has passed, the answer
    ends at the next piece that holds a newline (1 ms has always passed by then)."""
    body = {
        "messages": [{"role": "user", "content": "List ten fruits, one per line."}],
        "max_tokens": 200,
        "temperature": 0,
        "t_max_predict_ms": 1,
    }
    bounded = http.post("/v1/chat/completions", json=body).json()
    free = http.post("/v1/chat/completions", json={**body, "t_max_predict_ms": None}).json()
    text = bounded["choices"][0]["message"]["content"]
    whole = free["choices"][0]["message"]["content"]
    assert whole.count("\n") >= 2, whole  # the unbounded answer has several lines
    assert bounded["choices"][0]["finish_reason"] == "length"
    assert bounded["usage"]["completion_tokens"] < free["usage"]["completion_tokens"]
    # it stopped with the first newline: the same text as the free answer, up to there
    assert "\n" in text and len(text) < len(whole)
    assert whole.startswith(text) and "\n" not in text.rstrip("\n")


def test_edit_mode_with_cache_prompt(http: httpx.Client):
    body = {
        "messages": [
            {"role": "system", "content": "You are an expert coder.\n"},
            {"role": "user", "content": "Modify the following original code according to "
             "the instructions. Output only the modified code. No explanations.\n\n"
             "instructions:\nrename x to y\n\noriginal code:\nlet x = 1;\n\nmodified code:"},
        ],
        "stream": False,
        "cache_prompt": True,
        "temperature": 0.8,
        "top_p": 0.95,
        "max_tokens": 16,
    }
    reply = http.post("/v1/chat/completions", json=body)
    assert reply.status_code == 200, reply.text
    assert reply.json()["choices"][0]["message"]["content"]
