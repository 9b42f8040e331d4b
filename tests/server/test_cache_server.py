"""The prompt cache and the context policy through a real server: `usage`, /health,
`localllm ps`, and `truncate-oldest` saying what it dropped."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator

import httpx
import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam

from tests.conftest import ServerProcess, loads_model


@pytest.fixture(scope="module")
@loads_model
def truncating(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    srv = ServerProcess(tmp_path_factory.mktemp("truncating"), "--ctx", "256",
                        env={"LOCALLLM_CONTEXT_POLICY": "truncate-oldest"})
    yield srv
    srv.stop()


def chat(topic: str, turns: int) -> list[ChatCompletionMessageParam]:
    system = f"You know {topic}. Answer briefly. " * 6
    msgs: list[ChatCompletionMessageParam] = [{"role": "system", "content": system}]
    for i in range(turns):
        msgs.append({"role": "user", "content": f"Fact {i + 1} about {topic}, please."})
        if i < turns - 1:
            msgs.append({"role": "assistant", "content": f"{topic.title()} fact {i + 1}."})
    return msgs


def test_truncate_oldest_says_what_it_dropped(truncating: ServerProcess):
    body = {"messages": chat("rivers", 12), "max_tokens": 4, "temperature": 0}
    r = httpx.post(truncating.base + "/v1/chat/completions", json=body, timeout=60)
    assert r.status_code == 200, r.text
    data = r.json()
    cut = data["truncated"]
    assert cut["dropped_messages"] >= 2 and cut["prompt_tokens_before"] > 256
    assert data["usage"]["prompt_tokens"] < 256
    frames = []
    with httpx.stream("POST", truncating.base + "/v1/chat/completions",
                      json={**body, "stream": True}, timeout=60) as resp:
        frames = [line for line in resp.iter_lines() if line.startswith("data: {")]
    assert '"truncated"' in frames[-1]  # the closing frame says it as well


def test_cache_figures_in_health_and_ps(truncating: ServerProcess):
    client = openai.OpenAI(base_url=truncating.base + "/v1", api_key="unused", max_retries=0)
    # five conversations on the server's four sequences: the fifth takes the place of the
    # least recently used, and the last request restores the first from the RAM tier
    for topic in ("rivers", "deserts", "forests", "mountains", "lakes", "rivers"):
        r = client.chat.completions.create(model="starter", messages=chat(topic, 1),
                                           max_tokens=2, temperature=0)
    details = r.usage.prompt_tokens_details if r.usage else None
    assert details is not None and (details.cached_tokens or 0) > 0
    cache = truncating.health()["prompt_cache"]
    assert cache["restored"] >= 1 and cache["ram_entries"] >= 1 and cache["hits"] >= 1
    env = {**os.environ, "LOCALLLM_PORT": str(truncating.port)}
    out = subprocess.run([sys.executable, "-m", "localllm", "ps"], capture_output=True,
                         text=True, env=env, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "starter (ok)" in out.stdout and "cache hits" in out.stdout
    assert f"{cache['hits']} of" in out.stdout


@pytest.mark.process
def test_ps_without_a_server_is_one_clear_line(tmp_path):
    from tests.conftest import free_port

    env = {**os.environ, "LOCALLLM_PORT": str(free_port())}
    out = subprocess.run([sys.executable, "-m", "localllm", "ps"], capture_output=True,
                         text=True, env=env, timeout=60)
    assert out.returncode == 1
    assert out.stderr.startswith("localllm: error: no localllm server answers at http://127.0.0.1:")


def test_the_same_request_again_reads_nothing_and_answers_the_same(server: ServerProcess):
    """A repeat of a prompt (a client retrying, a regenerate at temperature 0) finds the
    logits its first run sampled from, kept with the KV: it reads no prompt token, and its
    answer and log probabilities are the first run's. Within a JSON schema the grammar's
    mask applies to a copy: the plain request after it still answers as before."""
    client = openai.OpenAI(base_url=server.base + "/v1", api_key="unused", max_retries=0)
    messages: list[ChatCompletionMessageParam] = [
        {"role": "user", "content": "Describe a lighthouse keeper in a few words."}]
    schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 20}},
              "required": ["name"], "additionalProperties": False}
    as_json = {"type": "json_schema", "json_schema": {"name": "keeper", "schema": schema}}

    def ask(**extra: object) -> tuple[str, list[float], int, int]:
        r = client.chat.completions.create(model="starter", messages=messages, max_tokens=12,
                                           temperature=0, logprobs=True, **extra)  # type: ignore[call-overload]
        assert r.usage is not None and r.usage.prompt_tokens_details is not None
        content = r.choices[0].logprobs.content if r.choices[0].logprobs else None
        return (r.choices[0].message.content or "", [c.logprob for c in content or []],
                r.usage.prompt_tokens, r.usage.prompt_tokens_details.cached_tokens or 0)

    plain = ask()
    runs = [ask(), ask(response_format=as_json), ask(response_format=as_json), ask()]
    assert all(cached == n for _, _, n, cached in runs)  # every prompt token cached
    assert runs[0][:2] == plain[:2] and runs[3][:2] == plain[:2]
    assert runs[1][:2] == runs[2][:2] and runs[1][0].startswith('{"name"')
