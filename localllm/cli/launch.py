"""`localllm launch CLIENT`: point a coding agent or editor at this server, as `ollama
launch` does. For Codex CLI and opencode it writes their config file (backing up the one
it changes) and starts the client; for Claude Code it starts it with the environment it
reads; for aider, Continue and Zed it prints the snippet to use. `--print` changes nothing
and prints what would be written or set.

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
import time
from pathlib import Path
from typing import Any

from localllm.cli.common import EXIT_USAGE
from localllm.config import Settings

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


def _backup(path: Path) -> Path | None:
    if not path.exists():
        return None
    copy = path.with_name(f"{path.name}.bak-{time.strftime('%Y%m%d-%H%M%S')}")
    shutil.copy2(path, copy)
    return copy


def _codex_block(base: str, model: str) -> str:
    return (
        "# written by `localllm launch codex`\n"
        "[model_providers.localllm]\n"
        'name = "localllm"\n'
        f'base_url = "{base}/v1"\n'
        'wire_api = "responses"\n'
        f'env_key = "{KEY_ENV}"\n\n'
        "[profiles.localllm]\n"
        f'model = "{model}"\n'
        'model_provider = "localllm"\n'
    )


def _replace_block(text: str, block: str) -> str:
    """`text` with our earlier block (from its marker to the next foreign table) replaced."""
    marker = "# written by `localllm launch codex`\n"
    if marker not in text:
        return text.rstrip() + ("\n\n" if text.strip() else "") + block
    head, _, rest = text.partition(marker)
    ours = ("[model_providers.localllm]", "[profiles.localllm]")
    lines = rest.splitlines(keepends=True)
    keep_from = len(lines)
    for i, line in enumerate(lines):
        if line.startswith("[") and not line.strip().startswith(ours):
            keep_from = i
            break
    return head + block + ("\n" + "".join(lines[keep_from:]) if keep_from < len(lines) else "")


def _opencode(base: str, model: str, current: dict[str, Any]) -> dict[str, Any]:
    provider = {
        "npm": "@ai-sdk/openai-compatible",
        "name": "localllm",
        "options": {"baseURL": f"{base}/v1", "apiKey": "{env:" + KEY_ENV + "}"},
        "models": {model: {"name": model}},
    }
    out = {"$schema": "https://opencode.ai/config.json", **current}
    out["provider"] = {**current.get("provider", {}), "localllm": provider}
    return out


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
        old = path.read_text() if path.exists() else ""
        new = _replace_block(old, _codex_block(base, model))
        argv = ["codex", "--profile", "localllm"]
    else:
        path = Path.home() / ".config" / "opencode" / "opencode.json"
        old = path.read_text() if path.exists() else ""
        try:
            current = json.loads(old) if old.strip() else {}
        except ValueError:
            sys.stderr.write(f"localllm: {path} is not valid JSON; fix it or move it away\n")
            return EXIT_USAGE
        new = json.dumps(_opencode(base, model, current), indent=2) + "\n"
        argv = ["opencode", "-m", f"localllm/{model}"]
    if args.dry:
        sys.stdout.write(f"# {path}\n{new}")
        return 0
    if new != old:
        path.parent.mkdir(parents=True, exist_ok=True)
        saved = _backup(path)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(new)
        tmp.replace(path)
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
