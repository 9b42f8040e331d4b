"""`localllm logs [-f]`: the running server's log, which `localllm serve` writes beside
its stderr into the data folder (rotated at 10 MiB, three old files kept)."""

from __future__ import annotations

import argparse
import logging
import logging.handlers
import sys
import time
from pathlib import Path
from typing import Any

from localllm.config import Settings

EVENTS = "localllm.serve"  # the server's own events, at INFO whatever log_level says
MAX_BYTES = 10 * 1024 * 1024
BACKUPS = 3


def log_path(settings: Settings) -> Path:
    return Path(settings.data_dir) / "logs" / "serve.log"


def write_file_log(settings: Settings) -> Path:
    """Send the server's log records (the access lines too) to its log file as well."""
    path = log_path(settings)
    path.parent.mkdir(parents=True, exist_ok=True)
    handler = logging.handlers.RotatingFileHandler(
        path, maxBytes=MAX_BYTES, backupCount=BACKUPS, encoding="utf-8"
    )
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logging.getLogger().addHandler(handler)
    logging.getLogger("localllm.access").addHandler(handler)
    events = logging.getLogger(EVENTS)  # started, serving, stopped: always written
    events.addHandler(handler)
    events.setLevel(logging.INFO)
    events.propagate = False
    return path


def add_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    logs = sub.add_parser("logs", parents=[common], help="the running server's log")
    logs.add_argument("-f", "--follow", action="store_true", help="keep printing new lines")
    logs.add_argument("-n", "--lines", type=int, default=50, help="lines to show (default 50)")
    logs.set_defaults(run=run)


def run(settings: Settings, args: argparse.Namespace) -> int:
    path = log_path(settings)
    if not path.is_file():
        sys.stderr.write(f"localllm: error: no server log at {path}; `localllm serve` writes it\n")
        return 1
    with path.open("rb") as fh:
        lines = fh.read().decode("utf-8", "replace").splitlines()
    for line in lines[-args.lines :] if args.lines > 0 else []:
        print(line)
    sys.stdout.flush()
    if args.follow:
        _follow(path)
    return 0


def _follow(path: Path) -> None:
    """Print lines as they are added, across rotations, until interrupted."""
    fh = path.open("rb")
    fh.seek(0, 2)
    inode = path.stat().st_ino
    pending = b""
    try:
        while True:
            chunk = fh.read()
            if chunk:
                pending += chunk
                *done, pending = pending.split(b"\n")
                for line in done:
                    print(line.decode("utf-8", "replace"), flush=True)
                continue
            time.sleep(0.2)
            try:
                stat = path.stat()
            except FileNotFoundError:
                continue  # between the rotation's rename and the new file
            if stat.st_ino != inode or stat.st_size < fh.tell():
                fh.close()
                fh = path.open("rb")  # rotated: the new file from its start
                inode = stat.st_ino
    finally:
        fh.close()
