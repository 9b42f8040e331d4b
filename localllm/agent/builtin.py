"""The chat's built-in tools: read a file, list a folder, search files, edit a file, run a
command. Each works inside one folder (agent/workspace.py), bounds what it returns, and
is off until the user turns it on for a conversation; every call is approved first
(agent/approval.py)."""

from __future__ import annotations

import asyncio
import contextlib
import difflib
import os
import re
import signal
from pathlib import Path
from typing import Any

from localllm.agent.tool import Preview, Tool, bounded
from localllm.agent.workspace import ToolRefused, Workspace

MAX_FILE_BYTES = 2_000_000  # a file larger than this is not read or edited whole
MAX_LISTED = 500
MAX_MATCHES = 200
SKIPPED_DIRS = frozenset({".git", ".hg", ".svn", "node_modules", "__pycache__", ".venv"})
COMMAND_TIMEOUT_S = 30.0
MAX_COMMAND_TIMEOUT_S = 600.0
OUTPUT_LIMIT = 8_000  # characters of a command's output the model gets back


def _text_of(path: Path, shown: str) -> str:
    size = path.stat().st_size
    if size > MAX_FILE_BYTES:
        raise ToolRefused(
            f"{shown} is {size:,} bytes; the tools read files up to {MAX_FILE_BYTES:,} bytes"
        )
    data = path.read_bytes()
    if b"\x00" in data[:8192]:
        raise ToolRefused(f"{shown} is a binary file")
    return data.decode("utf-8", errors="replace")


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
        if self.ws.path(args["path"]).is_dir():
            raise ToolRefused(f"{args['path']} is a folder: list it with list_folder")

    async def call(self, args: dict[str, Any]) -> str:
        self.refusal(args)
        path = self.ws.path(args["path"])
        lines = _text_of(path, args["path"]).splitlines()
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
        if not self.ws.path(args.get("path") or ".").is_dir():
            raise ToolRefused(f"{args.get('path')} is a file: read it with read_file")

    async def call(self, args: dict[str, Any]) -> str:
        self.refusal(args)
        path = self.ws.path(args.get("path") or ".")
        entries = sorted(path.iterdir(), key=lambda p: (not p.is_dir(), p.name.lower()))
        rows = []
        for entry in entries[:MAX_LISTED]:
            if entry.is_dir():
                rows.append(f"{entry.name}/")
            else:
                with contextlib.suppress(OSError):
                    rows.append(f"{entry.name}  {entry.stat().st_size:,} bytes")
        if len(entries) > MAX_LISTED:
            rows.append(f"[{MAX_LISTED} of {len(entries)} entries shown]")
        return "\n".join(rows) or "(empty folder)"


class SearchFiles(Tool):
    name = "search_files"
    description = (
        "Search the text files under a folder for a regular expression; "
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

    def __init__(self, ws: Workspace) -> None:
        self.ws = ws

    def refusal(self, args: dict[str, Any]) -> None:
        try:
            re.compile(args["pattern"])
        except re.error as exc:
            raise ToolRefused(f"the pattern is not a regular expression: {exc}") from None
        self.ws.path(args.get("path") or ".")

    async def call(self, args: dict[str, Any]) -> str:
        self.refusal(args)
        rx = re.compile(args["pattern"])
        top = self.ws.path(args.get("path") or ".")
        return await asyncio.to_thread(self._search, rx, top, args.get("glob"))

    def _search(self, rx: re.Pattern[str], top: Path, glob: str | None) -> str:
        hits: list[str] = []
        files = [top] if top.is_file() else self._files(top, glob)
        for path in files:
            try:
                text = _text_of(path, self.ws.shown(path))
            except (ToolRefused, OSError):
                continue  # binary, too large or unreadable: not searched
            for n, line in enumerate(text.splitlines(), 1):
                if rx.search(line):
                    hits.append(f"{self.ws.shown(path)}:{n}: {line.strip()[:200]}")
                    if len(hits) >= MAX_MATCHES:
                        return "\n".join(hits) + f"\n[stopped at {MAX_MATCHES} matches]"
        return "\n".join(hits) or "no matches"

    def _files(self, top: Path, glob: str | None) -> list[Path]:
        out = []
        for folder, dirs, names in os.walk(top):  # symlinked folders are not followed
            dirs[:] = sorted(d for d in dirs if d not in SKIPPED_DIRS)
            for name in sorted(names):
                path = Path(folder) / name
                if glob and not path.match(glob):
                    continue
                if path.is_symlink():  # one leading out of the folder is not read
                    try:
                        self.ws.path(str(path))
                    except ToolRefused:
                        continue
                if path.is_file():
                    out.append(path)
        return out


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

    def _change(self, args: dict[str, Any]) -> tuple[Path, str, str]:
        path = self.ws.path(args["path"], must_exist=bool(args["old_text"]))
        old, new = args["old_text"], args["new_text"]
        if not old:
            if path.exists():
                raise ToolRefused(f"{args['path']} exists: give the old_text to replace")
            return path, "", new
        if path.is_dir():
            raise ToolRefused(f"{args['path']} is a folder")
        before = _text_of(path, args["path"])
        count = before.count(old)
        if count != 1:
            raise ToolRefused(
                f"old_text occurs {count} times in {args['path']}; it must "
                "occur exactly once (give more of the surrounding text)"
            )
        return path, before, before.replace(old, new, 1)

    def refusal(self, args: dict[str, Any]) -> None:
        try:
            self._change(args)
        except OSError as exc:
            raise ToolRefused(f"{args['path']}: {exc.strerror or exc}") from None

    def preview(self, args: dict[str, Any]) -> Preview:
        try:
            path, before, after = self._change(args)
        except (ToolRefused, OSError) as exc:
            return Preview(f"{args.get('path')}: {exc} (the model will be told)")
        shown = self.ws.shown(path)
        diff = difflib.unified_diff(
            before.splitlines(keepends=True),
            after.splitlines(keepends=True),
            f"a/{shown}" if before else "/dev/null",
            f"b/{shown}",
        )
        return Preview("".join(diff), "diff")

    async def call(self, args: dict[str, Any]) -> str:
        path, before, after = self._change(args)  # checked again: the file may have moved
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.localllm-tmp")
        try:
            tmp.write_text(after, encoding="utf-8")
            if path.exists():
                os.chmod(tmp, path.stat().st_mode & 0o7777)
            os.replace(tmp, path)  # whole or not at all
        finally:
            tmp.unlink(missing_ok=True)
        verb = "created" if not before else "edited"
        return f"{verb} {self.ws.shown(path)} ({len(after.splitlines())} lines)"


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
        proc = await asyncio.create_subprocess_shell(
            args["command"],
            cwd=self.ws.root,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            start_new_session=True,  # its own process group: stopped whole
        )
        chunks: list[bytes] = []
        kept = 0

        async def read() -> None:
            nonlocal kept
            assert proc.stdout is not None
            while data := await proc.stdout.read(65536):
                if kept < OUTPUT_LIMIT:  # the rest is read and dropped (it never blocks)
                    chunks.append(data)
                kept += len(data)

        try:
            await asyncio.wait_for(asyncio.gather(read(), proc.wait()), limit)
        except (TimeoutError, asyncio.TimeoutError):
            _kill_group(proc.pid)
            await proc.wait()
            return f"{_output(chunks, kept)}\n[stopped: still running after {limit:g} s]"
        except asyncio.CancelledError:  # the user stopped the turn
            _kill_group(proc.pid)
            raise
        return f"exit status {proc.returncode}\n{_output(chunks, kept)}"


def _output(chunks: list[bytes], total: int) -> str:
    """A command's output, its first OUTPUT_LIMIT bytes, saying when it was cut."""
    text = b"".join(chunks)[:OUTPUT_LIMIT].decode("utf-8", errors="replace")
    if total > OUTPUT_LIMIT:
        text += f"\n[cut: the first {OUTPUT_LIMIT:,} of {total:,} bytes shown]"
    return text


def _kill_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


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
