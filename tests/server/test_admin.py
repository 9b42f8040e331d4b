"""`localllm load` and `localllm stop` against a real server: preload and pin, unload one
or all, the key when keys exist, and the words when no server runs."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.conftest import ServerProcess, free_port


def run(srv_port: int, tmp: Path, *args: str, key: str | None = None):
    env = {**os.environ, "LOCALLLM_DATA_DIR": str(tmp / "data"),
           "LOCALLLM_CONFIG": str(tmp / "none.toml")}
    env.pop("LOCALLLM_API_KEY", None)
    if key:
        env["LOCALLLM_API_KEY"] = key
    return subprocess.run([sys.executable, "-m", "localllm", *args, "--port", str(srv_port)],
                          env=env, capture_output=True, text=True, timeout=120)


def loaded(srv: ServerProcess) -> dict[str, dict]:
    return {row["model"]: row for row in srv.health()["models"]}


def test_load_pin_and_stop(tmp_path: Path, starter_ref):
    models = tmp_path / "data" / "models"
    models.mkdir(parents=True)
    (models / "twin.gguf").symlink_to(starter_ref.path)
    srv = ServerProcess(tmp_path)
    try:
        done = run(srv.port, tmp_path, "load", "twin", "--ttl", "-1", "--ctx", "512")
        assert done.returncode == 0, done.stderr
        assert "twin loaded" in done.stdout and "until unloaded" in done.stdout
        row = loaded(srv)["twin"]
        assert row["expires_in_s"] is None and row["n_ctx"] == 512 and not row["default"]
        done = run(srv.port, tmp_path, "load", "twin", "--ttl", "10m")
        assert done.returncode == 0 and "stays 600 s idle" in done.stdout, done.stdout
        done = run(srv.port, tmp_path, "stop", "twin")
        assert done.returncode == 0 and "unloaded twin" in done.stdout
        assert "twin" not in loaded(srv)
        done = run(srv.port, tmp_path, "stop", "twin")
        assert done.returncode == 1 and "is not loaded (loaded: starter)" in done.stderr
        done = run(srv.port, tmp_path, "load", "nosuch")
        assert done.returncode == 1 and "was not found" in done.stderr
        done = run(srv.port, tmp_path, "load", "starter", "--ctx", "1024")
        assert done.returncode == 0, done.stderr
        row = loaded(srv)["starter"]
        assert row["n_ctx"] == 1024 and row["default"]  # reloaded, still the default
        done = run(srv.port, tmp_path, "stop", "--all")
        assert done.returncode == 0 and "unloaded starter" in done.stdout
        assert srv.health()["models"] == []
        # the next request loads the default model again
        r = httpx.post(srv.base + "/v1/completions", json={"prompt": "Hi", "max_tokens": 2},
                       timeout=120)
        assert r.status_code == 200 and "starter" in loaded(srv)
        def key(*args: str) -> str:
            made = subprocess.run([sys.executable, "-m", "localllm", "keys", "add", *args],
                                  env={**os.environ, "LOCALLLM_DATA_DIR": str(tmp_path / "data")},
                                  capture_output=True, text=True, timeout=60)
            return made.stdout.strip().splitlines()[-1]

        client, ops = key("editor"), key("ops", "--admin")
        # keys on: a client key may not unload models for everyone (#52)
        done = run(srv.port, tmp_path, "stop", "--all", key=client)
        assert done.returncode == 1 and "'editor' is a client key" in done.stderr
        done = run(srv.port, tmp_path, "stop", "--all", key=ops)
        assert done.returncode == 0, done.stderr
        # the data folder's owner needs no key: the command sends owner.key
        run(srv.port, tmp_path, "load", "starter", key=ops)
        done = run(srv.port, tmp_path, "stop", "--all")
        assert done.returncode == 0 and "unloaded starter" in done.stdout, done.stderr
    finally:
        srv.stop()


@pytest.mark.process
def test_stop_without_a_server_says_so(tmp_path: Path):
    done = run(free_port(), tmp_path, "stop", "--all")
    assert done.returncode == 1 and "no localllm server answers" in done.stderr
    done = run(free_port(), tmp_path, "stop")
    assert done.returncode == 2 and "name a model to unload, or --all" in done.stderr


def test_a_context_beyond_training_is_refused_and_the_default_stays(server: ServerProcess):
    r = httpx.post(server.base + "/admin/load", json={"model": "starter", "n_ctx": 1048575},
                   timeout=60)
    assert r.status_code == 400 and "8192 tokens starter was trained for" in r.text
    r = httpx.post(server.base + "/admin/load", json={"model": "", "n_ctx": 512}, timeout=60)
    assert r.status_code == 400 and "not empty" in r.text
