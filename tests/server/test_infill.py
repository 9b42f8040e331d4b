"""/infill as llama.vim and llama.vscode call it, /tokenize, /detokenize and /props.

The starter has no FIM tokens, so this stages a copy whose GGUF names five of its
tokens as the FIM prefix/suffix/middle, file separator and repository markers (as in
test_fim.py): the prompt's layout and the cache's reuse are under test, not the
completion's quality.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from localllm.backends.base import ModelRef
from tests.conftest import ServerProcess
from tests.gguf_fixtures import copy_with_metadata

PRE, SUF, MID, SEP, REP = 7, 8, 9, 5, 3
FIM_KEYS = {
    "tokenizer.ggml.fim_pre_token_id": PRE,
    "tokenizer.ggml.fim_suf_token_id": SUF,
    "tokenizer.ggml.fim_mid_token_id": MID,
    "tokenizer.ggml.fim_sep_token_id": SEP,
    "tokenizer.ggml.fim_rep_token_id": REP,
}
CHUNKS = [{"filename": f"src/mod{i}.py",
           "text": f"def helper_{i}(x):\n    return x * {i} + {i * 7}\n\n" * 3}
          for i in range(8)]
# the body llama.vim sends (its fields, its response_fields)
LLAMA_VIM: dict[str, Any] = {
    "input_prefix": "import math\n\ndef area(r):\n",
    "input_suffix": "\n\nprint(area(2))\n",
    "input_extra": CHUNKS,
    "prompt": "    return ",
    "n_predict": 12,
    "n_indent": 4,
    "top_k": 40,
    "top_p": 0.99,
    "stream": False,
    "samplers": ["top_k", "top_p", "infill"],
    "cache_prompt": True,
    "t_max_prompt_ms": 500,
    "t_max_predict_ms": 1000,
    "response_fields": ["content", "timings/prompt_n", "timings/prompt_ms",
                        "timings/prompt_per_token_ms", "timings/prompt_per_second",
                        "timings/predicted_n", "timings/predicted_ms",
                        "timings/predicted_per_token_ms", "timings/predicted_per_second",
                        "truncated", "tokens_cached"],
}


@pytest.fixture(scope="module")
def fim_http(tmp_path_factory: pytest.TempPathFactory, starter_ref: ModelRef
             ) -> Iterator[httpx.Client]:
    tmp = tmp_path_factory.mktemp("infill")
    path = copy_with_metadata(starter_ref.path, tmp / "fim-starter.gguf", FIM_KEYS)
    srv = ServerProcess(tmp, "--model", str(path), "--ctx", "2048")
    with httpx.Client(base_url=srv.base, timeout=120) as client:
        yield client
    srv.stop()


def count(http: httpx.Client, text: str) -> int:
    return len(http.post("/tokenize", json={"content": text}).json()["tokens"])


def test_infill_layout_and_cache(fim_http: httpx.Client):
    first = fim_http.post("/infill", json=LLAMA_VIM)
    assert first.status_code == 200, first.text
    body = first.json()
    assert set(body) == set(LLAMA_VIM["response_fields"])  # flattened, nothing else
    assert body["truncated"] is False
    assert 1 <= body["timings/predicted_n"] <= 12
    with_bos = fim_http.post("/tokenize", json={"content": "x", "add_special": True})
    bos = len(with_bos.json()["tokens"]) - count(fim_http, "x")
    expected = (bos + 1 + count(fim_http, "myproject\n")
                + sum(1 + count(fim_http, c["filename"] + "\n") + count(fim_http, c["text"])
                      for c in CHUNKS)
                + 1 + count(fim_http, LLAMA_VIM["input_prefix"])
                + 1 + count(fim_http, LLAMA_VIM["input_suffix"])
                + 1 + count(fim_http, LLAMA_VIM["prompt"]))
    full = fim_http.post("/infill", json={**LLAMA_VIM, "response_fields": None,
                                          "input_prefix": LLAMA_VIM["input_prefix"] + "# x\n"})
    # the extra context leads the prompt: the second request reads it from the cache
    again = full.json()
    assert again["tokens_cached"] >= expected - 40
    assert again["timings"]["prompt_n"] < 40
    prefix = LLAMA_VIM["input_prefix"]
    assert again["tokens_evaluated"] == (
        expected - count(fim_http, prefix) + count(fim_http, prefix + "# x\n"))
    assert body["tokens_cached"] == 0 or body["tokens_cached"] < expected
    # warming the cache, as llama.vim does when the cursor moves: n_predict 0
    warm = fim_http.post("/infill", json={**LLAMA_VIM, "n_predict": 0,
                                          "response_fields": ["content", "tokens_cached"]})
    assert warm.json()["content"] == ""


def test_n_indent_ends_the_block():
    from localllm.server.llamacpp.routes import _ended_line, flatten

    text = "x = 1\n        y = 2\n    z = 3\nreturn w\n"
    assert _ended_line(text, 8) == text.index("\n    z")
    assert _ended_line("a\n", 4) is None  # the next line is not written yet
    assert flatten({"a": {"b": 1}, "c": 2}, ["a/b", "c", "a/x"]) == {"a/b": 1, "c": 2}


def test_tokenize_detokenize_props(fim_http: httpx.Client):
    tokens = fim_http.post("/tokenize", json={"content": "Hello world"}).json()["tokens"]
    assert tokens and all(isinstance(t, int) for t in tokens)
    pieces = fim_http.post("/tokenize", json={"content": "Hello world", "with_pieces": True})
    assert "".join(p["piece"] for p in pieces.json()["tokens"]) == "Hello world"
    text = fim_http.post("/detokenize", json={"tokens": tokens}).json()["content"]
    assert text == "Hello world"
    bad = fim_http.post("/detokenize", json={"tokens": [10**8]})
    assert bad.status_code == 400 and "vocabulary" in bad.json()["error"]["message"]
    props = fim_http.get("/props").json()
    assert props["default_generation_settings"]["n_ctx"] == 2048
    assert props["infill"] is True and props["total_slots"] >= 1
    assert "<|im_start|>" in props["chat_template"]


def test_infill_needs_fim_tokens(server: ServerProcess):
    r = httpx.post(server.base + "/infill", json={"input_prefix": "def f():\n",
                                                  "input_suffix": "", "n_predict": 4})
    assert r.status_code == 400 and r.json()["error"]["code"] == "fim_not_supported"


def test_infill_values_it_does_not_honour_are_refused(server: ServerProcess):
    base = {"input_prefix": "def f():\n", "input_suffix": "", "n_predict": 4}
    # (cache_prompt false is accepted: the answer is the same with or without the cache)
    for extra, named in (({"n_cmpl": 99}, "n_cmpl"),
                         ({"samplers": ["top_k", "dry"]}, "dry"),
                         ({"mirostat": 2}, "mirostat")):
        r = httpx.post(server.base + "/infill", json={**base, **extra})
        assert r.status_code == 400 and named in r.json()["error"]["message"], (extra, r.text)
