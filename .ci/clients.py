"""`make clients`: run the agents that install from npm (Codex CLI, Claude Code, opencode)
and PyPI (aider) headless against a real localllm server and write what worked to
docs/clients.md.

Each client is installed into a cache folder (once), pointed at a server started here on
a free port (its own data and cache folders) by `localllm launch` itself (so a client
release that changes its config format fails here), given each small task in TASKS, and judged
by the task's own check (the word in its final answer, or the file it wrote), its exit
status, and what the server saw (its access log: each request's route and status). CI
does not run this (the clients come from npm and PyPI, and a turn of a 10,000-token agent
prompt takes minutes on a laptop CPU); run it before a release and before calling a client
issue resolved. The starter is too small to do either task in an agent's prompt; a coding
model of 1.5B parameters does most of them (docs/clients.md).

    python .ci/clients.py [--model NAME|PATH] [--ctx N] [--only codex,claude,opencode,aider]
                          [--tasks reply,file]
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import platform
import re
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
PACKAGES = {  # where each client installs from: npm, or "pypi:" and a package
    "codex": "@openai/codex",
    "claude": "@anthropic-ai/claude-code",
    "opencode": "opencode-ai",
    "aider": "pypi:aider-chat",
}


@dataclass(frozen=True)
class Task:
    """One thing a client is asked to do, and how its success is judged: by the answer
    it printed (its final message, not its log) or by the file it left behind."""

    name: str
    prompt: str
    word: str = ""  # the answer must say this word
    file: str = ""  # or leave this file, holding `word`

    def done(self, answer: str, work: Path) -> bool:
        if self.file:
            path = work / self.file
            return path.is_file() and self.word in path.read_text(errors="replace")
        return re.search(rf"\b{self.word}\b", answer, re.IGNORECASE) is not None


TASKS = {
    "reply": Task("reply", "Reply with the single word: ready", word="ready"),
    "file": Task(
        "file",
        "Create a file named hello.txt in the current directory containing the single "
        "line: hello from localllm",
        word="hello from localllm",
        file="hello.txt",
    ),
}


@dataclass
class Outcome:
    client: str
    task: Task
    version: str = ""
    rc: int | None = None
    seconds: float = 0.0
    output: str = ""
    answer: str = ""  # the client's final message
    requests: list[str] = field(default_factory=list)  # "POST /v1/responses 200"
    done: bool = False  # the task's own check passed

    @property
    def answered(self) -> bool:
        """The client exited cleanly, the server answered its requests, and the task's
        check passed."""
        ok = [r for r in self.requests if r.split()[-1].startswith("2") and "POST" in r]
        return self.rc == 0 and bool(ok) and self.done


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def install(cache: Path, client: str) -> Path | None:
    """The client's executable, installed into `cache` when it is not there: with npm, or
    for a PyPI client into a virtual environment of its own."""
    package = PACKAGES[client]
    if package.startswith("pypi:"):
        venv = cache / f"{client}-venv"
        binary = venv / "bin" / client
        steps = [[sys.executable, "-m", "venv", str(venv)]]
        steps.append([str(venv / "bin" / "pip"), "install", "-q", package.removeprefix("pypi:")])
    else:
        npm = shutil.which("npm")
        binary = cache / "node_modules" / ".bin" / client
        steps = [[npm, "install", "--no-audit", "--no-fund", package]] if npm else []
    for step in steps if not binary.exists() else []:
        subprocess.run(step, cwd=cache, check=False, capture_output=True, timeout=900)
    return binary if binary.exists() else None


@contextlib.contextmanager
def server(model: str, ctx: int, home: Path) -> Iterator[tuple[str, Path, str]]:
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
            yield base, log, loaded_id(base)
        finally:
            proc.terminate()
            proc.wait(timeout=30)


def loaded_id(base: str) -> str:
    """The id the server lists for the model it loaded (a path given to --model is
    listed by its file's stem, and the clients must ask for that id)."""
    models = httpx.get(base + "/v1/models", timeout=10).json()["data"]
    return next(m["id"] for m in models if m.get("loaded_context_length"))


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
    client: str, binary: Path, base: str, work: Path, task: Task
) -> tuple[list[str], dict[str, str]]:
    """The client's headless command for `task`: `localllm launch CLIENT` itself, which
    asks the server for its model, writes the client's config under `work`'s home and
    starts the client with the arguments after `--`. Each may write in `work` (a fresh
    folder) without asking: Codex without its sandbox (which needs kernel features a
    container may lack), Claude Code accepting edits, aider saying yes, opencode as it is."""
    home = work / "home"
    home.mkdir(exist_ok=True)
    env = {
        **os.environ,
        "HOME": str(home),
        "CODEX_HOME": str(home / ".codex"),
        "NO_COLOR": "1",
        "PATH": f"{binary.parent}{os.pathsep}{os.environ.get('PATH', '')}",
    }
    port = base.rsplit(":", 1)[1]
    launch = [sys.executable, "-m", "localllm", "launch", client, "--port", port, "--"]
    if client == "codex":
        return [*launch, "exec", "--skip-git-repo-check",
                "--dangerously-bypass-approvals-and-sandbox",
                "--output-last-message", str(work / "last-message.txt"), task.prompt], env
    if client == "claude":
        env |= {"CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1", "DISABLE_TELEMETRY": "1"}
        turns = "6" if task.file else "4"
        return [*launch, "-p", task.prompt, "--max-turns", turns,
                "--permission-mode", "acceptEdits"], env
    if client == "aider":
        env |= {"LITELLM_LOCAL_MODEL_COST_MAP": "True"}
        return [*launch, "--message", task.prompt, "--yes-always", "--no-git",
                "--no-check-update", "--no-show-model-warnings", "--analytics-disable",
                "--no-pretty", "--no-stream"], env
    return [*launch, "run", task.prompt], env


def version(binary: Path) -> str:
    with contextlib.suppress(subprocess.SubprocessError, OSError):
        out = subprocess.run([str(binary), "--version"], capture_output=True, text=True, timeout=60)
        return (out.stdout or out.stderr).strip().splitlines()[0][:80]
    return "?"


def run(
    client: str, task: Task, cache: Path, base: str, log: Path, model: str, timeout: int
) -> Outcome:
    outcome = Outcome(client, task)
    binary = install(cache, client)
    if binary is None:
        outcome.output = f"not installed ({PACKAGES[client]} did not install)"
        return outcome
    outcome.version = version(binary)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        argv, env = command(client, binary, base, work, task)
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
            last = work / "last-message.txt"  # Codex's final message; the others print it
            outcome.answer = last.read_text() if last.exists() else done.stdout
        except subprocess.TimeoutExpired as exc:
            partial = exc.stdout or b""
            text = partial.decode(errors="replace") if isinstance(partial, bytes) else partial
            outcome.output = f"timed out after {timeout} s: {text}"
        outcome.seconds = time.monotonic() - t0
        outcome.requests, _ = seen(log, start)
        # launch found the server's model by itself (no --model was given)
        followed = f"serves {model}; {client} will use it" in outcome.output
        outcome.done = task.done(outcome.answer, work) and followed
    return outcome


NOTES = "## Notes from the runs"  # what follows this heading in the file is kept


def write(outcomes: list[Outcome], model: str, ctx: int, path: Path) -> None:
    """The table of this run, above whatever notes the file already holds; the rows of
    clients and tasks this run did not try are kept from the table before."""
    when = datetime.date.today().isoformat()
    tasks = "; ".join(f'{t.name}: "{t.prompt}"' for t in TASKS.values())
    lines = [
        "# Real clients against localllm",
        "",
        f"Written by `make clients` ({when}; {platform.machine()}, {os.cpu_count()} CPUs; "
        f"model `{Path(model).name}`, context {ctx}). Each client ran headless against a "
        f"fresh server with each task ({tasks}); a task is done when the client exited "
        "cleanly and its final answer says the word (reply) or the file holds the line "
        '(file). "requests" is what the server\'s access log saw. The replayed request '
        "bodies of these and other clients are tested in `tests/clients/` on every run of "
        "the suite. A row of a client or task that a run (`--only`, `--tasks`) left out is "
        "kept from the run before.",
        "",
        "| client | version | task | done | seconds | requests the server saw | answer |",
        "|---|---|---|---|---:|---|---|",
    ]
    for o in outcomes:
        said = o.answer.strip() or " ".join(o.output.strip().splitlines()[-2:])
        said = " ".join(said.split())[-160:].replace("|", "\\|").replace("<", "&lt;")
        said = said.replace("`", "\\`")  # text as the client printed it, not markup
        more = f" ... ({len(o.requests)} in all)" if len(o.requests) > 6 else ""
        asked = ", ".join(o.requests[:6]) + more
        lines.append(
            f"| {o.client} | {o.version} | {o.task.name} | {'yes' if o.answered else 'no'} | "
            f"{o.seconds:.0f} | {asked or 'none'} | {said} |"
        )
    old = path.read_text() if path.exists() else ""
    ran = {(o.client, o.task.name) for o in outcomes}
    for row in old.split(NOTES)[0].splitlines():
        cells = [c.strip() for c in row.split("|")]
        if len(cells) == 9 and cells[1] in PACKAGES and (cells[1], cells[3]) not in ran:
            lines.append(row)  # a client or task this run left out keeps its last row
    kept = old[old.index(NOTES) :] if NOTES in old else NOTES + "\n"
    path.write_text("\n".join(lines) + "\n\n" + kept)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="starter")
    parser.add_argument("--ctx", type=int, default=32768)
    parser.add_argument("--only", default=",".join(PACKAGES))
    parser.add_argument("--tasks", default=",".join(TASKS))
    parser.add_argument("--logs", type=Path, help="write each client's whole output here")
    parser.add_argument("--timeout", type=int, default=1200, help="seconds per client")
    parser.add_argument("--cache", type=Path, default=Path.home() / ".cache" / "localllm-clients")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "clients.md")
    args = parser.parse_args()
    args.cache.mkdir(parents=True, exist_ok=True)
    outcomes = []
    with (
        tempfile.TemporaryDirectory() as home,
        server(args.model, args.ctx, Path(home)) as (base, log, model_id),
    ):
        for client in args.only.split(","):
            for name in args.tasks.split(","):
                task = TASKS[name]
                outcome = run(client, task, args.cache, base, log, model_id, args.timeout)
                print(
                    f"{client} {name}: done={outcome.answered} rc={outcome.rc} "
                    f"{outcome.seconds:.0f}s {outcome.requests} {outcome.answer[-200:]!r}",
                    flush=True,
                )
                outcomes.append(outcome)
                if args.logs:
                    args.logs.mkdir(parents=True, exist_ok=True)
                    (args.logs / f"{client}-{name}.txt").write_text(outcome.output)
    write(outcomes, args.model, args.ctx, args.out)
    print(f"wrote {args.out}")
    return 0 if all(o.answered for o in outcomes) else 1


if __name__ == "__main__":
    raise SystemExit(main())
