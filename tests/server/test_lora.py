"""LoRA adapters through the server (`serve --lora FILE:SCALE`), with a random-weight
adapter for the starter (tests/gguf_fixtures.py): llama-server's GET/POST /lora-adapters,
a request's own `lora` list on the OpenAI routes and /infill, the answer under the
adapter against the base model's, the prompt cache keeping the two apart, and bad ids
and adapters refused by name."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import ServerProcess, starts_process
from tests.gguf_fixtures import starter_lora
from tests.unit.test_cli import cli

QUESTION = "Name three colours of the rainbow."


@pytest.fixture(scope="module")
def lora_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from localllm.models.starter import starter_path

    path = starter_path()
    assert path is not None
    return starter_lora(path, tmp_path_factory.mktemp("lora") / "noise-lora.gguf")


@pytest.fixture(scope="module")
@starts_process
def adapted(lora_file: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    srv = ServerProcess(tmp_path_factory.mktemp("lora-server"), "--lora", f"{lora_file}:1.0")
    yield srv
    srv.stop()


def _chat(srv: ServerProcess, **extra: Any) -> tuple[str, dict[str, Any]]:
    body = {"model": "starter", "messages": [{"role": "user", "content": QUESTION}],
            "temperature": 0, "max_tokens": 16, **extra}
    r = httpx.post(srv.base + "/v1/chat/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    out = r.json()
    return out["choices"][0]["message"]["content"], out["usage"]


def test_the_adapters_are_listed_and_each_request_runs_with_its_own(
    adapted: ServerProcess, server: ServerProcess, lora_file: Path
):
    rows = httpx.get(adapted.base + "/lora-adapters", timeout=60).json()
    assert rows == [{"id": 0, "path": str(lora_file), "scale": 1.0}]
    # deterministic: the answer does not depend on the cache or on other clients, so the
    # server with no adapter at all gives the base model's own answer to compare with
    base, _ = _chat(server, deterministic=True)
    off, _ = _chat(adapted, deterministic=True, lora=[{"id": 0, "scale": 0.0}])
    on, _ = _chat(adapted, deterministic=True)  # no `lora`: the global scale, 1.0
    assert off == base
    assert on != base
    assert _chat(adapted, deterministic=True, lora=[{"id": 0, "scale": 1.0}])[0] == on


def test_the_prompt_cache_keeps_states_of_other_adapters_apart(adapted: ServerProcess):
    off_cold, _ = _chat(adapted, deterministic=True, lora=[])  # `lora: []`: every adapter off
    on_cold, _ = _chat(adapted, deterministic=True)
    # the same prompt, taken from the prompt cache: each reuses only its own state
    on, usage_on = _chat(adapted)
    off, usage_off = _chat(adapted, lora=[])
    assert (on, off) == (on_cold, off_cold)
    assert usage_on["prompt_tokens_details"]["cached_tokens"] > 0
    assert usage_off["prompt_tokens_details"]["cached_tokens"] > 0


def test_post_sets_the_global_scales(adapted: ServerProcess):
    off, _ = _chat(adapted, deterministic=True, lora=[{"id": 0, "scale": 0.0}])
    try:
        r = httpx.post(adapted.base + "/lora-adapters", json=[], timeout=60)
        assert r.status_code == 200, r.text
        assert r.json()["adapters"][0]["scale"] == 0.0  # left out: off, as llama-server does
        assert httpx.get(adapted.base + "/lora-adapters", timeout=60).json()[0]["scale"] == 0.0
        assert _chat(adapted, deterministic=True)[0] == off
        r = httpx.post(adapted.base + "/lora-adapters", json=[{"id": 3, "scale": 1}], timeout=60)
        assert r.status_code == 400
        assert "LoRA adapter id 3 is not loaded: its adapters are ids 0 to 0" in r.text
        for bad, said in (({"id": 0, "scale": 1}, "valid array"), ("[{", "JSON"),
                          ([{"id": 0, "scale": "1"}], "0.scale")):
            content = bad if isinstance(bad, str) else json.dumps(bad)
            r = httpx.post(adapted.base + "/lora-adapters", content=content, timeout=60,
                           headers={"Content-Type": "application/json"})
            assert r.status_code == 400 and said in r.json()["error"]["message"], r.text
    finally:
        r = httpx.post(adapted.base + "/lora-adapters", json=[{"id": 0, "scale": 1.0}],
                       timeout=60)
        assert r.status_code == 200, r.text


def test_completions_and_infill_take_lora_too(adapted: ServerProcess):
    def complete(lora: list[dict[str, Any]]) -> str:
        r = httpx.post(adapted.base + "/v1/completions", timeout=120, json={
            "model": "starter", "prompt": "The rainbow has", "max_tokens": 8,
            "temperature": 0, "deterministic": True, "lora": lora})
        assert r.status_code == 200, r.text
        return str(r.json()["choices"][0]["text"])

    assert complete([{"id": 0, "scale": 0}]) != complete([{"id": 0, "scale": 1}])
    # the starter has no FIM tokens: /infill with a `lora` list is read, then refused for that
    r = httpx.post(adapted.base + "/infill", timeout=60, json={
        "input_prefix": "def f():", "input_suffix": "", "lora": [{"id": 0, "scale": 0.5}]})
    assert r.status_code == 400 and "lora" not in r.json()["error"]["message"]


@pytest.mark.parametrize(("lora", "said"), [
    ([{"id": 1, "scale": 1.0}], "LoRA adapter id 1 is not loaded: its adapters are ids 0 to 0"),
    ([{"id": 0, "scale": 1.0}, {"id": 0, "scale": 0.5}], "LoRA adapter id 0 is named twice"),
    ([{"id": 0, "scale": 1e6}], "lora.0.scale"),
    ([{"id": 0}], "lora.0.scale"),
    ("all", "lora"),
])
def test_bad_lora_lists_are_refused_by_name(adapted: ServerProcess, lora: Any, said: str):
    r = httpx.post(adapted.base + "/v1/chat/completions", timeout=60, json={
        "model": "starter", "messages": [{"role": "user", "content": "hi"}], "lora": lora})
    assert r.status_code == 400, r.text
    assert said in r.json()["error"]["message"]


def test_a_server_without_adapters_says_so(server: ServerProcess):
    r = httpx.post(server.base + "/v1/chat/completions", timeout=60, json={
        "model": "starter", "messages": [{"role": "user", "content": "hi"}],
        "lora": [{"id": 0, "scale": 1.0}]})
    assert r.status_code == 400
    assert "loaded without any (start it with --lora FILE)" in r.json()["error"]["message"]
    assert httpx.get(server.base + "/lora-adapters", timeout=60).json() == []


@pytest.mark.process
def test_an_adapter_that_does_not_fit_stops_the_start_with_its_reason(tmp_path: Path,
                                                                      lora_file: Path):
    from localllm.models.starter import starter_path

    path = starter_path()
    assert path is not None
    wide = starter_lora(path, tmp_path / "wide-lora.gguf", misfit=True)
    r = cli("run", "hi", "--max-tokens", "2", "--lora", str(wide), tmp=tmp_path)
    assert r.returncode == 2, r.stderr
    assert "wide-lora.gguf does not fit the model" in r.stderr
    assert "Traceback" not in r.stderr
    r = cli("run", "hi", "--lora", str(tmp_path / "missing.gguf"), tmp=tmp_path)
    assert r.returncode == 2 and "there is no LoRA adapter at" in r.stderr
    r = cli("run", "hi", "--lora", f"{lora_file}:lots", tmp=tmp_path)
    assert r.returncode == 2 and "there is no LoRA adapter at" in r.stderr
