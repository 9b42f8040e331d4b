"""One real server for the client replay tests: the starter, staged with FIM metadata (as
tests/server/test_infill.py does) so the editor plugins' /infill bodies are answered too.
The completion's quality is not under test; that each client's own request is answered,
in the shape the client parses, is."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from localllm.backends.base import ModelRef
from tests.conftest import ServerProcess, starts_process
from tests.gguf_fixtures import copy_with_metadata

MODEL = "coder"  # loaded by path (`--model .../coder.gguf`), so outside the model store
FIM_KEYS = {
    "tokenizer.ggml.fim_pre_token_id": 7,
    "tokenizer.ggml.fim_suf_token_id": 8,
    "tokenizer.ggml.fim_mid_token_id": 9,
    "tokenizer.ggml.fim_sep_token_id": 5,
    "tokenizer.ggml.fim_rep_token_id": 3,
}


def coder_server(tmp: Path, starter: ModelRef) -> ServerProcess:
    path = copy_with_metadata(starter.path, tmp / f"{MODEL}.gguf", FIM_KEYS)
    return ServerProcess(tmp, "--model", str(path), "--ctx", "4096")


@pytest.fixture(scope="session")
@starts_process
def clients_server(
    tmp_path_factory: pytest.TempPathFactory, starter_ref: ModelRef
) -> Iterator[ServerProcess]:
    srv = coder_server(tmp_path_factory.mktemp("clients"), starter_ref)
    yield srv
    srv.stop()


@pytest.fixture
def http(clients_server: ServerProcess) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=clients_server.base, timeout=120) as client:
        yield client
