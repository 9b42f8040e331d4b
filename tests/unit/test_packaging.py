"""packaging/compose: the vLLM + localllm example. Checked by `docker compose config` where
Compose is installed; always parsed, and its localllm settings read as localllm reads them."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from localllm.config import load_settings

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "packaging" / "compose" / "docker-compose.yml"


def _has_compose() -> bool:
    docker = shutil.which("docker")
    if docker is None:
        return False
    probe = subprocess.run([docker, "compose", "version"], capture_output=True, timeout=30)
    return probe.returncode == 0


@pytest.mark.process
def test_compose_file_is_valid_and_localllm_reads_its_settings(tmp_path: Path):
    if _has_compose():
        checked = subprocess.run(
            ["docker", "compose", "-f", str(COMPOSE), "config", "--quiet"],
            capture_output=True, text=True, timeout=60, env={**os.environ, "VLLM_API_KEY": "x"},
        )
        assert checked.returncode == 0, checked.stderr
    doc = yaml.safe_load(COMPOSE.read_text())
    vllm, front = doc["services"]["vllm"], doc["services"]["localllm"]
    gpu = vllm["deploy"]["resources"]["reservations"]["devices"][0]
    assert gpu["driver"] == "nvidia" and "gpu" in gpu["capabilities"]
    assert front["depends_on"]["vllm"]["condition"] == "service_healthy"
    dockerfile = COMPOSE.parent / front["build"]["context"] / front["build"]["dockerfile"]
    assert dockerfile.resolve() == ROOT / "packaging" / "docker" / "Dockerfile"
    text = dockerfile.read_text()
    assert "HEALTHCHECK" in text and "/health" in text and "USER localllm" in text
    env = front["environment"]
    settings = load_settings(env={
        "LOCALLLM_CONFIG": str(tmp_path / "none.toml"),
        "LOCALLLM_REMOTES": env["LOCALLLM_REMOTES"],
        "LOCALLLM_ROUTES": env["LOCALLLM_ROUTES"],
    })
    (remote,) = settings.remotes
    assert remote.url == "http://vllm:8000/v1" and remote.api_key_env == "VLLM_API_KEY"
    assert remote.api_key_env in env  # the key reaches the container, never the config
    assert {r.model for r in settings.routes} == {"gpu/qwen", "starter"}
    assert "--served-model-name=qwen" in vllm["command"] and remote.models == ("qwen",)
