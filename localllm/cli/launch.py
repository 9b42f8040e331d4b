"""`localllm launch CLIENT`: point a coding agent or editor at this server, as `ollama
launch` does. It asks the running server which model it serves and points the client
at that one (`--model` still wins; with no server answering it says how to start one).
For Codex CLI and opencode it writes their config file (backing up the one it changes,
under a name no earlier backup has) and starts the client with any arguments given after
`--`; Claude Code and aider it starts with the environment they read; for Continue and
Zed it prints the snippet to use. `--print` changes nothing and prints what would be
written or set.

Codex CLI: the profile lives in its own file, `$CODEX_HOME/localllm.config.toml` (read by
0.150 to 0.171, the versions tried; 0.171 refuses `--profile localllm` while config.toml
still holds a `[profiles.localllm]` table or a `profile = "localllm"` selector, as an
earlier launch wrote, so those move into that file).

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
SNIPPETS = ("continue", "zed")  # printed, not started
# the Codex CLI versions `launch codex` was run with (its profile file): 0.150.0, 0.170.0
# and 0.171.0, the newest on 2026-12-07; `make clients` runs the newest through launch
CODEX_TESTED = (0, 150, 0)
TESTED_TEXT = "0.150 to 0.171"
KEY_ENV = "LOCALLLM_API_KEY"


def add_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    launch = sub.add_parser(
        "launch",
        parents=[common],
        help="set up a coding agent or editor to use this server, and start it",
        description="Set up a coding agent or editor to use this server, and start it; "
        "arguments after -- go to the client (localllm launch codex -- exec 'fix the test').",
    )
    launch.add_argument("client", choices=CLIENTS, help="the client to set up")
    launch.add_argument(
        "--model",
        "-m",
        help="the model the client asks for (default: the one the running server serves)",
    )
    launch.add_argument("--port", type=int, help="the server's port (default: the setting's)")
    launch.add_argument(
        "--print", dest="dry", action="store_true", help="print the settings; change nothing"
    )
    launch.set_defaults(run=run, client_args=[])  # what follows `--` (cli.PASSTHROUGH)


def _base(settings: Settings) -> str:
    host = "127.0.0.1" if settings.host in ("0.0.0.0", "::", "") else settings.host
    return f"http://{host}:{settings.port}"


def _served(base: str) -> tuple[bool, str | None]:
    """Whether a server answers at `base`, and the model it serves by default (from
    /health, which needs no key; else the first model /v1/models lists as loaded)."""
    import httpx

    headers = {"Authorization": f"Bearer {os.environ[KEY_ENV]}"} if KEY_ENV in os.environ else {}
    try:
        with httpx.Client(base_url=base, timeout=3.0, headers=headers) as http:
            health = http.get("/health")
            # a server still loading (503) says which model too
            model = health.json().get("model") if health.status_code in (200, 503) else None
            if model is None:
                rows = http.get("/v1/models").json().get("data", [])
                model = next((r["id"] for r in rows if r.get("loaded_context_length")), None)
    except (httpx.HTTPError, ValueError, AttributeError, KeyError, TypeError):
        return _answers(base), None
    return True, model if isinstance(model, str) and model else None


def _answers(base: str) -> bool:
    """Something accepts connections at `base` (a server busy or behind a key)."""
    import httpx

    try:
        httpx.get(base, timeout=3.0)
    except httpx.HTTPError:
        return False
    return True


def _pick_model(settings: Settings, asked: str | None, base: str, client: str) -> tuple[str, str]:
    """--model; else the running server's default model; else the setting's. With the
    line that says which (and how to start a server when none answers)."""
    if asked:
        return asked, ""
    up, served = _served(base)
    fallback = settings.model or "starter"
    if served:
        return served, f"localllm: the server at {base} serves {served}; {client} will use it\n"
    if up:
        return fallback, (
            f"localllm: the server at {base} did not say which model it serves; "
            f"{client} will ask for {fallback} (--model to choose)\n"
        )
    return fallback, (
        f"localllm: no server answers at {base}; start one with `localllm serve` "
        f"(`--model NAME` to serve another model); {client} will ask for {fallback}\n"
    )


def _toml(text: str, path: Path) -> Any:
    import tomlkit

    try:
        return tomlkit.parse(text)
    except tomlkit.exceptions.ParseError as exc:
        raise PathRefused(f"{path} is not valid TOML ({exc}); fix it or move it away") from None


def _table(doc: Any, path: Path, *keys: str) -> Any:
    """The table at doc[k1][k2]..., made when missing (a super-table for a parent);
    PathRefused when something else is there."""
    import tomlkit

    here, name = doc, ""
    for i, key in enumerate(keys):
        name = f"{name}.{key}" if name else key
        if key not in here:
            here.add(key, tomlkit.table(is_super_table=i < len(keys) - 1))
        here = here[key]
        if not isinstance(here, dict):
            raise PathRefused(f"{path}: '{name}' is not a table; fix it or move it away")
    return here


def _dumped(doc: Any) -> str:
    import tomlkit

    text = tomlkit.dumps(doc)
    tomllib.loads(text)  # read back before anything is written: a fault here is ours
    return text


def _provider(base: str) -> dict[str, str]:
    return {
        "name": "localllm",
        "base_url": f"{base}/v1",
        "wire_api": "responses",
        "env_key": KEY_ENV,
    }


def _codex_profile(
    base: str, model: str, main: str, main_path: Path, text: str, path: Path
) -> tuple[str, str]:
    """Codex's (config.toml, localllm.config.toml). The profile file gets
    the model, the provider and whatever a legacy `[profiles.localllm]` table held (the
    user's own keys stay, ours win); config.toml loses that table, a `profile =
    "localllm"` selector and the `[model_providers.localllm]` an earlier launch wrote
    (moved, so that one definition remains)."""
    doc, profile = _toml(main, main_path), _toml(text, path)
    if doc.get("profile") == "localllm":
        del doc["profile"]
    _keep_missing(profile, _take(doc, "profiles"))
    profile["model"] = model
    profile["model_provider"] = "localllm"
    table = _table(profile, path, "model_providers", "localllm")
    _keep_missing(table, _take(doc, "model_providers"))
    table.update(_provider(base))
    return _dumped(doc), _dumped(profile)


def _take(doc: Any, outer: str) -> dict[str, Any]:
    """doc[outer]["localllm"], removed from doc (and `outer` with it once empty); {} when
    there is no such table."""
    section = doc.get(outer)
    if not (isinstance(section, dict) and isinstance(section.get("localllm"), dict)):
        return {}
    taken = dict(section["localllm"])
    del section["localllm"]
    if not section:
        del doc[outer]
    return taken


def _keep_missing(table: Any, values: dict[str, Any]) -> None:
    """The moved keys a table does not have yet (what it holds already wins)."""
    for key, value in values.items():
        if key not in table:
            table[key] = value


def _codex_version() -> tuple[int, ...] | None:
    """The installed Codex CLI's version (`codex --version`: "codex-cli 0.171.0"), or None
    when it is not installed or does not say."""
    import re
    import subprocess

    found = shutil.which("codex")
    if found is None:
        return None
    try:
        out = subprocess.run(
            [found, "--version"], capture_output=True, text=True, timeout=20, check=False
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    match = re.search(r"(\d+)\.(\d+)\.(\d+)", out)
    return tuple(int(g) for g in match.groups()) if match else None


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
    client, base = args.client, _base(settings)
    extra = list(args.client_args)
    if extra and client in SNIPPETS:
        sys.stderr.write(f"localllm: {client} is not started by launch; it takes no arguments\n")
        return EXIT_USAGE
    model, note = _pick_model(settings, args.model, base, client)
    if client in SNIPPETS:
        sys.stderr.write(note)
        sys.stdout.write(_snippet(client, base, model))
        return 0
    env = dict(os.environ)
    if client == "aider":  # through litellm's Ollama provider, as its users run it
        sys.stderr.write(note)
        if args.dry:
            sys.stdout.write(_snippet(client, base, model))
            return 0
        argv = ["aider", "--model", f"ollama_chat/{model}", *extra]
        return _start(argv, env | {"OLLAMA_API_BASE": base})
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
        sys.stderr.write(note)
        if args.dry:
            sys.stdout.write("".join(f"export {k}={v}\n" for k, v in claude_env.items()))
            return 0
        return _start(["claude", *extra], env | claude_env)
    files: list[tuple[Path, str, str]] = []  # (path, what it holds, what it will hold)
    if client == "codex":
        home = Path(os.environ.get("CODEX_HOME", Path.home() / ".codex"))
        main, profile = home / "config.toml", home / "localllm.config.toml"
        old, mine = read_user_file(main) or "", read_user_file(profile) or ""
        new_main, new_profile = _codex_profile(base, model, old, main, mine, profile)
        files += [(main, old, new_main), (profile, mine, new_profile)]
        if new_main != old:
            note += (
                f"localllm: moved the localllm profile out of {main} into {profile} "
                "(Codex 0.171 refuses a [profiles.localllm] table there)\n"
            )
        version = _codex_version()
        if version is not None and version < CODEX_TESTED:
            sys.stderr.write(
                f"localllm: Codex CLI {'.'.join(map(str, version))} is older than the versions "
                f"launch is tested with ({TESTED_TEXT}); if it refuses the profile, update it\n"
            )
        argv = ["codex", "--profile", "localllm", *extra]
    else:
        path = Path.home() / ".config" / "opencode" / "opencode.json"
        old = read_user_file(path) or ""
        files.append((path, old, _opencode(base, model, old, path)))
        argv = ["opencode", *extra, "-m", f"localllm/{model}"]
    sys.stderr.write(note)  # once the files were read: a refusal stays one line
    if args.dry:
        sys.stdout.write("".join(f"# {path}\n{new}" for path, old, new in files if new != old))
        return 0
    for path, old, new in files:
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
