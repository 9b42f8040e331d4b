"""localllm completion: shell completion code (argcomplete's)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from localllm.config import Settings


def add_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    completion = sub.add_parser(
        "completion", parents=[common], help='shell completion: eval "$(localllm completion bash)"'
    )
    completion.add_argument("shell", choices=["bash", "zsh", "fish"])
    completion.set_defaults(run=run)


def run(_settings: Settings, args: argparse.Namespace) -> int:
    """The shell code that completes localllm's commands and flags (argcomplete's)."""
    import argcomplete

    sys.stdout.write(argcomplete.shellcode(["localllm"], shell=args.shell))
    return 0
