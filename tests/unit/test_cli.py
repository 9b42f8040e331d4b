"""The `localllm` command in a child process, as a user runs it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest


def cli(*args: str, stdin: str | None = None, tmp: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "LOCALLLM_CONFIG": str(tmp / "none.toml"),
           "LOCALLLM_DATA_DIR": str(tmp / "data"), "HF_HUB_CACHE": str(tmp / "hf")}
    return subprocess.run([sys.executable, "-m", "localllm", *args], input=stdin,
                          capture_output=True, text=True, env=env, timeout=120)


def test_run_streams_an_answer(tmp_path: Path):
    r = cli("run", "Write a haiku about the sea", "--max-tokens", "12", "--temperature", "0",
            "--threads", "2", tmp=tmp_path)
    assert r.returncode == 0, r.stderr
    again = cli("run", "Write a haiku about the sea", "--max-tokens", "12", "--temperature",
                "0", "--seed", "1", "--threads", "2", tmp=tmp_path)
    assert r.stdout.strip() and r.stdout == again.stdout
    assert "Traceback" not in r.stderr


def test_run_reads_stdin_and_system(tmp_path: Path):
    r = cli("run", "-", "--system", "You are a pirate.", "--max-tokens", "8", "--stats",
            "--threads", "2", stdin="Say hi", tmp=tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip()
    assert "generated 8 tokens" in r.stderr or "finish: stop" in r.stderr


def test_list_and_info(tmp_path: Path):
    r = cli("list", tmp=tmp_path)
    assert r.returncode == 0
    header, row = r.stdout.splitlines()[:2]
    assert header.split() == ["NAME", "FORMAT", "PARAMS", "QUANT", "SIZE", "CONTEXT", "SOURCE"]
    assert row.split()[:4] == ["starter", "gguf", "135M", "Q4_1"]
    info = cli("info", "starter", tmp=tmp_path)
    assert info.returncode == 0
    assert "architecture     llama" in info.stdout
    assert "trained context  8192 tokens" in info.stdout
    assert "chat template    yes" in info.stdout


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (("run", "hi", "--model", "/no/such/model.gguf"), "was not found (no such file)"),
        (("info", "nonexistent-model"), "Local models: starter"),
        (("run", "hi", "--max-tokens", "abc"), "expected a whole number, got 'abc'"),
        (("run", "hi", "--temperature", "9"), "expected a value from 0 to 2, got 9.0"),
        (("serve", "--port", "70000"), "a port is at most 65535, got 70000"),
        (("run",), "run needs a prompt"),
        (("frobnicate",), "invalid choice: 'frobnicate'"),
    ],
)
def test_errors_are_one_line_with_exit_code_2(tmp_path: Path, args: tuple[str, ...],
                                              needle: str):
    r = cli(*args, tmp=tmp_path)
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith("localllm: error:") and needle in lines[0]


def test_port_in_use_is_a_clear_error(tmp_path: Path):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        port = s.getsockname()[1]
        r = cli("serve", "--port", str(port), tmp=tmp_path)
    assert r.returncode == 2
    assert f"cannot listen on 127.0.0.1:{port}" in r.stderr
