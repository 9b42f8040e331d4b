"""Several models behind one endpoint: on-demand loading, one load for concurrent first
requests, keep_alive per request, and what /health and `localllm ps` show."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from localllm.backends.base import ModelRef
from tests.conftest import ServerProcess, loads_model
from tests.hubserver import wait_for


@pytest.fixture(scope="module")
@loads_model
def two_models(
    tmp_path_factory: pytest.TempPathFactory, starter_ref: ModelRef
) -> Iterator[ServerProcess]:
    tmp = tmp_path_factory.mktemp("resident")
    models = tmp / "data" / "models"
    models.mkdir(parents=True)
    (models / "twin.gguf").symlink_to(starter_ref.path)
    srv = ServerProcess(tmp, "--ctx", "512")
    yield srv
    srv.stop()


def test_concurrent_first_requests_load_once_and_health_shows_both(two_models: ServerProcess):
    client = openai.OpenAI(base_url=two_models.base + "/v1", api_key="none", max_retries=0)
    answers: list[str] = []

    def ask() -> None:
        r = client.chat.completions.create(
            model="twin",
            messages=[{"role": "user", "content": "Hi"}],
            max_tokens=3,
            temperature=0,
        )
        answers.append(r.model)

    threads = [threading.Thread(target=ask) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert answers == ["twin"] * 3
    health = two_models.health()
    assert health["totals"]["loads"] == 2  # the default at start, twin once
    rows = {m["model"]: m for m in health["models"]}
    assert set(rows) == {"starter", "twin"}
    assert rows["starter"]["default"] and not rows["twin"]["default"]
    assert rows["twin"]["requests"] == 3 and rows["twin"]["memory_bytes"] > 90 * 2**20
    listed = [m.id for m in client.models.list()]
    assert "twin" in listed and "starter" in listed
    env = {**os.environ, "LOCALLLM_PORT": str(two_models.port)}
    out = subprocess.run(
        [sys.executable, "-m", "localllm", "ps"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].split()[:6] == ["NAME", "BACKEND", "CONTEXT", "PARALLEL", "MEMORY", "KV"]
    assert lines[1].startswith("starter") and "never (default)" in lines[1]
    assert lines[2].startswith("twin") and lines[2].rstrip().endswith(" s")


def test_keep_alive_zero_unloads_after_the_request(two_models: ServerProcess):
    client = openai.OpenAI(base_url=two_models.base + "/v1", api_key="none", max_retries=0)
    client.chat.completions.create(
        model="twin",
        messages=[{"role": "user", "content": "Hi"}],
        max_tokens=2,
        extra_body={"keep_alive": "0s"},
    )
    assert wait_for(lambda: [m["model"] for m in two_models.health()["models"]] == ["starter"], 10)


def test_bad_keep_alive_is_a_400(two_models: ServerProcess):
    client = openai.OpenAI(base_url=two_models.base + "/v1", api_key="none", max_retries=0)
    with pytest.raises(openai.BadRequestError, match="keep_alive must be seconds"):
        client.chat.completions.create(
            model="starter",
            messages=[{"role": "user", "content": "Hi"}],
            max_tokens=2,
            extra_body={"keep_alive": "soon"},
        )


def test_a_model_too_large_for_the_budget_is_a_clear_400(
    tmp_path_factory: pytest.TempPathFactory, starter_ref: ModelRef
) -> None:
    tmp: Path = tmp_path_factory.mktemp("budget")
    models = tmp / "data" / "models"
    models.mkdir(parents=True)
    # a GGUF 40 MiB larger than the starter (padding after the tensors): never loaded, as
    # its estimate alone is over the budget
    big = models / "big.gguf"
    big.write_bytes(starter_ref.path.read_bytes() + bytes(40 * 2**20))
    srv = ServerProcess(tmp, "--ctx", "256", env={"LOCALLLM_MEMORY_BUDGET_MB": "170"})
    try:
        client = openai.OpenAI(base_url=srv.base + "/v1", api_key="none", max_retries=0)
        with pytest.raises(openai.BadRequestError) as err:
            client.chat.completions.create(
                model="big",
                messages=[{"role": "user", "content": "Hi"}],
                max_tokens=2,
            )
        assert err.value.code == "model_too_large"
        assert "170.0 MiB" in str(err.value) and "weights 133.8 MiB" in str(err.value)
        # the refusal unloaded nothing: the default still answers without a reload
        assert [m["model"] for m in srv.health()["models"]] == ["starter"]
        client.chat.completions.create(
            model="starter", messages=[{"role": "user", "content": "Hi"}], max_tokens=2
        )
        assert srv.health()["totals"]["loads"] == 1
    finally:
        srv.stop()
