"""What this machine offers: cores, memory, and whether a build can offload to a GPU."""

from __future__ import annotations

import os
import platform
import sys

import psutil


def physical_cores() -> int:
    """Physical CPU cores (hyper-threads share execution units, so they do not help decoding)."""
    n = psutil.cpu_count(logical=False) or os.cpu_count() or 1
    return max(1, int(n))


def available_memory() -> int:
    """Bytes of memory available to new allocations without swapping."""
    return int(psutil.virtual_memory().available)


def process_memory() -> int:
    """Resident set size of this process in bytes."""
    return int(psutil.Process().memory_info().rss)


def gpu_free_memory() -> tuple[str, int] | None:
    """(name, free bytes) of the first NVIDIA GPU, from nvidia-smi; None where there is none."""
    import shutil
    import subprocess

    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    try:
        out = subprocess.run(
            [exe, "--query-gpu=name,memory.free", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=5,
            check=True,
        ).stdout
        name, free_mib = out.splitlines()[0].rsplit(",", 1)
        return name.strip(), int(free_mib.strip()) * 1024 * 1024
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        return None


def apple_silicon() -> bool:
    """macOS on arm64, where MLX runs on the GPU through Metal."""
    return sys.platform == "darwin" and platform.machine() == "arm64"
