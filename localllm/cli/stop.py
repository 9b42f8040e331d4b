"""localllm stop: unload models from the running server."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, Any

from localllm.cli.common import (
    EXIT_USAGE,
    admin,
    admin_failed,
    server_flags,
)
from localllm.config import Settings

if TYPE_CHECKING:
    pass


def add_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    stop = sub.add_parser("stop", parents=[common], help="unload models from the running server")
    stop.add_argument("model", nargs="?", help="the model to unload")
    stop.add_argument("--all", action="store_true", help="unload every model")
    server_flags(stop)
    stop.set_defaults(run=run)


def run(settings: Settings, args: argparse.Namespace) -> int:
    if (args.model is None) == (not args.all):
        sys.stderr.write("localllm: error: name a model to unload, or --all\n")
        return EXIT_USAGE
    body = {"all": True} if args.all else {"model": args.model}
    status, answer = admin(settings, "/admin/unload", body)
    if status != 200:
        return admin_failed(status, answer)
    gone = answer["unloaded"]
    print(f"unloaded {', '.join(gone)}" if gone else "nothing was loaded")
    return 0
