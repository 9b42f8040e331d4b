"""The agent's tools as a cloned repository and a steered model meet them (issue #51's
findings, each a case here): a planted temporary name, files and folders swapped for
links while a call runs, loops and long names, background jobs and jobs that leave the
process group, a regular expression that backtracks for ever. Every call ends as a
result for the model; nothing outside the folder is read or written; nothing lives on."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import shutil
import tempfile
import threading
from pathlib import Path

import psutil
import pytest
from hypothesis import given
from hypothesis import strategies as st

from localllm.agent.builtin import builtin_tools
from localllm.agent.session import AgentSession
from localllm.agent.tool import Preview, Tool
from localllm.agent.workspace import Workspace
from localllm.backends.base import ToolCall
from localllm.config import BUILTIN_TOOLS

SECRET = "OUTSIDE-SECRET"


async def _always(tool: Tool, args: dict, preview: Preview) -> str:
    return "once"


def call(session: AgentSession, name: str, **args: object) -> tuple[str, str]:
    run = asyncio.run(session.run(ToolCall("c", name, json.dumps(args)), _always))  # type: ignore[arg-type]
    return run.status, run.result


@pytest.fixture
def home(tmp_path: Path) -> Path:
    """The user's home, outside the agent's folder, with a file worth stealing."""
    home = tmp_path / "home"
    home.mkdir()
    (home / ".bashrc").write_text(SECRET)
    return home


@pytest.fixture
def work(tmp_path: Path) -> Path:
    root = tmp_path / "work"
    root.mkdir()
    (root / "notes.txt").write_text("one\ntwo\n")
    return root


def session(root: Path, *, openat2: bool = True) -> AgentSession:
    return AgentSession(builtin_tools(Workspace(root, openat2=openat2), BUILTIN_TOOLS))


def test_a_planted_temporary_name_cannot_turn_an_edit_against_the_home(work: Path, home: Path):
    (work / ".notes.txt.localllm-tmp").symlink_to(home / ".bashrc")
    status, said = call(session(work), "edit_file", path="notes.txt", old_text="two", new_text="2")
    assert status == "ok", said
    assert (home / ".bashrc").read_text() == SECRET
    assert (work / "notes.txt").read_text() == "one\n2\n" and not (work / "notes.txt").is_symlink()


@pytest.mark.parametrize("openat2", [True, False], ids=["openat2", "walk"])
def test_loops_long_names_fifos_and_links_out_are_told_to_the_model(
    work: Path, home: Path, openat2: bool
):
    (work / "loop").symlink_to("loop")
    (work / "loopdir").symlink_to("loopdir/x")
    (work / "out").symlink_to(home)
    os.mkfifo(work / "pipe")
    s = session(work, openat2=openat2)
    cases = [
        ("read_file", {"path": "loop"}, "too many symlinks"),
        ("read_file", {"path": "x" * 300}, "too long"),
        ("read_file", {"path": "out/.bashrc"}, "through a symlink"),
        ("read_file", {"path": "pipe"}, "FIFO"),
        ("list_folder", {"path": "loopdir"}, "too many symlinks"),
        ("list_folder", {"path": "y" * 300}, "too long"),
        ("list_folder", {"path": "out"}, "through a symlink"),
        ("search_files", {"pattern": "x", "path": "loop"}, "too many symlinks"),
        ("search_files", {"pattern": "x", "path": "z" * 300}, "too long"),
        ("edit_file", {"path": "out/.bashrc", "old_text": "", "new_text": "x"}, "symlink"),
        ("edit_file", {"path": "w" * 300, "old_text": "", "new_text": "x"}, "too long"),
    ]
    for name, args, said in cases:
        status, result = call(s, name, **args)
        assert status == "error" and said in result, (name, args, result)
    listing = call(s, "list_folder", path=".")[1]
    assert "out  (a symlink out of the folder: not usable)" in listing
    assert "pipe  (FIFO)" in listing
    assert SECRET not in call(s, "search_files", pattern="SECRET")[1]
    assert (home / ".bashrc").read_text() == SECRET and sorted(os.listdir(home)) == [".bashrc"]


@given(name=st.text(min_size=1, max_size=400))
def test_any_name_the_model_gives_ends_as_a_result(name: str):
    with tempfile.TemporaryDirectory(prefix="names-") as tmp:
        root = Path(tmp)
        (root / "f").write_text("x")
        _every_tool_answers(session(root), name)


def _every_tool_answers(s: AgentSession, name: str) -> None:
    for tool, args in [
        ("read_file", {"path": name}),
        ("list_folder", {"path": name}),
        ("search_files", {"pattern": "x", "path": name}),
        ("edit_file", {"path": name, "old_text": "x", "new_text": "y"}),
    ]:
        status, result = call(s, tool, **args)
        assert status in ("ok", "error") and result
        # the session turns any exception into a result; only the tools' own sentences
        # count here, not a crash it caught ("Failed: RuntimeError: ...")
        assert not re.match(r"(Failed|Not run): \w+(Error|Exception)\b", result), result


@pytest.mark.parametrize("openat2", [True, False], ids=["openat2", "walk"])
def test_a_folder_swapped_for_a_link_out_never_takes_an_edit_outside(
    work: Path, home: Path, openat2: bool
):
    (work / "src").mkdir()
    (work / "src" / "a.txt").write_text("alpha")
    stop = threading.Event()

    swaps = 0

    def swap() -> None:
        nonlocal swaps
        while not stop.is_set():
            try:
                os.rename(work / "src", work / ".src-real")
                (work / "src").symlink_to(home)
                os.unlink(work / "src")
                os.rename(work / ".src-real", work / "src")
                swaps += 1
            except OSError:  # the edit made a new src/ while the name was free: drop it
                while (work / ".src-real").is_dir():
                    shutil.rmtree(work / "src", ignore_errors=True)
                    with contextlib.suppress(OSError):
                        os.rename(work / ".src-real", work / "src")

    s = session(work, openat2=openat2)
    swapper = threading.Thread(target=swap)
    swapper.start()
    try:
        for i in range(300):
            call(s, "edit_file", path=f"src/new{i}.txt", old_text="", new_text="made")
            status, text = call(s, "read_file", path="src/a.txt")
            assert SECRET not in text and (status == "error" or text == "alpha")
    finally:
        stop.set()
        swapper.join()
    assert swaps > 10  # the race ran
    assert sorted(os.listdir(home)) == [".bashrc"] and (home / ".bashrc").read_text() == SECRET


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


@pytest.mark.process
def test_a_command_ends_with_everything_it_started(work: Path):
    s = session(work)
    status, out = call(s, "run_command", command="sleep 77 & echo $!")
    pid = int(out.splitlines()[1])
    assert status == "ok" and out.startswith("exit status 0")
    assert not _alive(pid)  # the background job went with the command
    # one that leaves the process group (setsid: a new session) is found by its mark
    status, out = call(
        s, "run_command", command="setsid sh -c 'sleep 78 & echo $!' > pid.txt; sleep 0.5"
    )
    escaped = int((work / "pid.txt").read_text())
    assert not _alive(escaped)
    # and a command stopped by its time limit takes its jobs along too
    status, out = call(s, "run_command", command="sleep 79 & echo $! > pid2.txt; wait", timeout_s=1)
    assert "[stopped: still running after 1 s]" in out
    assert not _alive(int((work / "pid2.txt").read_text()))


@pytest.mark.process
def test_a_command_the_user_stops_takes_its_jobs_along(work: Path):
    tool = next(iter(builtin_tools(Workspace(work), ("run_command",))))

    async def stopped() -> None:
        task = asyncio.ensure_future(tool.call({"command": "sleep 80 & echo $! > p.txt; wait"}))
        while not (work / "p.txt").exists() or not (work / "p.txt").read_text():
            await asyncio.sleep(0.05)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    asyncio.run(stopped())
    assert not _alive(int((work / "p.txt").read_text()))


def test_a_backtracking_pattern_cannot_stall_the_search(work: Path):
    (work / "a.txt").write_text("a" * 29 + "b\n")
    s = session(work)
    # Python's re takes over 20 s on this; RE2 is linear in the text
    assert call(s, "search_files", pattern="(a+)+$") == ("ok", "no matches")
    status, said = call(s, "search_files", pattern=r"(a)\1")
    assert status == "error" and "no backreferences or lookarounds" in said


def test_a_search_stops_at_its_time_bound_and_says_how_far_it_got(work: Path):
    for i in range(5):
        (work / f"f{i}.txt").write_text("x\n")
    ws = Workspace(work)
    search = next(t for t in builtin_tools(ws, ("search_files",)))
    search.time_s = 0  # type: ignore[attr-defined]
    out = asyncio.run(search.call({"pattern": "x"}))
    assert out == "[stopped after 0 s: 0 files searched]", out


@pytest.mark.process  # run_command tries to start its shell
def test_a_folder_that_is_gone_is_a_refusal_not_a_crash(tmp_path: Path):
    gone = tmp_path / "gone"
    s = session(gone)  # the chat sets its tools up before anything is read
    status, said = call(s, "read_file", path="a.txt")
    assert status == "error" and f"the tools' folder cannot be used: {gone}" in said
    status, said = call(s, "run_command", command="ls")
    assert status == "error" and "No such file or directory" in said
