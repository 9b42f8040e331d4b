"""GGUF to MLX import (`localllm convert MODEL --to mlx`) on the real starter model."""

from __future__ import annotations

import ctypes
import json
from pathlib import Path

import pytest

from localllm.backends.base import LoadOptions, ModelRef
from localllm.cli import main
from localllm.errors import ImportFailed
from localllm.models import convert
from localllm.models.convert import find_import, import_gguf
from localllm.models.gguf import read_mlx_dir
from tests.conftest import THREADS
from tests.gguf_fixtures import copy_with_metadata

pytest.importorskip("mlx.core", reason="the mlx extra is not installed")


def store_entries(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir()) if folder.exists() else []


def test_import_writes_a_complete_described_model(starter_mlx_ref: ModelRef, starter_ref: ModelRef):
    folder = starter_mlx_ref.path
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
            "localllm.json"} <= set(store_entries(folder))
    config = json.loads((folder / "config.json").read_text())
    assert config["model_type"] == "llama" and config["rope_traditional"] is True
    assert config["num_hidden_layers"] == 30 and config["num_key_value_heads"] == 3
    prov = json.loads((folder / "localllm.json").read_text())
    assert prov["source"]["identity"]["path"] == str(starter_ref.path.resolve())
    assert prov["source"]["quant"] == "Q4_1"
    tok_config = json.loads((folder / "tokenizer_config.json").read_text())
    assert tok_config["eos_token"] == "<|im_end|>" and "chat_template" in tok_config
    meta = read_mlx_dir(folder)
    assert meta.params == 134_515_008  # the same count the GGUF header gives
    # reused, not rewritten, while the GGUF is unchanged
    stamp = (folder / "model.safetensors").stat().st_mtime_ns
    assert import_gguf(starter_ref, folder.parent) == folder
    assert (folder / "model.safetensors").stat().st_mtime_ns == stamp
    assert find_import(folder.parent, starter_ref.path) == folder


def test_imported_tokenizer_matches_llama_cpp(starter_mlx_ref: ModelRef, starter_ref: ModelRef):
    from localllm.backends.llamacpp import LlamaCppBackend
    from localllm.backends.mlx import MlxBackend

    texts = [
        "Hello, world!",
        "Numbers 1234567 and 3.14159, dates 2026-12-02.",
        "  leading spaces\n\nnew lines\ttabs",
        "Ünïcödé — «quotes» 🎉 中文 日本語",
        "def f(x):\n    return x ** 2  # square\n",
        "<|im_start|>user\nHi<|im_end|>",
    ]
    gguf = LlamaCppBackend().load(starter_ref, LoadOptions(n_threads=THREADS, n_ctx=256))
    try:
        mlx = MlxBackend().load(starter_mlx_ref, LoadOptions(n_ctx=256))
        for text in texts:
            for special in (False, True):
                assert mlx.tokenize(text, special=special) == gguf.tokenize(text, special=special)
            ids = gguf.tokenize(text, special=True)
            assert mlx.detokenize(ids) == gguf.detokenize(ids)
        assert mlx.info.eog_ids == gguf.info.eog_ids
        assert mlx.info.vocab_fingerprint == gguf.info.vocab_fingerprint
        mlx.close()
    finally:
        gguf.close()


def test_convert_command(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                         capsys: pytest.CaptureFixture[str]):
    monkeypatch.setenv("LOCALLLM_DATA_DIR", str(tmp_path / "data"))
    assert main(["convert", "starter", "--to", "mlx"]) == 0
    out = capsys.readouterr().out
    assert "starter imported as starter-mlx" in out
    assert store_entries(tmp_path / "data" / "models") == ["starter-mlx"]
    assert main(["convert", "starter", "--to", "mlx"]) == 0
    assert "already imported as starter-mlx" in capsys.readouterr().out
    assert main(["list"]) == 0
    listing = capsys.readouterr().out
    assert any(line.split()[:2] == ["starter-mlx", "mlx"] for line in listing.splitlines())
    assert main(["info", "starter-mlx"]) == 0
    info = capsys.readouterr().out
    assert "imported from" in info and "mlx (auto: an MLX model)" in info


def test_unknown_architecture_is_named(starter_ref: ModelRef, tmp_path: Path):
    odd = copy_with_metadata(starter_ref.path, tmp_path / "odd.gguf", {}, arch="mamba")
    models = tmp_path / "models"
    with pytest.raises(ImportFailed, match="does not know the 'mamba' architecture"):
        import_gguf(ModelRef("odd", odd, "gguf", "path"), models)
    assert store_entries(models) == []


def test_truncated_gguf_is_refused_with_both_sizes(starter_ref: ModelRef, tmp_path: Path):
    data = starter_ref.path.read_bytes()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(data[: len(data) // 2])
    models = tmp_path / "models"
    with pytest.raises(ImportFailed, match="truncated") as err:
        import_gguf(ModelRef("cut", cut, "gguf", "path"), models)
    assert str(len(data)) in err.value.message and str(len(data) // 2) in err.value.message
    assert store_entries(models) == []


def test_k_quants_are_refused_by_name(starter_ref: ModelRef, tmp_path: Path):
    import llama_cpp as ll

    q4k = tmp_path / "q4k.gguf"
    params = ll.llama_model_quantize_default_params()
    params.ftype = 15  # Q4_K_M
    params.allow_requantize = True
    rc = ll.llama_model_quantize(str(starter_ref.path).encode(), str(q4k).encode(),
                                 ctypes.byref(params))
    assert rc == 0
    with pytest.raises(ImportFailed, match=r"MLX cannot read .*Q4_K"):
        import_gguf(ModelRef("q4k", q4k, "gguf", "path"), tmp_path / "models")


def test_interrupted_import_leaves_nothing(starter_ref: ModelRef, tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch):
    def interrupted(*_args: object) -> None:
        raise KeyboardInterrupt  # Ctrl-C while the tokenizer is written, after the weights

    monkeypatch.setattr(convert, "_write_tokenizer", interrupted)
    models = tmp_path / "models"
    with pytest.raises(KeyboardInterrupt):
        import_gguf(starter_ref, models)
    assert store_entries(models) == []


@pytest.mark.process
def test_a_killed_conversion_leaves_nothing_behind(tmp_path: Path):
    """kill -9 while `localllm convert` writes: the next conversion removes the staging
    folder and the store only ever holds a complete import."""
    import os
    import signal
    import subprocess
    import sys
    import time

    env = {**os.environ, "LOCALLLM_DATA_DIR": str(tmp_path / "data"),
           "LOCALLLM_CONFIG": str(tmp_path / "none.toml")}
    models = tmp_path / "data" / "models"
    cmd = [sys.executable, "-m", "localllm", "convert", "starter", "--to", "mlx"]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    staged: list[Path] = []
    deadline = time.monotonic() + 120
    while not staged and proc.poll() is None and time.monotonic() < deadline:
        staged = list(models.glob(".convert-*/model")) if models.is_dir() else []
        time.sleep(0.01)
    assert staged, "the conversion never started writing"
    proc.send_signal(signal.SIGKILL)
    proc.wait(30)
    assert list(models.glob(".convert-*")), "the kill left its staging folder (as expected)"
    assert not (models / "starter-mlx").exists()
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert not list(models.glob(".*")), list(models.glob(".*"))
    assert (models / "starter-mlx" / "config.json").is_file()
