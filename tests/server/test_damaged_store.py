"""Damaged files in the models folder: the file's fault, so a 400 `model_damaged` naming
what is wrong (never a 500 or a Python message), and the listings still show every
good model, the bad ones marked."""

from __future__ import annotations

import struct
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from localllm.models.starter import starter_path
from tests.conftest import ServerProcess, starts_process
from tests.gguf_fixtures import copy_with_metadata

STR = 8


def _s(text: str) -> bytes:
    raw = text.encode()
    return struct.pack("<Q", len(raw)) + raw


def header(path: Path, arch: str, tensors: bytes = b"", n_tensors: int = 0) -> Path:
    """A GGUF header with only its architecture (and the tensor infos given)."""
    kvs = _s("general.architecture") + struct.pack("<I", STR) + _s(arch)
    data = b"GGUF" + struct.pack("<IQQ", 3, n_tensors, 1) + kvs + tensors
    path.write_bytes(data + bytes(-len(data) % 32))  # whole: the data starts aligned
    return path


def many_dimensions(path: Path, n_dims: int) -> Path:
    """A header whose one tensor claims `n_dims` dimensions of 2**40 each (~800 KB)."""
    tensor = _s("token_embd.weight") + struct.pack("<I", n_dims)
    tensor += struct.pack("<Q", 2**40) * n_dims + struct.pack("<IQ", 0, 0)
    return header(path, "llama", tensor, 1)


def overlapping_tensors(source: Path, path: Path) -> Path:
    """A copy of `source` whose second tensor's data starts where the first one's does."""
    import shutil

    import gguf

    shutil.copyfile(source, path)
    reader = gguf.GGUFReader(path, "r+")
    first, second = reader.tensors[0], reader.tensors[1]
    second.field.parts[-1][0] = first.field.parts[-1][0]  # the tensor info's data offset
    reader.data.flush()
    return path


# name -> what the 400 must say
DAMAGED = {
    "zeros": "not a GGUF file",
    "text": "not a GGUF file",
    "dims": "20,000 dimensions",
    "frobnicator": "unknown model architecture",
    "no-heads": "head",
    "overlap": "has offset 0, expected",
}
# loads, but its template cannot render: 400 template_failed, at once (the other bounds
# are tests/unit/test_chat_template_bounds.py's)
TEMPLATES = {"indent": "{{ ('x\n' * 100000) | indent(100000) }}"}


@pytest.fixture(scope="module")
@starts_process
def damaged(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    tmp = tmp_path_factory.mktemp("damaged")
    models = tmp / "data" / "models"
    models.mkdir(parents=True)
    starter = starter_path()
    assert starter is not None
    (models / "zeros.gguf").write_bytes(bytes(4096))
    (models / "text.gguf").write_text("I am a text file with a model's name.\n" * 20)
    many_dimensions(models / "dims.gguf", 20_000)
    header(models / "frobnicator.gguf", "frobnicator")
    copy_with_metadata(starter, models / "no-heads.gguf", {"llama.attention.head_count": 0})
    overlapping_tensors(starter, models / "overlap.gguf")
    for name, template in TEMPLATES.items():
        copy_with_metadata(starter, models / f"{name}.gguf",
                           {"tokenizer.chat_template": template})
    srv = ServerProcess(tmp)
    yield srv
    srv.stop()


def test_listings_show_the_good_and_mark_the_damaged(damaged: ServerProcess):
    for path in ("/api/tags", "/v1/models"):
        r = httpx.get(damaged.base + path, timeout=60)
        assert r.status_code == 200, (path, r.text)
        rows = r.json()["models" if path == "/api/tags" else "data"]
        by_name = {row.get("name", row.get("id")): row for row in rows}
        assert "starter" in by_name and "damaged" not in by_name["starter"]
        for name in (*DAMAGED, *TEMPLATES):
            assert name in by_name, (path, sorted(by_name))
        for name, words in DAMAGED.items():
            if name in ("frobnicator", "no-heads", "overlap"):  # their headers read fine
                continue
            assert words in by_name[name]["damaged"], (path, by_name[name])


def test_a_damaged_model_is_a_400_naming_what_is_wrong(damaged: ServerProcess):
    for name, words in DAMAGED.items():
        body = {"model": name, "messages": [{"role": "user", "content": "hi"}],
                "max_tokens": 2}
        r = httpx.post(damaged.base + "/v1/chat/completions", json=body, timeout=120)
        assert r.status_code == 400, (name, r.text)
        err = r.json()["error"]
        assert err["code"] == "model_damaged" and err["type"] == "invalid_request_error"
        assert words in err["message"], (name, err["message"])
        assert "Exceeds the limit" not in err["message"] and "/data/models/" not in r.text
    # the server is fine afterwards
    ok = httpx.post(damaged.base + "/v1/chat/completions", timeout=120, json={
        "model": "starter", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
    assert ok.status_code == 200, ok.text


def test_a_template_that_would_grow_without_bound_is_a_400(damaged: ServerProcess):
    for name in TEMPLATES:
        body = {"model": name, "messages": [{"role": "user", "content": "hi"}],
                "max_tokens": 2}
        r = httpx.post(damaged.base + "/v1/chat/completions", json=body, timeout=120)
        assert r.status_code == 400, (name, r.text)
        err = r.json()["error"]
        assert err["code"] == "template_failed", err
        assert "too large" in err["message"] or "output limit" in err["message"], err
        assert "Exceeds the limit" not in err["message"]
