"""localllm load: load (preload or pin) a model in the running server."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from localllm.cli.common import (
    admin,
    admin_failed,
    positive_int,
    server_flags,
)
from localllm.config import Settings

if TYPE_CHECKING:
    pass


def add_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    load = sub.add_parser(
        "load", parents=[common], help="load a model in the running server (preload or pin)"
    )
    load.add_argument("model", help="a model name from 'localllm list'")
    load.add_argument("--ctx", type=positive_int, dest="n_ctx", help="context size in tokens")
    load.add_argument(
        "--ttl", help="idle time before it unloads: seconds or 10m, 2h; -1 keeps it loaded"
    )
    server_flags(load)
    load.set_defaults(run=run)


def run(settings: Settings, args: argparse.Namespace) -> int:
    from localllm.units import format_bytes

    body: dict[str, Any] = {"model": args.model, "n_ctx": settings.n_ctx}
    if args.ttl is not None:
        body["keep_alive"] = args.ttl
    status, answer = admin(settings, "/admin/load", body)
    if status != 200:
        return admin_failed(status, answer)
    row = answer["loaded"]
    stays = "until unloaded" if row["expires_in_s"] is None else f"{row['expires_in_s']:.0f} s idle"
    print(
        f"{row['model']} loaded ({row['backend']}, ctx {row['n_ctx']}, "
        f"{format_bytes(int(row['memory_bytes']))}); stays {stays}"
    )
    return 0
