"""Models being written into the store (quantized, converted): hidden staging folders
marked with the writing process's id, renamed into place when complete, and swept when
the process that wrote them is gone."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

STAGING_PREFIX = ".quantize-"
CONVERT_PREFIX = ".convert-"
STAGING_PREFIXES = (STAGING_PREFIX, CONVERT_PREFIX)
_OWNER = "owner.pid"


def staging_dir(models_dir: Path, prefix: str, name: str) -> Path:
    """A hidden folder in the store for a model being written, marked with this process's
    id so that `sweep_stale` can tell a killed run's leftovers from a running one."""
    models_dir.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f"{prefix}{name}-", dir=models_dir))
    (staging / _OWNER).write_text(str(os.getpid()))
    return staging


def sweep_stale(models_dir: Path) -> list[Path]:
    """Remove staging folders whose process is gone (a killed quantization's or
    conversion's leftovers)."""
    import psutil

    removed: list[Path] = []
    if not models_dir.is_dir():
        return removed
    folders = [f for prefix in STAGING_PREFIXES for f in models_dir.glob(prefix + "*")]
    for folder in folders:
        try:
            pid = int((folder / _OWNER).read_text())
        except (OSError, ValueError):
            pid = 0
        if pid and pid != os.getpid() and psutil.pid_exists(pid):
            continue
        shutil.rmtree(folder, ignore_errors=True)
        removed.append(folder)
    return removed
