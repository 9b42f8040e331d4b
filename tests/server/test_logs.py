"""`localllm logs [-f]` reads the running server's log file, as a person runs it."""

from __future__ import annotations

import os
import queue
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from tests.conftest import ServerProcess


def _env(tmp: Path) -> dict[str, str]:
    return {**os.environ, "LOCALLLM_CONFIG": str(tmp / "none.toml"),
            "LOCALLLM_DATA_DIR": str(tmp / "data"), "LOCALLLM_CACHE_DIR": str(tmp / "cache")}


@pytest.mark.process
def test_logs_shows_and_follows_the_server(tmp_path: Path):
    cmd = [sys.executable, "-m", "localllm", "logs"]
    missing = subprocess.run(cmd, env=_env(tmp_path), capture_output=True, text=True)
    assert missing.returncode == 1 and "no server log at" in missing.stderr
    srv = ServerProcess(tmp_path)
    try:
        deadline = time.monotonic() + 30
        out = ""
        while "serving starter" not in out and time.monotonic() < deadline:
            out = subprocess.run([*cmd, "-n", "20"], env=_env(tmp_path), capture_output=True,
                                 text=True).stdout
            time.sleep(0.2)
        assert "serving starter at " + srv.base in out
        follow = subprocess.Popen([*cmd, "-f", "-n", "0"], env=_env(tmp_path),
                                  stdout=subprocess.PIPE, text=True)
        lines: queue.Queue[str] = queue.Queue()
        def read() -> None:
            for text in follow.stdout or ():
                lines.put(text)

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        try:
            # a request is logged after `logs -f` reached the end of the file: ask until one
            # shows (no fixed wait for it to get there)
            line = ""
            deadline = time.monotonic() + 60
            while '"route":"/v1/models"' not in line and time.monotonic() < deadline:
                httpx.get(srv.base + "/v1/models", timeout=10)
                try:
                    line = lines.get(timeout=0.5)
                except queue.Empty:
                    continue
            assert '"route":"/v1/models"' in line and '"status":200' in line, line
        finally:
            follow.terminate()
            follow.wait(10)
    finally:
        srv.stop()
    after = subprocess.run([*cmd, "-n", "1"], env=_env(tmp_path), capture_output=True, text=True)
    assert after.stdout.strip().endswith("stopped")
