"""`make clients`: run the agents that install from npm (Codex CLI, Claude Code, opencode)
headless against a real localllm server and write what worked to docs/clients.md.

Each client is installed into a cache folder (`npm install`, once), pointed at a server
started here on a free port (its own data and cache folders), given one small task, and
judged by what the server saw (its access log: each request's route and status) and by
the client's exit status and output. CI does not run this (the clients come from npm
and a turn of a 10,000-token agent prompt takes minutes on a laptop CPU); run it before a
release and before calling a client issue resolved.

    python .ci/clients.py [--model NAME] [--ctx N] [--only codex,claude,opencode]
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import platform
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = {
    "codex": "@openai/codex",
    "claude": "@anthropic-ai/claude-code",
    "opencode": "opencode-ai",
}
TASK = "Reply with the single word: ready"


@dataclass
class Outcome:
    client: str
    version: str = ""
    rc: int | None = None
    seconds: float = 0.0
    output: str = ""
    requests: list[str] = field(default_factory=list)  # "POST /v1/responses 200"

    @property
    def answered(self) -> bool:
        ok = [r for r in self.requests if r.split()[-1].startswith("2") and "POST" in r]
        return self.rc == 0 and bool(ok)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def install(cache: Path, client: str) -> Path | None:
    """The client's executable, installed into `cache` with npm when it is not there."""
    binary = cache / "node_modules" / ".bin" / client
    if not binary.exists():
        npm = shutil.which("npm")
        if npm is None:
            return None
        subprocess.run(
            [npm, "install", "--no-audit", "--no-fund", PACKAGES[client]],
            cwd=cache,
            check=False,
            capture_output=True,
            timeout=900,
        )
    return binary if binary.exists() else None


@contextlib.contextmanager
def server(model: str, ctx: int, home: Path) -> Iterator[tuple[str, Path]]:
    port = free_port()
    log = home / "access.log"
    env = {
        **os.environ,
        "LOCALLLM_DATA_DIR": str(home / "data"),
        "LOCALLLM_CACHE_DIR": str(home / "cache"),
        "LOCALLLM_CONFIG": str(home / "none.toml"),
    }
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "localllm",
                "serve",
                "--port",
                str(port),
                "--model",
                model,
                "--ctx",
                str(ctx),
                "--parallel",
                "1",
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
        )
        base = f"http://127.0.0.1:{port}"
        try:
            for _ in range(600):
                with contextlib.suppress(httpx.TransportError):
                    if httpx.get(base + "/health", timeout=1).status_code == 200:
                        break
                time.sleep(0.2)
            yield base, log
        finally:
            proc.terminate()
            proc.wait(timeout=30)


def seen(log: Path, since: int) -> tuple[list[str], int]:
    """The requests the access log records after byte `since`."""
    data = log.read_bytes()
    rows = []
    for line in data[since:].decode(errors="replace").splitlines():
        with contextlib.suppress(ValueError, KeyError):
            row = json.loads(line)
            rows.append(f"{row['method']} {row['route']} {row['status']}")
    return rows, len(data)


def command(
    client: str, binary: Path, base: str, model: str, work: Path
) -> tuple[list[str], dict[str, str]]:
    env = {**os.environ, "HOME": str(work / "home"), "NO_COLOR": "1"}
    (work / "home").mkdir(exist_ok=True)
    if client == "codex":
        provider = (
            f'model_providers.localllm={{name="localllm",base_url="{base}/v1",'
            'wire_api="responses",env_key="LOCALLLM_KEY"}'
        )
        env |= {"CODEX_HOME": str(work / "codex"), "LOCALLLM_KEY": "unused"}
        (work / "codex").mkdir(exist_ok=True)
        return [
            str(binary),
            "exec",
            "--skip-git-repo-check",
            "-c",
            "model_provider=localllm",
            "-c",
            provider,
            "-m",
            model,
            TASK,
        ], env
    if client == "claude":
        env |= {
            "ANTHROPIC_BASE_URL": base,
            "ANTHROPIC_AUTH_TOKEN": "unused",
            "ANTHROPIC_MODEL": model,
            "ANTHROPIC_SMALL_FAST_MODEL": model,
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
            "DISABLE_TELEMETRY": "1",
        }
        return [str(binary), "-p", TASK, "--max-turns", "2"], env
    config = {
        "$schema": "https://opencode.ai/config.json",
        "provider": {
            "localllm": {
                "npm": "@ai-sdk/openai-compatible",
                "name": "localllm",
                "options": {"baseURL": f"{base}/v1"},
                "models": {model: {"name": model}},
            }
        },
    }
    path = work / "opencode.json"
    path.write_text(json.dumps(config))
    env |= {"OPENCODE_CONFIG": str(path)}
    return [str(binary), "run", "-m", f"localllm/{model}", TASK], env


def version(binary: Path) -> str:
    with contextlib.suppress(subprocess.SubprocessError, OSError):
        out = subprocess.run([str(binary), "--version"], capture_output=True, text=True, timeout=60)
        return (out.stdout or out.stderr).strip().splitlines()[0][:80]
    return "?"


def run(client: str, cache: Path, base: str, log: Path, model: str, timeout: int) -> Outcome:
    outcome = Outcome(client)
    binary = install(cache, client)
    if binary is None:
        outcome.output = f"not installed ({PACKAGES[client]} did not install from npm)"
        return outcome
    outcome.version = version(binary)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        argv, env = command(client, binary, base, model, work)
        _, start = seen(log, 0)
        t0 = time.monotonic()
        try:
            done = subprocess.run(
                argv,
                cwd=work,
                env=env,
                capture_output=True,
                text=True,
                timeout=timeout,
                stdin=subprocess.DEVNULL,
            )
            outcome.rc, outcome.output = done.returncode, (done.stdout + done.stderr)
        except subprocess.TimeoutExpired as exc:
            outcome.output = f"timed out after {timeout} s: {exc.stdout or ''}"
        outcome.seconds = time.monotonic() - t0
        outcome.requests, _ = seen(log, start)
    return outcome


def write(outcomes: list[Outcome], model: str, ctx: int, path: Path) -> None:
    when = datetime.date.today().isoformat()
    lines = [
        "# Real clients against localllm",
        "",
        f"Written by `make clients` ({when}; {platform.machine()}, {os.cpu_count()} CPUs; "
        f"model `{model}`, context {ctx}). Each client ran headless with one task "
        f'("{TASK}") against a fresh server; "requests" is what the server\'s access log '
        "saw. The replayed request bodies of these and other clients are tested in "
        "`tests/clients/` on every run of the suite.",
        "",
        "| client | version | answered | seconds | requests the server saw | last output |",
        "|---|---|---|---:|---|---|",
    ]
    for o in outcomes:
        tail = " ".join(o.output.strip().splitlines()[-2:])[-160:].replace("|", "\\|")
        asked = ", ".join(o.requests[:8]) + (" ..." if len(o.requests) > 8 else "")
        lines.append(
            f"| {o.client} | {o.version} | {'yes' if o.answered else 'no'} | "
            f"{o.seconds:.0f} | {asked or 'none'} | {tail} |"
        )
    path.write_text("\n".join(lines) + "\n")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="starter")
    parser.add_argument("--ctx", type=int, default=32768)
    parser.add_argument("--only", default=",".join(PACKAGES))
    parser.add_argument("--timeout", type=int, default=1200, help="seconds per client")
    parser.add_argument("--cache", type=Path, default=Path.home() / ".cache" / "localllm-clients")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "clients.md")
    args = parser.parse_args()
    args.cache.mkdir(parents=True, exist_ok=True)
    outcomes = []
    with (
        tempfile.TemporaryDirectory() as home,
        server(args.model, args.ctx, Path(home)) as (
            base,
            log,
        ),
    ):
        for client in args.only.split(","):
            outcome = run(client, args.cache, base, log, args.model, args.timeout)
            print(
                f"{client}: answered={outcome.answered} rc={outcome.rc} "
                f"{outcome.seconds:.0f}s {outcome.requests}",
                flush=True,
            )
            outcomes.append(outcome)
    write(outcomes, args.model, args.ctx, args.out)
    print(f"wrote {args.out}")
    return 0 if all(o.answered for o in outcomes) else 1


if __name__ == "__main__":
    raise SystemExit(main())
