"""localllm convert: import a GGUF model into MLX, in the store."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from localllm.cli.common import (
    EXIT_USAGE,
    progress_printer,
)
from localllm.config import Settings


def add_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    convert = sub.add_parser(
        "convert", parents=[common], help="import a GGUF model into MLX (in the model store)"
    )
    convert.add_argument("model", help="model name, path or HF repo of a GGUF")
    convert.add_argument("--to", choices=["mlx"], required=True, help="the target format")
    convert.add_argument("--name", help="store name of the result (default: MODEL-mlx)")
    convert.set_defaults(run=run)


def run(settings: Settings, args: argparse.Namespace) -> int:
    from localllm.models.convert import find_import, import_gguf
    from localllm.models.store import ModelStore, dir_size
    from localllm.units import format_bytes

    ref = ModelStore.from_settings(settings).resolve(args.model)
    if ref.format != "gguf":
        sys.stderr.write(f"localllm: error: {ref.name} is already an MLX model ({ref.path})\n")
        return EXIT_USAGE
    before = find_import(settings.models_dir, ref.path)
    folder = import_gguf(
        ref,
        settings.models_dir,
        name=args.name,
        progress=progress_printer(f"Importing {ref.name}"),
    )
    size = dir_size(folder)
    verb = "already imported as" if before == folder else "imported as"
    print(f"{ref.name} {verb} {folder.name} ({format_bytes(size)}) in {folder}")
    print(f"run it with: localllm chat {folder.name}")
    return 0
