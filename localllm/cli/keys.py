"""`localllm keys add|list|rm`: API keys for the endpoint."""

from __future__ import annotations

import argparse
import json
import sys
from datetime import datetime, timezone
from typing import Any

from localllm.cli.common import EXIT_USAGE, positive_int, print_table
from localllm.config import Settings
from localllm.engine.accounting import Accounting


def add_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    keys = sub.add_parser(
        "keys", parents=[common], help="API keys for the endpoint (add, list, rm)"
    )
    actions = keys.add_subparsers(dest="keys_command", metavar="ACTION", required=True)
    add = actions.add_parser("add", help="make a key; it is printed once, as the last line")
    add.add_argument("name", help="a name for the client (letters, digits, - _ .)")
    add.add_argument("--rpm", type=positive_int, help="requests per minute at most")
    add.add_argument(
        "--tokens-per-day", type=positive_int, help="prompt + completion tokens per UTC day"
    )
    add.add_argument(
        "--admin",
        action="store_true",
        help="may load, unload, pull and delete models and set LoRA adapters (a client "
        "key may not)",
    )
    listing = actions.add_parser("list", help="names, dates, limits and usage (no secrets)")
    listing.add_argument("--json", action="store_true", help="machine-readable output")
    rm = actions.add_parser("rm", help="revoke a key (at once, also in a running server)")
    rm.add_argument("name", help="the key's name")
    keys.set_defaults(run=run)


def run(settings: Settings, args: argparse.Namespace) -> int:
    accounting = Accounting.for_settings(settings)
    try:
        if args.keys_command == "add":
            secret = accounting.add_key(
                args.name, rpm=args.rpm, tokens_per_day=args.tokens_per_day, admin=args.admin
            )
            role = "an admin key" if args.admin else "a client key (no model management)"
            sys.stderr.write(
                f"Made the key '{args.name}', {role}. It is shown only now: clients send it "
                "as 'Authorization: Bearer KEY'. Every route but /health now needs a key; "
                "this user's own localllm commands use owner.key in the data folder.\n"
            )
            sys.stdout.write(secret + "\n")
            return 0
        if args.keys_command == "rm":
            if not accounting.remove_key(args.name):
                names = ", ".join(k.name for k in accounting.list_keys()) or "none"
                sys.stderr.write(f"localllm: error: no key named '{args.name}' (keys: {names})\n")
                return EXIT_USAGE
            sys.stderr.write(f"Revoked the key '{args.name}'.\n")
            return 0
        return _list_keys(accounting, as_json=args.json)
    finally:
        accounting.close()


def _list_keys(accounting: Accounting, *, as_json: bool) -> int:
    totals = accounting.totals()
    rows = []
    for key in accounting.list_keys():
        use = totals.get(key.name)
        rows.append(
            {
                "name": key.name,
                "role": "admin" if key.admin else "client",
                "hint": key.hint + "…",
                "created": _date(key.created),
                "rpm": key.rpm,
                "tokens_per_day": key.tokens_per_day,
                "tokens_today": accounting.tokens_today(key.name),
                "requests": use.requests if use else 0,
                "prompt_tokens": use.prompt_tokens if use else 0,
                "cached_tokens": use.cached_tokens if use else 0,
                "completion_tokens": use.completion_tokens if use else 0,
            }
        )
    if as_json:
        sys.stdout.write(json.dumps(rows, indent=2) + "\n")
        return 0
    if not rows:
        sys.stdout.write(
            "No API keys: the endpoint is open to this machine. "
            "Make one with `localllm keys add NAME`.\n"
        )
        return 0
    header = (
        "NAME",
        "ROLE",
        "KEY",
        "CREATED",
        "LIMITS",
        "TODAY",
        "REQUESTS",
        "PROMPT",
        "COMPLETION",
    )
    table = [header]
    for r in rows:
        limits = (
            ", ".join(
                part
                for part in (
                    f"{r['rpm']}/min" if r["rpm"] else "",
                    f"{r['tokens_per_day']} tok/day" if r["tokens_per_day"] else "",
                )
                if part
            )
            or "-"
        )
        table.append(
            (
                str(r["name"]),
                str(r["role"]),
                str(r["hint"]),
                str(r["created"]),
                limits,
                f"{r['tokens_today']} tok",
                str(r["requests"]),
                str(r["prompt_tokens"]),
                str(r["completion_tokens"]),
            )
        )
    print_table(table)
    return 0


def _date(ts: float) -> str:
    return datetime.fromtimestamp(ts, timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
