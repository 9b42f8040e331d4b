"""What this machine offers: cores, memory, and whether a build can offload to a GPU."""

from __future__ import annotations

import os

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
