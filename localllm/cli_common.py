"""Pieces the command modules share: exit codes, progress on stderr, device names."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

EXIT_USAGE = 2


def positive_int(text: str) -> int:
    """An argparse type: a whole number of at least 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got '{text}'") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a number >= 1, got {value}")
    return value


def progress_printer(label: str) -> Callable[[float], None] | None:
    """A one-line progress display on stderr, only where a person is watching."""
    if not sys.stderr.isatty():
        return None
    last = [-1]

    def show(fraction: float) -> None:
        pct = int(fraction * 100)
        if pct != last[0]:
            last[0] = pct
            bar = "#" * (pct // 5)
            end = "\n" if pct >= 100 else ""
            sys.stderr.write(f"\r{label} [{bar:<20}] {pct:3d}%{end}")
            sys.stderr.flush()

    return show


def device_of(backend: str) -> str:
    """Where a backend computes on this machine, without loading a model."""
    if backend == "mlx":
        from localllm.backends.mlx import mlx_device

        return mlx_device()
    from localllm.backends.llamacpp import gpu_offload
    from localllm.hardware import physical_cores

    offload = gpu_offload()
    return "gpu (all layers offloaded)" if offload else f"cpu ({physical_cores()} threads)"
