"""Store resolution and GGUF header reading, on real files."""

from pathlib import Path

import pytest

from localllm.backends.base import ModelRef
from localllm.errors import ModelLoadError, ModelNotFound
from localllm.models.gguf import read_gguf
from localllm.models.store import ModelStore
from localllm.units import format_params


def test_starter_header(starter_ref: ModelRef):
    meta = read_gguf(starter_ref.path)
    assert meta.arch == "llama"
    assert meta.quant == "Q4_1"
    assert format_params(meta.params) == "135M"
    assert meta.n_ctx_train == 8192
    assert meta.vocab_size == 49152
    assert meta.chat_template and "im_start" in meta.chat_template
    assert meta.n_layers == 30 and meta.n_head == 9 and meta.n_head_kv == 3


def test_truncated_and_foreign_files_are_clear_errors(tmp_path: Path, starter_ref: ModelRef):
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(starter_ref.path.read_bytes()[:5000])
    with pytest.raises(ModelLoadError, match="damaged GGUF header"):
        read_gguf(cut)
    other = tmp_path / "notes.gguf"
    other.write_text("hello")
    with pytest.raises(ModelLoadError, match="not a GGUF file"):
        read_gguf(other)


def test_resolve_starter_path_store_and_missing(tmp_path: Path, starter_ref: ModelRef):
    models = tmp_path / "models"
    models.mkdir()
    (models / "mine.gguf").symlink_to(starter_ref.path)
    store = ModelStore(models, hf_cache=tmp_path / "hf")
    assert store.resolve(None).source == "starter"
    assert store.resolve("mine").source == "store"
    by_path = store.resolve(str(starter_ref.path))
    assert by_path.source == "path" and by_path.path == starter_ref.path.resolve()
    with pytest.raises(ModelNotFound) as err:
        store.resolve("./nope.gguf")
    assert "no such file" in err.value.message
    assert "starter" in err.value.message and "mine" in err.value.message


def test_hf_cache_layout(tmp_path: Path, starter_ref: ModelRef):
    repo = tmp_path / "hf" / "models--acme--tiny-GGUF"
    snap = repo / "snapshots" / "abc123"
    snap.mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("abc123")
    (snap / "tiny.Q4_K_M.gguf").symlink_to(starter_ref.path)
    (snap / "tiny.Q8_0.gguf").symlink_to(starter_ref.path)
    store = ModelStore(tmp_path / "models", hf_cache=tmp_path / "hf")
    names = store.names()
    assert "acme/tiny-GGUF/tiny.Q4_K_M.gguf" in names
    assert store.resolve("acme/tiny-GGUF:q8_0").path.name == "tiny.Q8_0.gguf"
    with pytest.raises(ModelNotFound, match="several GGUF files match"):
        store.resolve("acme/tiny-GGUF")
