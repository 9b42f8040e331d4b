"""Models other tools keep (LM Studio, Ollama), used where they lie; `localllm rm` for the
store's own models only. The folders are laid out as those tools lay them out."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from localllm.backends.base import ModelRef
from localllm.cli import main
from tests.conftest import starts_process


@pytest.fixture
@starts_process
def other_tools(tmp_path: Path, starter_ref: ModelRef, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An LM Studio folder with the starter GGUF, and an Ollama store whose manifest names
    the starter as a blob."""
    lms = tmp_path / "lmstudio"
    (lms / "HuggingFaceTB" / "SmolLM2-135M-Instruct-GGUF").mkdir(parents=True)
    shutil.copy(starter_ref.path, lms / "HuggingFaceTB" / "SmolLM2-135M-Instruct-GGUF"
                / "smollm2-135m-q4_1.gguf")
    ollama = tmp_path / "ollama"
    digest = hashlib.sha256(starter_ref.path.read_bytes()).hexdigest()
    (ollama / "blobs").mkdir(parents=True)
    shutil.copy(starter_ref.path, ollama / "blobs" / f"sha256-{digest}")
    manifest = ollama / "manifests" / "registry.ollama.ai" / "library" / "smollm2" / "135m"
    manifest.parent.mkdir(parents=True)
    manifest.write_text(json.dumps({"schemaVersion": 2, "layers": [
        {"mediaType": "application/vnd.ollama.image.template", "digest": "sha256:00"},
        {"mediaType": "application/vnd.ollama.image.model", "digest": f"sha256:{digest}"},
    ]}))
    monkeypatch.setenv("LOCALLLM_LMSTUDIO_DIR", str(lms))
    monkeypatch.setenv("LOCALLLM_OLLAMA_DIR", str(ollama))
    monkeypatch.setenv("LOCALLLM_DATA_DIR", str(tmp_path / "data"))
    return tmp_path


def test_list_shows_other_tools_models_where_they_live(other_tools: Path,
                                                       capsys: pytest.CaptureFixture[str]):
    assert main(["list"]) == 0
    rows = {line.split()[0]: line.split() for line in capsys.readouterr().out.splitlines()[1:]}
    assert rows["lmstudio:HuggingFaceTB/SmolLM2-135M-Instruct-GGUF"][-1] == "lmstudio"
    assert rows["ollama:smollm2:135m"][-1] == "ollama"
    assert rows["ollama:smollm2:135m"][3] == "Q4_1"  # its header was read in place


def test_an_ollama_model_runs_without_copying(other_tools: Path,
                                              capsys: pytest.CaptureFixture[str]):
    assert main(["run", "-m", "ollama:smollm2:135m", "--max-tokens", "3",
                 "--temperature", "0", "Hi"]) == 0
    assert capsys.readouterr().out.strip()
    assert not (other_tools / "data" / "models").exists()  # nothing was copied


def test_rm_never_touches_another_tools_files(other_tools: Path,
                                              capsys: pytest.CaptureFixture[str]):
    for name in ("ollama:smollm2:135m", "lmstudio:HuggingFaceTB/SmolLM2-135M-Instruct-GGUF",
                 "starter"):
        assert main(["rm", name, "--yes"]) == 2
        assert "never another tool's files" in capsys.readouterr().err
    assert len(list((other_tools / "ollama" / "blobs").iterdir())) == 1
    assert len(list((other_tools / "lmstudio").rglob("*.gguf"))) == 1


def test_rm_removes_a_store_model_and_asks_first(other_tools: Path, starter_ref: ModelRef,
                                                 capsys: pytest.CaptureFixture[str]):
    models = other_tools / "data" / "models"
    models.mkdir(parents=True)
    shutil.copy(starter_ref.path, models / "mine.gguf")
    env = {**os.environ}
    asked = subprocess.run([sys.executable, "-m", "localllm", "rm", "mine"], env=env,
                           stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60)
    assert asked.returncode == 2 and "without --yes" in asked.stderr
    assert (models / "mine.gguf").exists()  # not asked, not removed
    assert main(["rm", "mine", "--yes"]) == 0
    assert "Removed mine" in capsys.readouterr().out
    assert list(models.iterdir()) == []
