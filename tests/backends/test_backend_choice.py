"""Which backend runs a model (`--backend auto|llamacpp|mlx`), and why."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from localllm import backends
from localllm.backends.base import ModelRef
from localllm.config import Settings
from localllm.engine import placement
from localllm.engine.engine import Engine
from localllm.engine.placement import plan
from localllm.engine.request import Request
from localllm.errors import BackendUnavailable
from tests.conftest import THREADS
from tests.gguf_fixtures import copy_with_metadata

mlx_installed = pytest.mark.skipif(
    not backends.get_backend("mlx").available(), reason="the mlx extra is not installed"
)


def test_auto_is_llama_cpp_off_apple_silicon(starter_ref: ModelRef, tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(placement, "apple_silicon", lambda: False)
    chosen = plan(starter_ref, "auto", tmp_path)
    assert chosen.backend == "llamacpp" and "not Apple Silicon" in chosen.reason
    assert not chosen.needs_import


@mlx_installed
def test_auto_prefers_mlx_on_apple_silicon(starter_ref: ModelRef, tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(placement, "apple_silicon", lambda: True)
    chosen = plan(starter_ref, "auto", tmp_path)
    assert chosen.backend == "mlx" and chosen.needs_import
    assert chosen.text == "auto: Apple Silicon; imports the GGUF once"
    odd = copy_with_metadata(starter_ref.path, tmp_path / "odd.gguf", {}, arch="mamba")
    fallback = plan(ModelRef("odd", odd, "gguf", "path"), "auto", tmp_path)
    assert fallback.backend == "llamacpp" and "'mamba'" in fallback.reason


@mlx_installed
def test_mlx_model_is_refused_by_llama_cpp(starter_mlx_ref: ModelRef, tmp_path: Path):
    assert plan(starter_mlx_ref, "auto", tmp_path).backend == "mlx"
    with pytest.raises(BackendUnavailable, match=r"llama\.cpp runs GGUF files"):
        plan(starter_mlx_ref, "llamacpp", tmp_path)


@mlx_installed
def test_engine_runs_a_gguf_on_mlx_and_swaps_back(tmp_path: Path):
    settings = Settings(n_threads=THREADS, backend="mlx", n_ctx=256, data_dir=tmp_path / "data")
    engine = Engine(settings)
    try:
        info = engine.load("starter")
        assert (info.id, info.backend, info.format) == ("starter", "mlx", "mlx")
        assert info.extra["backend_reason"] == "set to mlx; MLX import starter-mlx"
        assert (settings.models_dir / "starter-mlx" / "config.json").is_file()
        request = Request(
            engine_params(max_tokens=3), messages=[backends.base.Message("user", "Hi")]
        )
        assert sum(len(c.tokens) for c in engine.generate(request)) == 3
        info = engine.load("starter", backend="llamacpp")
        assert info.backend == "llamacpp" and info.extra["backend_reason"] == "set to llamacpp"
    finally:
        engine.close()


def engine_params(**kw: int) -> backends.base.SamplingParams:
    return backends.base.SamplingParams(temperature=0.0).with_overrides(**kw)


BLOCK_MLX = """
import sys
class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("mlx", "mlx_lm"):
            raise ModuleNotFoundError(f"No module named {name!r}")
        return None
sys.meta_path.insert(0, Block())
from localllm.cli import main
sys.exit(main(sys.argv[1:]))
"""


def run_without_mlx(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "LOCALLLM_DATA_DIR": str(tmp_path / "data")}
    return subprocess.run([sys.executable, "-c", BLOCK_MLX, *args], capture_output=True,
                          text=True, env=env, timeout=120)


def test_without_mlx_the_rest_works_and_mlx_names_the_install(tmp_path: Path):
    """Installed without the mlx extra (staged by hiding the packages from imports)."""
    asked = run_without_mlx(tmp_path, "run", "--backend", "mlx", "--max-tokens", "2", "Hi")
    assert asked.returncode == 1
    assert "The mlx backend is not available: install it with: pip install 'localllm[mlx]'" in (
        asked.stderr
    )
    assert "Traceback" not in asked.stderr
    plain = run_without_mlx(tmp_path, "run", "--max-tokens", "2", "--temperature", "0", "Hi")
    assert plain.returncode == 0, plain.stderr
    assert plain.stdout.strip()
    info = run_without_mlx(tmp_path, "info", "starter")
    assert info.returncode == 0 and "llamacpp (auto:" in info.stdout
