"""`localllm remote add|list|rm`: engines elsewhere (vLLM, SGLang, TGI, llama-server)
whose models localllm serves as NAME/MODEL.

Registrations are [[remotes]] tables in the config file, edited with tomlkit so that
the rest of the file (comments, order) stays as the user wrote it. An API key is never
written: the registration names the environment variable that holds it.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from pathlib import Path
from typing import Any

from localllm.cli.common import EXIT_USAGE, drop_table, write_config
from localllm.config import Remote, Settings, config_path

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


def add_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    remote = sub.add_parser(
        "remote", parents=[common], help="engines elsewhere served as NAME/MODEL (add, list, rm)"
    )
    actions = remote.add_subparsers(dest="remote_command", metavar="ACTION", required=True)
    add = actions.add_parser("add", help="register an OpenAI-compatible engine")
    add.add_argument("name", help="a short name: its models are NAME/MODEL")
    add.add_argument("url", help="the engine's OpenAI base URL, e.g. http://gpu-box:8000/v1")
    add.add_argument(
        "--api-key-env", metavar="VAR", help="the environment variable that holds its API key"
    )
    add.add_argument(
        "--model",
        dest="models",
        action="append",
        metavar="ID",
        help="a model to serve (repeat for more); default: every model the engine lists",
    )
    add.add_argument("--fallback", metavar="MODEL", help="a local model to answer while it is down")
    listing = actions.add_parser("list", help="the engines, their models and whether they answer")
    listing.add_argument("--json", action="store_true", help="machine-readable output")
    rm = actions.add_parser("rm", help="forget an engine")
    rm.add_argument("name", help="the engine's name")
    remote.set_defaults(run=run)


def run(settings: Settings, args: argparse.Namespace) -> int:
    path = config_path(os.environ)
    if args.remote_command == "add":
        return _add(settings, args, path)
    if args.remote_command == "rm":
        return _rm(settings, args.name, path)
    return _list(settings, as_json=args.json)


def _add(settings: Settings, args: argparse.Namespace, path: Path) -> int:
    from localllm.backends.remote import Upstream

    if not _NAME.match(args.name):
        sys.stderr.write(
            f"localllm: error: remote name {args.name!r}: use letters, digits, - _ . "
            "(at most 64; no '/', since its models are NAME/MODEL)\n"
        )
        return EXIT_USAGE
    if any(r.name == args.name for r in settings.remotes):
        sys.stderr.write(
            f"localllm: error: a remote named '{args.name}' exists; "
            f"`localllm remote rm {args.name}` first\n"
        )
        return EXIT_USAGE
    url = args.url.rstrip("/")
    if not url.startswith(("http://", "https://")):
        sys.stderr.write(f"localllm: error: {url!r} is not an http:// or https:// URL\n")
        return EXIT_USAGE
    remote = Remote(args.name, url, args.api_key_env, tuple(args.models or ()), args.fallback)
    if args.api_key_env and not os.environ.get(args.api_key_env):
        sys.stderr.write(f"note: {args.api_key_env} is not set in this shell\n")
    reached = _answers(remote)
    upstream = Upstream(remote)
    found = upstream.models_sync() if reached else upstream.configured()
    if not reached and not remote.models:
        sys.stderr.write(
            f"localllm: error: {url}/models did not answer with a model list; check the URL "
            "(it ends in /v1 for most engines), or name the models with --model to add it "
            "anyway\n"
        )
        return 1
    write_config(path, lambda doc: _append(doc, remote))
    names = ", ".join(m.name for m in found) or "none listed yet"
    state = (
        ""
        if reached
        else " (it does not answer now: its requests get a 503, or its fallback, until it does)"
    )
    sys.stderr.write(f"Added '{args.name}' at {url}{state}. Models: {names}\n")
    return 0


def _answers(remote: Remote) -> bool:
    import httpx

    from localllm.backends.remote import PROBE_TIMEOUT_S, Upstream

    try:
        url = remote.url.rstrip("/") + "/models"
        reply = httpx.get(url, headers=Upstream(remote).headers(), timeout=PROBE_TIMEOUT_S)
    except httpx.HTTPError:
        return False
    return reply.status_code == 200


def _rm(settings: Settings, name: str, path: Path) -> int:
    if not any(r.name == name for r in settings.remotes):
        known = ", ".join(r.name for r in settings.remotes) or "none"
        sys.stderr.write(f"localllm: error: no remote named '{name}' (remotes: {known})\n")
        return EXIT_USAGE
    removed = write_config(path, lambda doc: drop_table(doc, "remotes", name))
    if not removed:
        sys.stderr.write(
            f"localllm: error: '{name}' is not registered in {path}; it comes from "
            "LOCALLLM_REMOTES, so unset it there\n"
        )
        return 1
    sys.stderr.write(f"Removed the remote '{name}'.\n")
    return 0


def _list(settings: Settings, *, as_json: bool) -> int:
    from localllm.backends.remote import Upstream

    records: list[dict[str, Any]] = []
    for remote in settings.remotes:
        upstream = Upstream(remote)
        reachable = _answers(remote)
        models = upstream.models_sync() if reachable else upstream.configured()
        records.append(
            {
                "name": remote.name,
                "url": remote.url,
                "api_key_env": remote.api_key_env,
                "api_key_set": bool(remote.api_key_env and os.environ.get(remote.api_key_env)),
                "fallback": remote.fallback,
                "reachable": reachable,
                "models": [{"name": m.name, "context_length": m.n_ctx} for m in models],
            }
        )
    if as_json:
        sys.stdout.write(json.dumps(records, indent=2) + "\n")
        return 0
    if not records:
        print("No remote engines. Add one: localllm remote add NAME URL [--model ID]")
        return 0
    from localllm.cli.common import print_table

    rows = [("NAME", "URL", "STATE", "MODELS", "FALLBACK")]
    for r in records:
        served = ", ".join(
            m["name"] + (f" ({m['context_length']} ctx)" if m["context_length"] else "")
            for m in r["models"]
        )
        state = "answers" if r["reachable"] else "unreachable"
        rows.append((str(r["name"]), str(r["url"]), state, served or "-", r["fallback"] or "-"))
    print_table(rows)
    return 0


# -- the config file -------------------------------------------------------------------------
def _append(doc: Any, remote: Remote) -> None:
    import tomlkit

    table = tomlkit.table()
    table["name"] = remote.name
    table["url"] = remote.url
    if remote.api_key_env:
        table["api_key_env"] = remote.api_key_env
    if remote.models:
        table["models"] = list(remote.models)
    if remote.fallback:
        table["fallback"] = remote.fallback
    if "remotes" not in doc:
        doc["remotes"] = tomlkit.aot()
    doc["remotes"].append(table)
