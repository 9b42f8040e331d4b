"""The command line as a person types it: flags on the bare command, and commands on the
MLX backend ending cleanly (a subprocess each)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest


def _env(tmp: Path) -> dict[str, str]:
    return {**os.environ, "LOCALLLM_CONFIG": str(tmp / "none.toml"),
            "LOCALLLM_DATA_DIR": str(tmp / "data"), "LOCALLLM_CACHE_DIR": str(tmp / "cache"),
            "HF_HUB_CACHE": str(tmp / "hf"), "LOCALLLM_LMSTUDIO_DIR": str(tmp / "lms"),
            "LOCALLLM_OLLAMA_DIR": str(tmp / "ollama")}


@pytest.mark.process
def test_flags_on_the_bare_command_open_the_chat(tmp_path: Path):
    r = subprocess.run([sys.executable, "-m", "localllm", "--port", "9000", "--help"],
                       env=_env(tmp_path), capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "usage: localllm chat" in r.stdout
    bad = subprocess.run([sys.executable, "-m", "localllm", "--port", "nine"],
                         env=_env(tmp_path), capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "--port" in bad.stderr and "Traceback" not in bad.stderr


@pytest.mark.process
def test_model_and_ctx_flags_on_the_bare_command(tmp_path: Path):
    """`localllm --model NAME --ctx 8192` is the chat on that model: a name that is not a
    model fails before the screen opens, naming it (exit 2); two names are refused."""
    r = subprocess.run([sys.executable, "-m", "localllm", "--model", "nope", "--ctx", "8192"],
                       env=_env(tmp_path), capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "'nope' was not found" in r.stderr, r.stderr
    two = subprocess.run([sys.executable, "-m", "localllm", "chat", "a", "--model", "b"],
                         env=_env(tmp_path), capture_output=True, text=True, timeout=60)
    assert two.returncode == 2 and "two models named: a and --model b" in two.stderr


def test_a_command_on_mlx_exits_cleanly(tmp_path: Path):
    pytest.importorskip("mlx.core", reason="the mlx extra is not installed")
    r = subprocess.run(
        [sys.executable, "-m", "localllm", "run", "--backend", "mlx", "Hi", "--max-tokens", "4",
         "--temperature", "0"],
        env=_env(tmp_path), capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip()  # the answer
    assert "terminate called" not in r.stderr and "Aborted" not in r.stderr
    assert not [line for line in r.stderr.splitlines()
                if line.strip() and not line.startswith(("Importing", "Loading", "\r"))]
