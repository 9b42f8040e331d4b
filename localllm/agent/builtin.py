"""The chat's built-in tools: read a file, list a folder, search files, edit a file, run a
command. Each works inside one folder (agent/workspace.py), bounds what it returns, and
is off until the user turns it on for a conversation; every call is approved first
(agent/approval.py)."""

from __future__ import annotations

import asyncio
import contextlib
import difflib
import os
import secrets
import signal
import time
from collections.abc import Iterator
from pathlib import PurePosixPath
from typing import Any

from localllm.agent.tool import Preview, Tool, bounded
from localllm.agent.workspace import ToolRefused, Workspace
from localllm.fsguard import PathRefused

MAX_FILE_BYTES = 2_000_000  # a file larger than this is not read or edited whole
MAX_LISTED = 500
MAX_MATCHES = 200
SEARCH_TIME_S = 20.0  # a search stops here and says how far it got
SKIPPED_DIRS = frozenset({".git", ".hg", ".svn", "node_modules", "__pycache__", ".venv"})
COMMAND_TIMEOUT_S = 30.0
MAX_COMMAND_TIMEOUT_S = 600.0
OUTPUT_LIMIT = 8_000  # characters of a command's output the model gets back
DRAIN_S = 2.0  # how long a command's output is read after it exits and its group is killed


@contextlib.contextmanager
def _told() -> Iterator[None]:
    """Whatever the file system refuses, or fails at, becomes a text for the model."""
    try:
        yield
    except PathRefused as exc:
        raise ToolRefused(str(exc)) from None
    except OSError as exc:
        raise ToolRefused(exc.strerror or str(exc)) from None


def _text_of(ws: Workspace, name: str | list[str]) -> str:
    with _told():
        data = ws.fs.read_bytes(name, limit=MAX_FILE_BYTES)
    if b"\x00" in data[:8192]:
        raise ToolRefused(f"{name} is a binary file")
    return data.decode("utf-8", errors="replace")


def _kind(ws: Workspace, name: str) -> str | None:
    with _told():
        return ws.fs.kind(name)


class ReadFile(Tool):
    name = "read_file"
    description = (
        "Read a text file in the working folder (optionally some of its lines). Paths are "
        "relative to the working folder, e.g. notes.txt or src/main.py."
    )
    parameters = {
        "type": "object",
        "properties": {
            "path": {"type": "string", "description": "the file, relative to the folder"},
            "start_line": {"type": "integer", "minimum": 1},
            "max_lines": {"type": "integer", "minimum": 1},
        },
        "required": ["path"],
        "additionalProperties": False,
    }

    def __init__(self, ws: Workspace) -> None:
        self.ws = ws

    def refusal(self, args: dict[str, Any]) -> None:
        kind = _kind(self.ws, args["path"])
        if kind is None:
            raise ToolRefused(f"{args['path']} does not exist (in {self.ws.root})")
        if kind == "folder":
            raise ToolRefused(f"{args['path']} is a folder: list it with list_folder")

    async def call(self, args: dict[str, Any]) -> str:
        self.refusal(args)
        lines = _text_of(self.ws, args["path"]).splitlines()
        start = args.get("start_line", 1)
        end = start - 1 + args["max_lines"] if "max_lines" in args else len(lines)
        part = "\n".join(lines[start - 1 : end])
        if start > 1 or end < len(lines):
            part = f"[lines {start}-{min(end, len(lines))} of {len(lines)}]\n{part}"
        return bounded(part)


class ListFolder(Tool):
    name = "list_folder"
    description = (
        "List a folder in the working folder: names, folders ending in /, sizes. "
        "Use '.' for the working folder itself."
    )
    parameters = {
        "type": "object",
        "properties": {"path": {"type": "string", "description": "the folder; '.' for the top"}},
        "additionalProperties": False,
    }

    def __init__(self, ws: Workspace) -> None:
        self.ws = ws

    def refusal(self, args: dict[str, Any]) -> None:
        kind = _kind(self.ws, args.get("path") or ".")
        if kind is None:
            raise ToolRefused(f"{args.get('path')} does not exist (in {self.ws.root})")
        if kind != "folder":
            raise ToolRefused(f"{args.get('path')} is a file: read it with read_file")

    async def call(self, args: dict[str, Any]) -> str:
        top = args.get("path") or "."
        with _told():
            entries = self.ws.fs.list(top)
        entries.sort(key=lambda e: (e.kind != "folder", e.name.lower()))
        rows = []
        for e in entries[:MAX_LISTED]:
            if e.kind == "folder":
                rows.append(f"{e.name}/")
            elif e.kind == "file":
                rows.append(f"{e.name}  {e.size:,} bytes")
            elif e.kind == "link":
                rows.append(f"{e.name}  {self._link(top, e.name)}")
            else:
                rows.append(f"{e.name}  ({e.kind})")
        if len(entries) > MAX_LISTED:
            rows.append(f"[{MAX_LISTED} of {len(entries)} entries shown]")
        return "\n".join(rows) or "(empty folder)"

    def _link(self, top: str, name: str) -> str:
        try:
            kind = self.ws.fs.kind(str(PurePosixPath(top) / name))
        except PathRefused:
            return "(a symlink out of the folder: not usable)"
        return f"(a symlink to a {kind or 'missing file'})"


def _compile(pattern: str) -> Any:
    """The pattern as RE2 (google-re2): its time is linear in the text searched, so no
    pattern can stall the search; one RE2 cannot run (a backreference, a lookaround) is
    refused with the reason."""
    import re2

    options = re2.Options()
    options.log_errors = False  # its parse errors go to the model, not the terminal
    try:
        return re2.compile(pattern, options=options)
    except re2.error as exc:
        why = exc.args[0].decode() if exc.args and isinstance(exc.args[0], bytes) else exc
        raise ToolRefused(
            f"the pattern is not a regular expression the search runs (RE2 syntax: no "
            f"backreferences or lookarounds): {why}"
        ) from None


class SearchFiles(Tool):
    name = "search_files"
    description = (
        "Search the text files under a folder for a regular expression (RE2 syntax); "
        "answers file:line: text for each matching line."
    )
    parameters = {
        "type": "object",
        "properties": {
            "pattern": {"type": "string", "minLength": 1},
            "path": {"type": "string", "description": "where to search; '.' for everything"},
            "glob": {"type": "string", "description": "only files whose name matches, e.g. *.py"},
        },
        "required": ["pattern"],
        "additionalProperties": False,
    }

    def __init__(self, ws: Workspace, time_s: float = SEARCH_TIME_S) -> None:
        self.ws = ws
        self.time_s = time_s

    def _checked(self, args: dict[str, Any]) -> tuple[Any, str]:
        """The compiled pattern and what the path names ("file" or "folder")."""
        rx = _compile(args["pattern"])
        kind = _kind(self.ws, args.get("path") or ".")
        if kind is None:
            raise ToolRefused(f"{args.get('path')} does not exist (in {self.ws.root})")
        return rx, kind

    def refusal(self, args: dict[str, Any]) -> None:
        self._checked(args)

    async def call(self, args: dict[str, Any]) -> str:
        rx, kind = self._checked(args)
        top = args.get("path") or "."
        return await asyncio.to_thread(self._search, rx, top, kind, args.get("glob"))

    def _search(self, rx: Any, top: str, kind: str, glob: str | None) -> str:
        hits: list[str] = []
        deadline = time.monotonic() + self.time_s
        fs = self.ws.fs
        files = iter([fs.parts(top)]) if kind != "folder" else fs.files(top, skip=SKIPPED_DIRS)
        searched = 0
        for found in files:
            name = fs.shown(found)
            if glob and not PurePosixPath(name).match(glob):
                continue
            if time.monotonic() > deadline:
                hits.append(f"[stopped after {self.time_s:g} s: {searched:,} files searched]")
                break
            try:
                text = _text_of(self.ws, found)
            except ToolRefused:
                continue  # binary, too large, unreadable or leading out: not searched
            searched += 1
            for n, line in enumerate(text.splitlines(), 1):
                if rx.search(line):
                    hits.append(f"{name}:{n}: {line.strip()[:200]}")
                    if len(hits) >= MAX_MATCHES:
                        return "\n".join(hits) + f"\n[stopped at {MAX_MATCHES} matches]"
        return "\n".join(hits) or "no matches"


class EditFile(Tool):
    name = "edit_file"
    description = (
        "Replace old_text with new_text in a file (old_text must occur exactly once). "
        "An empty old_text creates a new file holding new_text."
    )
    parameters = {
        "type": "object",
        "properties": {
            "path": {"type": "string"},
            "old_text": {"type": "string"},
            "new_text": {"type": "string"},
        },
        "required": ["path", "old_text", "new_text"],
        "additionalProperties": False,
    }

    def __init__(self, ws: Workspace) -> None:
        self.ws = ws

    def _change(self, args: dict[str, Any]) -> tuple[str, str]:
        name, old, new = args["path"], args["old_text"], args["new_text"]
        kind = _kind(self.ws, name)
        if not old:
            if kind is not None:
                raise ToolRefused(f"{name} exists: give the old_text to replace")
            return "", new
        if kind is None:
            raise ToolRefused(f"{name} does not exist (in {self.ws.root})")
        if kind == "folder":
            raise ToolRefused(f"{name} is a folder")
        before = _text_of(self.ws, name)
        count = before.count(old)
        if count != 1:
            raise ToolRefused(
                f"old_text occurs {count} times in {name}; it must "
                "occur exactly once (give more of the surrounding text)"
            )
        return before, before.replace(old, new, 1)

    def refusal(self, args: dict[str, Any]) -> None:
        self._change(args)

    def preview(self, args: dict[str, Any]) -> Preview:
        try:
            before, after = self._change(args)
            shown = self.ws.fs.shown(self.ws.fs.parts(args["path"]))
        except (ToolRefused, PathRefused) as exc:
            return Preview(f"{args.get('path')}: {exc} (the model will be told)")
        diff = difflib.unified_diff(
            before.splitlines(keepends=True),
            after.splitlines(keepends=True),
            f"a/{shown}" if before else "/dev/null",
            f"b/{shown}",
        )
        return Preview("".join(diff), "diff")

    async def call(self, args: dict[str, Any]) -> str:
        _, after = self._change(args)  # checked again: the file may have moved
        with _told():
            # a new name is created only if nothing took it meanwhile; an edit replaces
            # the file whole through a temporary name no one else can have made
            self.ws.fs.write(args["path"], after.encode("utf-8"), new=not args["old_text"])
            shown = self.ws.fs.shown(self.ws.fs.parts(args["path"]))
        verb = "created" if not args["old_text"] else "edited"
        return f"{verb} {shown} ({len(after.splitlines())} lines)"


class RunCommand(Tool):
    name = "run_command"
    description = "Run a shell command in the working folder; answers its exit status and output."
    parameters = {
        "type": "object",
        "properties": {
            "command": {"type": "string", "minLength": 1},
            "timeout_s": {
                "type": "number",
                "exclusiveMinimum": 0,
                "maximum": MAX_COMMAND_TIMEOUT_S,
            },
        },
        "required": ["command"],
        "additionalProperties": False,
    }

    def __init__(self, ws: Workspace, timeout_s: float = COMMAND_TIMEOUT_S) -> None:
        self.ws = ws
        self.timeout_s = timeout_s

    def preview(self, args: dict[str, Any]) -> Preview:
        limit = args.get("timeout_s", self.timeout_s)
        return Preview(f"# in {self.ws.root}, stopped after {limit:g} s\n{args['command']}", "bash")

    async def call(self, args: dict[str, Any]) -> str:
        limit = float(args.get("timeout_s", self.timeout_s))
        token = secrets.token_hex(8)  # marks every process the command starts
        started = time.time()
        loop = asyncio.get_running_loop()
        transport, run = await loop.subprocess_shell(
            lambda: _Run(loop),
            args["command"],
            cwd=self.ws.root,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            start_new_session=True,  # its own session and process group: stopped whole
            env={**os.environ, RUN_MARK: token},
        )
        ended = ""
        try:
            try:  # the shell's exit, not its pipe's end: a background job may hold the pipe
                await asyncio.wait_for(asyncio.shield(run.exited), limit)
            except (TimeoutError, asyncio.TimeoutError):
                ended = f"\n[stopped: still running after {limit:g} s]"
            finally:  # returned, timed out or stopped by the user: nothing it started lives on
                _stop_everything(transport.get_pid(), token, started)
            try:  # its writers are gone now; one that hid from both kills holds the pipe
                await asyncio.wait_for(asyncio.shield(run.closed), DRAIN_S)
            except (TimeoutError, asyncio.TimeoutError):
                ended += "\n[output cut: a process it started outlived it and was not found]"
            await run.exited
        finally:
            transport.close()
        if ended.startswith("\n[stopped"):
            return f"{_output(run.chunks, run.total)}{ended}"
        code = transport.get_returncode()
        return f"exit status {code}\n{_output(run.chunks, run.total)}{ended}"


class _Run(asyncio.SubprocessProtocol):
    """A command's output (the first OUTPUT_LIMIT bytes kept, the rest counted), when it
    exited and when its pipe closed: two moments, since a job it left running can hold
    the pipe open after the shell is gone."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.chunks: list[bytes] = []
        self.total = 0
        self.exited: asyncio.Future[None] = loop.create_future()
        self.closed: asyncio.Future[None] = loop.create_future()

    def pipe_data_received(self, fd: int, data: bytes | str) -> None:
        data = data.encode() if isinstance(data, str) else data
        if self.total < OUTPUT_LIMIT:
            self.chunks.append(data)
        self.total += len(data)

    def process_exited(self) -> None:
        if not self.exited.done():
            self.exited.set_result(None)

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.closed.done():
            self.closed.set_result(None)


def _output(chunks: list[bytes], total: int) -> str:
    """A command's output, its first OUTPUT_LIMIT bytes, saying when it was cut."""
    text = b"".join(chunks)[:OUTPUT_LIMIT].decode("utf-8", errors="replace")
    if total > OUTPUT_LIMIT:
        text += f"\n[cut: the first {OUTPUT_LIMIT:,} of {total:,} bytes shown]"
    return text


RUN_MARK = "LOCALLLM_TOOL_RUN"  # in the environment of everything a command starts


def _stop_everything(pgid: int, token: str, started: float) -> None:
    """Kill the command's process group, then any process still carrying its mark (one
    that left the group with setsid or a double fork keeps its environment)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)
    import psutil

    me = os.getuid() if hasattr(os, "getuid") else None
    for p in psutil.process_iter(["uids", "create_time"]):
        try:
            if (p.info["create_time"] or 0) < started - 1:
                continue  # older than the command: not one of its own
            if me is not None and p.info["uids"] and p.info["uids"].real != me:
                continue
            if p.environ().get(RUN_MARK) == token:
                p.kill()
        except (psutil.Error, OSError):
            continue


BUILTIN_NAMES = ("read_file", "list_folder", "search_files", "edit_file", "run_command")


def builtin_tools(ws: Workspace, names: tuple[str, ...] | list[str]) -> list[Tool]:
    """The built-in tools named (in BUILTIN_NAMES' order)."""
    made: dict[str, Tool] = {
        "read_file": ReadFile(ws),
        "list_folder": ListFolder(ws),
        "search_files": SearchFiles(ws),
        "edit_file": EditFile(ws),
        "run_command": RunCommand(ws),
    }
    return [made[n] for n in BUILTIN_NAMES if n in names]
