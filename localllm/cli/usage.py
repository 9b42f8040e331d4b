"""`localllm usage`: requests and tokens per client per day."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from localllm.cli.common import positive_int, print_table
from localllm.config import Settings
from localllm.engine.accounting import Accounting, Usage


def add_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    usage = sub.add_parser("usage", parents=[common], help="requests and tokens per client per day")
    usage.add_argument("--days", type=positive_int, help="only the last N days (default: all)")
    usage.add_argument("--json", action="store_true", help="machine-readable output")
    usage.set_defaults(run=run)


def run(settings: Settings, args: argparse.Namespace) -> int:
    accounting = Accounting.for_settings(settings)
    try:
        rows: list[Usage] = accounting.usage(args.days)
    finally:
        accounting.close()
    if args.json:
        sys.stdout.write(json.dumps([u.as_dict() for u in rows], indent=2) + "\n")
        return 0
    if not rows:
        sys.stdout.write("No requests counted yet.\n")
        return 0
    table = [("DAY", "CLIENT", "REQUESTS", "PROMPT", "CACHED", "COMPLETION", "SECONDS")]
    for u in rows:
        table.append(
            (
                u.day,
                u.client,
                str(u.requests),
                str(u.prompt_tokens),
                str(u.cached_tokens),
                str(u.completion_tokens),
                f"{u.seconds:.1f}",
            )
        )
    print_table(table)
    return 0
