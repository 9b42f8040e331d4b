"""Helpers shared by the benchmarks: the machine description and a server process."""

from __future__ import annotations

import os
import platform
import socket
import subprocess
import sys
import time
from importlib.metadata import version
from pathlib import Path

import httpx
import psutil


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = psutil.virtual_memory().total / 2**30
    return (
        f"{cpu}; {psutil.cpu_count(logical=False)} physical / {psutil.cpu_count()} logical cores; "
        f"{mem:.0f} GiB RAM; {platform.system()} {platform.release()}; Python "
        f"{platform.python_version()}; llama-cpp-python {version('llama-cpp-python')}"
    )


def same_kernels() -> list[str]:
    """llama-server's flag for the weights' buffers localllm uses on this CPU: plain CPU
    buffers where it has AMX (backends/llamacpp.py), the repacked ones elsewhere."""
    from localllm.backends.llamacpp_native import has_amx

    return ["--no-repack"] if has_amx() else []


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Server:
    """`localllm serve` in a child process, ready when /health says so."""

    def __init__(self, *args: str, env: dict[str, str] | None = None) -> None:
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        env = {**os.environ, "LOCALLLM_CONFIG": os.devnull, **(env or {})}
        self.proc = subprocess.Popen(
            self.command(*args),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env=env,
        )
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                if httpx.get(self.base + "/health", timeout=1).status_code == 200:
                    return
            except httpx.TransportError:
                time.sleep(0.1)
        raise RuntimeError("server did not become ready")

    def command(self, *args: str) -> list[str]:
        """The server's command line (another OpenAI-compatible server: override this)."""
        return [sys.executable, "-m", "localllm", "serve", "--port", str(self.port), *args]

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(30)
