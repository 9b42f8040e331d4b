"""`localllm launch CLIENT`: point a coding agent or editor at this server, as `ollama
launch` does. For Codex CLI and opencode it writes their config file (backing up the one
it changes, under a name no earlier backup has) and starts the client; for Claude Code
it starts it with the environment it reads; for aider, Continue and Zed it prints the
snippet to use. `--print` changes nothing and prints what would be written or set.

The key: when the server has keys (`localllm keys add`), the client sends
`LOCALLLM_API_KEY` from the environment; a key is shown only once when made, so it is not
something this command can look up.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from pathlib import Path
from typing import Any

from localllm.cli.common import EXIT_USAGE
from localllm.config import Settings, tomllib
from localllm.fsguard import PathRefused, read_user_file, write_user_file

CLIENTS = ("claude", "codex", "opencode", "aider", "continue", "zed")
KEY_ENV = "LOCALLLM_API_KEY"


def add_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    launch = sub.add_parser(
        "launch", parents=[common], help="set up a coding agent or editor to use this server"
    )
    launch.add_argument("client", choices=CLIENTS, help="the client to set up")
    launch.add_argument("--model", "-m", help="the model the client asks for (default: starter)")
    launch.add_argument("--port", type=int, help="the server's port (default: the setting's)")
    launch.add_argument(
        "--print", dest="dry", action="store_true", help="print the settings; change nothing"
    )
    launch.set_defaults(run=run)


def _base(settings: Settings) -> str:
    host = "127.0.0.1" if settings.host in ("0.0.0.0", "::", "") else settings.host
    return f"http://{host}:{settings.port}"


def _codex(base: str, model: str, text: str, path: Path) -> str:
    """The user's Codex config with our provider and profile merged in (tomlkit: their
    comments, order and other keys stay; every value is escaped by the serializer)."""
    import tomlkit

    try:
        doc: Any = tomlkit.parse(text)
    except tomlkit.exceptions.ParseError as exc:
        raise PathRefused(f"{path} is not valid TOML ({exc}); fix it or move it away") from None
    ours = {
        ("model_providers", "localllm"): {
            "name": "localllm",
            "base_url": f"{base}/v1",
            "wire_api": "responses",
            "env_key": KEY_ENV,
        },
        ("profiles", "localllm"): {"model": model, "model_provider": "localllm"},
    }
    for (outer, inner), values in ours.items():
        if outer not in doc:
            doc.add(outer, tomlkit.table(is_super_table=True))
        section: Any = doc[outer]
        if not isinstance(section, dict):
            raise PathRefused(f"{path}: '{outer}' is not a table; fix it or move it away")
        if inner not in section:
            section[inner] = tomlkit.table()
        table: Any = section[inner]
        if not isinstance(table, dict):
            raise PathRefused(f"{path}: '{outer}.{inner}' is not a table; fix it or move it away")
        table.update(values)  # the user's own keys in our tables stay
    text = tomlkit.dumps(doc)
    tomllib.loads(text)  # read back before anything is written: a fault here is ours
    return text


def _opencode(base: str, model: str, text: str, path: Path) -> str:
    """The user's opencode config with our provider merged in."""
    try:
        current = json.loads(text) if text.strip() else {}
    except (ValueError, RecursionError):
        raise PathRefused(f"{path} is not valid JSON; fix it or move it away") from None
    if not isinstance(current, dict):
        raise PathRefused(f"{path} holds a JSON {type(current).__name__}, not an object")
    providers = current.get("provider", {})
    if not isinstance(providers, dict):
        raise PathRefused(f'{path}: its "provider" is a {type(providers).__name__}, not an object')
    mine = providers.get("localllm", {})
    if not isinstance(mine, dict):
        mine = {}
    models = mine.get("models")
    models = models if isinstance(models, dict) else {}
    provider = {
        **mine,
        "npm": "@ai-sdk/openai-compatible",
        "name": "localllm",
        "options": {"baseURL": f"{base}/v1", "apiKey": "{env:" + KEY_ENV + "}"},
        "models": {**models, model: {"name": model}},
    }
    out = {"$schema": "https://opencode.ai/config.json", **current}
    out["provider"] = {**providers, "localllm": provider}
    return json.dumps(out, indent=2, ensure_ascii=False) + "\n"


def _snippet(client: str, base: str, model: str) -> str:
    if client == "aider":
        return (
            f"OLLAMA_API_BASE={base} aider --model ollama_chat/{model}\n"
            f"# or, through the OpenAI API:\n"
            f"OPENAI_API_BASE={base}/v1 OPENAI_API_KEY=${{{KEY_ENV}:-unused}} "
            f"aider --model openai/{model}\n"
        )
    if client == "continue":
        return (
            "# ~/.continue/config.yaml, under models:\n"
            f"  - name: {model} (localllm)\n    provider: openai\n    model: {model}\n"
            f"    apiBase: {base}/v1\n    roles: [chat, edit, apply, autocomplete]\n"
        )
    settings = {
        "language_models": {
            "ollama": {"api_url": base},
            "openai_compatible": {
                "localllm": {"api_url": f"{base}/v1", "available_models": [{"name": model}]}
            },
        }
    }
    return "// Zed settings.json\n" + json.dumps(settings, indent=2) + "\n"


def run(settings: Settings, args: argparse.Namespace) -> int:
    base, model = _base(settings), settings.model or "starter"
    client = args.client
    if client in ("aider", "continue", "zed"):
        sys.stdout.write(_snippet(client, base, model))
        return 0
    env = dict(os.environ)
    if client == "claude":
        claude_env = {
            "ANTHROPIC_BASE_URL": base,
            "ANTHROPIC_AUTH_TOKEN": os.environ.get(KEY_ENV, "unused"),
            "ANTHROPIC_MODEL": model,
            # what it asks for by tier (its background work asks for "haiku"); the last
            # is the name Claude Code 1.x read
            "ANTHROPIC_DEFAULT_OPUS_MODEL": model,
            "ANTHROPIC_DEFAULT_SONNET_MODEL": model,
            "ANTHROPIC_DEFAULT_HAIKU_MODEL": model,
            "ANTHROPIC_SMALL_FAST_MODEL": model,
            # it gives up on an answer with no event for 5 minutes (the least it allows)
            # and asks again; a long prompt on a CPU can take longer than that to read
            "CLAUDE_STREAM_IDLE_TIMEOUT_MS": "1800000",
        }
        if args.dry:
            sys.stdout.write("".join(f"export {k}={v}\n" for k, v in claude_env.items()))
            return 0
        return _start(["claude"], env | claude_env)
    if client == "codex":
        path = Path(os.environ.get("CODEX_HOME", Path.home() / ".codex")) / "config.toml"
        old = read_user_file(path) or ""
        new = _codex(base, model, old, path)
        argv = ["codex", "--profile", "localllm"]
    else:
        path = Path.home() / ".config" / "opencode" / "opencode.json"
        old = read_user_file(path) or ""
        new = _opencode(base, model, old, path)
        argv = ["opencode", "-m", f"localllm/{model}"]
    if args.dry:
        sys.stdout.write(f"# {path}\n{new}")
        return 0
    if new != old:
        saved = write_user_file(path, new, backup=True)
        said = f" (the old one is {saved})" if saved else ""
        sys.stderr.write(f"localllm: wrote {path}{said}\n")
    env.setdefault(KEY_ENV, "unused")
    return _start(argv, env)


def _start(argv: list[str], env: dict[str, str]) -> int:
    found = shutil.which(argv[0])
    if found is None:
        sys.stderr.write(
            f"localllm: {argv[0]} is not on PATH; install it, or use --print to see the settings\n"
        )
        return EXIT_USAGE
    os.execvpe(found, argv, env)
    return 0  # not reached
