"""localllm ps: what the running server has loaded, its requests and its prompt cache."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from localllm.cli.common import print_json, print_table, server_flags
from localllm.config import Settings


def add_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    ps = sub.add_parser(
        "ps", parents=[common], help="what the running server has loaded, and its prompt cache"
    )
    ps.add_argument("--json", action="store_true", help="the server's /health as JSON")
    server_flags(ps)
    ps.set_defaults(run=run)


def run(settings: Settings, _args: argparse.Namespace) -> int:
    import json
    import urllib.error
    import urllib.request

    from localllm.units import format_bytes

    url = settings.base_url().removesuffix("/v1") + "/health"
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            health = json.loads(resp.read())
    except urllib.error.HTTPError as exc:  # 503 while loading still has a body
        health = json.loads(exc.read() or b"{}")
    except (urllib.error.URLError, OSError, ValueError) as exc:
        reason = getattr(exc, "reason", exc)
        sys.stderr.write(f"localllm: error: no localllm server answers at {url} ({reason})\n")
        return 1
    if getattr(_args, "json", False):
        print_json(health)
        return 0
    cache = health.get("prompt_cache") or {}
    totals = health.get("totals") or {}
    _print_loaded(health.get("models") or [])
    _print_remotes(health.get("remotes") or [])
    _print_activity(health.get("activity") or {})
    rows = [
        ("default model", f"{health.get('model') or '-'} ({health.get('status', '?')})"),
        ("requests", f"{totals.get('requests', 0)} ({health.get('queued', 0)} queued now)"),
        ("loads", f"{totals.get('loads', 0)} loads, {totals.get('unloads', 0)} unloads"),
        (
            "prompt cache",
            f"{cache.get('ram_entries', 0)} in RAM, {format_bytes(int(cache.get('ram_bytes', 0)))}"
            f" of {format_bytes(int(cache.get('ram_budget_bytes', 0)))}; "
            f"{cache.get('disk_entries', 0)} on disk, "
            f"{format_bytes(int(cache.get('disk_bytes', 0)))}",
        ),
        (
            "cache hits",
            f"{cache.get('hits', 0)} of {cache.get('requests', 0)} requests "
            f"({float(cache.get('hit_rate', 0.0)):.0%}); {cache.get('restored', 0)} states "
            f"restored, {cache.get('evicted', 0)} evicted",
        ),
    ]
    width = max(len(k) for k, _ in rows)
    for key, value in rows:
        print(f"{key.ljust(width)}  {value}")
    return 0


def _print_remotes(remotes: list[dict[str, Any]]) -> None:
    """Each remote engine: up, or down for how long and why."""
    if not remotes:
        return
    rows = [("REMOTE", "URL", "STATE", "FAILURES", "LAST ERROR")]
    for r in remotes:
        state = "up" if r["state"] == "up" else f"down ({r['down_for_s']:.0f} s left)"
        rows.append((r["name"], r["url"], state, str(r["failures"]), r.get("last_error") or "-"))
    print_table(rows)
    print()


def _print_activity(activity: dict[str, Any]) -> None:
    """The requests running now, with each one's prefill progress."""
    running = activity.get("requests") or []
    if not running:
        return
    rows = [("MODEL", "SEQ", "STATE", "PROMPT", "CACHED", "GENERATED", "PRIORITY")]
    for r in running:
        prompt = f"{r.get('prefilled', 0)}/{r.get('prompt_tokens', 0)}"
        rows.append(
            (
                str(r.get("model")),
                str(r.get("seq")),
                str(r.get("state")) + (" (deterministic)" if r.get("deterministic") else ""),
                prompt,
                str(r.get("cached", 0)),
                str(r.get("generated", 0)),
                str(r.get("priority")),
            )
        )
    print_table(rows)
    print(f"{activity.get('queued', 0)} waiting\n")


def _print_loaded(models: list[dict[str, Any]]) -> None:
    """The loaded models as a table, like `docker ps`."""
    from localllm.units import format_bytes

    if not models:
        print("No model is loaded.\n")
        return
    rows = [("NAME", "BACKEND", "CONTEXT", "PARALLEL", "MEMORY", "KV", "IDLE", "UNLOADS IN")]
    for m in models:
        until = "never (default)" if m.get("default") else "never"
        if m.get("expires_in_s") is not None:
            until = f"{m['expires_in_s']:.0f} s"
        if m.get("draft_for"):
            until = f"with {m['draft_for']} (its draft)"
        rows.append(
            (
                str(m.get("model")),
                f"{m.get('backend')} {m.get('device')}",
                str(m.get("n_ctx")),
                f"{m.get('active', 0)}/{m.get('parallel', 1)} active",
                format_bytes(int(m.get("memory_bytes") or 0)),
                f"{format_bytes(int(m.get('kv_bytes') or 0))} {m.get('kv_type') or ''}".strip(),
                f"{m.get('idle_s') or 0:.0f} s",
                until,
            )
        )
    print_table(rows)
    print()
