"""Fill-in-the-middle through `suffix`.

The starter model's vocabulary has no FIM tokens, so this stages a model that has
them: a copy of the starter whose GGUF metadata names three of its tokens as the
FIM prefix/suffix/middle markers. The prompt layout is what is under test.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from localllm.backends.base import LoadedModel, ModelRef
from localllm.models.gguf import read_gguf
from tests.conftest import ServerProcess, starts_process
from tests.gguf_fixtures import copy_with_metadata

FIM_IDS = {"tokenizer.ggml.fim_pre_token_id": 3, "tokenizer.ggml.fim_suf_token_id": 5,
           "tokenizer.ggml.fim_mid_token_id": 6}


@pytest.fixture(scope="module")
@starts_process
def fim_server(tmp_path_factory: pytest.TempPathFactory, starter_ref: ModelRef
               ) -> Iterator[ServerProcess]:
    tmp = tmp_path_factory.mktemp("fim")
    path = copy_with_metadata(starter_ref.path, tmp / "fim-starter.gguf", FIM_IDS)
    assert read_gguf(Path(path)).fim_ids == (3, 5, 6)
    srv = ServerProcess(tmp, "--model", str(path))
    yield srv
    srv.stop()


def test_suffix_builds_the_fim_prompt(fim_server: ServerProcess, loaded: LoadedModel):
    client = openai.OpenAI(base_url=fim_server.base + "/v1", api_key="x", max_retries=0)
    prefix, suffix = "def add(a, b):\n    return ", "\n\nprint(add(1, 2))\n"
    r = client.completions.create(model="fim-starter", prompt=prefix, suffix=suffix,
                                  max_tokens=6, temperature=0)
    expected = len(loaded.tokenize(prefix)) + len(loaded.tokenize(suffix)) + 3
    assert r.usage is not None and r.usage.prompt_tokens == expected
    assert r.usage.completion_tokens >= 1
    assert r.choices[0].finish_reason in ("stop", "length")
    plain = client.completions.create(model="fim-starter", prompt=prefix, max_tokens=6,
                                      temperature=0)
    assert plain.usage is not None and plain.usage.prompt_tokens == len(loaded.tokenize(prefix))
