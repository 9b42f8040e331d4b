"""The chat as an agent, on the scripted model (backends/fake.py): its replies are the
generic tool format's JSON, chosen by what the prompt already holds, so a test stages a
call, its approval, its result and the answer after it. What runs is real: the built-in
tools on a real folder, a real MCP server over stdio (tests/tui/mcp_notes.py)."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from textual.pilot import Pilot
from textual.widgets import Button, SelectionList

from localllm.backends.fake import FakeBackend, Script, write_fake_model
from localllm.config import McpServer, Remote, Settings
from localllm.engine.accounting import Accounting
from localllm.engine.engine import Engine
from localllm.history import ConversationSettings, History, StoredMessage
from localllm.server.runner import BackgroundEndpoint
from localllm.tui.app import ChatApp
from localllm.tui.screens.approval import ApprovalScreen, ToolsScreen
from localllm.tui.screens.settings import SettingsScreen
from localllm.tui.widgets.messages import ChatMessage
from tests.conftest import free_port
from tests.tui.conftest import wait_for

NOTES_SERVER = Path(__file__).with_name("mcp_notes.py")


def call(name: str, **args: object) -> str:
    return json.dumps({"tool_calls": [{"name": name, "arguments": args}]})


def answer(text: str) -> str:
    return json.dumps({"content": text})


def results_in(prompt: str) -> int:
    """How many tool results the prompt holds (the generic format writes each as a user
    turn starting "The result")."""
    return prompt.count("The result of ")


def answered(prompt: str, *asks: str) -> bool:
    """Whether a tool result came after the user's last prompt (one of `asks`)."""
    return prompt.rfind("The result of ") > max(prompt.rfind(a) for a in asks)


Reply = Callable[[str], str]


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    work = tmp_path / "work"
    work.mkdir()
    (work / "notes.txt").write_text("the answer is 42\n")
    return work


def with_tools(history: History, folder: Path, *tools: str, steps: int | None = None) -> int:
    conv = history.create("t", ConversationSettings(tools=tools, tool_folder=str(folder),
                                                    tool_steps=steps, max_tokens=400))
    return conv.id


def rows(history: History, cid: int) -> list[StoredMessage]:
    return history.messages(cid)


async def send(app: ChatApp, pilot: Pilot, text: str) -> None:
    await wait_for(pilot, lambda: app.status.model == "scripted", "the model to load")
    app.prompt_box.load_text(text)
    await pilot.press("enter")


async def approval(app: ChatApp, pilot: Pilot) -> ApprovalScreen:
    await wait_for(pilot, lambda: isinstance(app.screen, ApprovalScreen), "the approval dialog")
    screen = app.screen
    assert isinstance(screen, ApprovalScreen)
    return screen


async def test_a_call_is_shown_approved_run_and_its_result_fed_back(scripted, folder: Path):
    def reply(prompt: str) -> str:
        if not answered(prompt, "What does notes.txt say?", "And again?"):
            return call("read_file", path="notes.txt")
        return answer("The file says 42.") if "the answer is 42" in prompt else answer("no")

    app, history = scripted(reply)
    cid = with_tools(history, folder, "read_file")
    async with app.run_test(size=(110, 36)) as pilot:
        await send(app, pilot, "What does notes.txt say?")
        screen = await approval(app, pilot)
        assert screen.tool == "read_file" and '"path": "notes.txt"' in screen.preview.text
        await pilot.press("a")  # allow once
        await wait_for(pilot, lambda: len(rows(history, cid)) == 4 and not app.generating,
                       "the answer after the result")
        _, asked, result, final = rows(history, cid)
        assert asked.role == "assistant" and asked.stats is not None
        assert [c["name"] for c in asked.stats["tool_calls"]] == ["read_file"]
        assert result.role == "tool" and result.content == "the answer is 42"
        assert result.stats is not None and result.stats["status"] == "ok"
        assert result.stats["tool_call_id"] == asked.stats["tool_calls"][0]["id"]
        assert final.role == "assistant" and final.content == "The file says 42."
        shown = [m.role for m in app.chat.query(ChatMessage)]
        assert shown == ["user", "assistant", "tool", "assistant"]
        # the next prompt asks again: "once" was for that call only
        await send(app, pilot, "And again?")
        await approval(app, pilot)
        await pilot.press("d")
        await wait_for(pilot, lambda: not app.generating and len(rows(history, cid)) == 8,
                       "the answer after the denial")
        denied = rows(history, cid)[6]
        assert denied.stats is not None and denied.stats["status"] == "denied"
        assert "denied" in denied.content  # what the model reads
        assert (folder / "notes.txt").read_text() == "the answer is 42\n"


async def test_allowed_for_the_conversation_asks_once_and_the_loop_stops_at_the_limit(
    scripted, folder: Path
):
    # a model that lists the folder forever: the step limit ends it
    app, history = scripted(lambda prompt: call("list_folder", path="."))
    cid = with_tools(history, folder, "list_folder", steps=3)
    async with app.run_test(size=(110, 36)) as pilot:
        await send(app, pilot, "Look around.")
        await approval(app, pilot)
        await pilot.press("c")  # allow for this conversation: no further dialog
        await wait_for(pilot, lambda: not app.generating and len(rows(history, cid)) >= 9,
                       "the loop to stop")
        results = [m for m in rows(history, cid) if m.role == "tool"]
        statuses = [m.stats["status"] for m in results if m.stats]
        assert statuses == ["ok", "ok", "ok", "not run"]  # three steps, the fourth refused
        assert "notes.txt" in results[0].content
        assert "limit of 3 tool steps" in results[-1].content
        assert not isinstance(app.screen, ApprovalScreen)


async def test_escape_in_the_dialog_stops_the_turn_and_keeps_the_record(scripted, folder: Path):
    app, history = scripted(lambda prompt: call("run_command", command="touch made-by-model"))
    cid = with_tools(history, folder, "run_command")
    async with app.run_test(size=(110, 36)) as pilot:
        await send(app, pilot, "Make a file.")
        screen = await approval(app, pilot)
        assert screen.preview.language == "bash" and "touch made-by-model" in screen.preview.text
        await pilot.press("escape")
        await wait_for(pilot, lambda: not app.generating, "the turn to stop")
        roles = [(m.role, (m.stats or {}).get("status")) for m in rows(history, cid)]
        assert roles == [("user", None), ("assistant", None), ("tool", "stopped")]
        assert not (folder / "made-by-model").exists()


@pytest.mark.process  # a shell command or an MCP server
async def test_escape_stops_a_running_command_and_its_process_group(scripted, folder: Path):
    command = "echo $$ > group.pid; sleep 60 & sleep 60"
    app, history = scripted(lambda prompt: call("run_command", command=command))
    cid = with_tools(history, folder, "run_command")
    async with app.run_test(size=(110, 36)) as pilot:
        await send(app, pilot, "Wait.")
        await approval(app, pilot)
        await pilot.press("a")
        pid = folder / "group.pid"
        await wait_for(pilot, lambda: pid.exists() and pid.read_text().strip(), "the command")
        group = int(pid.read_text())
        await pilot.press("escape")
        await wait_for(pilot, lambda: not app.generating, "the turn to stop")
        last = rows(history, cid)[-1]
        assert last.role == "tool" and last.stats is not None
        assert last.stats["status"] == "stopped"
        # the shell and both sleeps are gone: the group was killed whole
        await wait_for(pilot, lambda: not alive(group), "the process group to end")


def alive(group: int) -> bool:
    try:
        os.killpg(group, 0)
    except ProcessLookupError:
        return False
    return True


async def test_an_edit_is_shown_as_a_diff_and_applied_once_allowed(scripted, folder: Path):
    def reply(prompt: str) -> str:
        if results_in(prompt) == 0:
            return call("edit_file", path="notes.txt", old_text="42", new_text="43")
        return answer("Changed.")

    app, history = scripted(reply)
    with_tools(history, folder, "edit_file")
    async with app.run_test(size=(110, 36)) as pilot:
        await send(app, pilot, "Change 42 to 43.")
        screen = await approval(app, pilot)
        assert screen.preview.language == "diff"
        assert "-the answer is 42" in screen.preview.text
        assert "+the answer is 43" in screen.preview.text
        assert (folder / "notes.txt").read_text() == "the answer is 42\n"  # not yet
        await pilot.press("a")
        await wait_for(pilot, lambda: not app.generating, "the answer")
        assert (folder / "notes.txt").read_text() == "the answer is 43\n"


async def test_tools_are_off_until_turned_on_in_the_tools_dialog(scripted, folder: Path):
    prompts: list[str] = []

    def reply(prompt: str) -> str:
        prompts.append(prompt)
        return answer("Hi.")

    app, history = scripted(reply)
    history.create("t", ConversationSettings(tool_folder=str(folder)))
    async with app.run_test(size=(110, 40)) as pilot:
        await send(app, pilot, "Hello.")
        await wait_for(pilot, lambda: not app.generating and prompts, "the first answer")
        assert "read_file" not in prompts[-1]  # no tools offered
        await pilot.press("ctrl+t")
        await wait_for(pilot, lambda: isinstance(app.screen, ToolsScreen), "the tools dialog")
        app.screen.query_one("#tool-list", SelectionList).select("read_file")
        app.screen.query_one("#save", Button).press()
        await wait_for(pilot, lambda: not isinstance(app.screen, ToolsScreen), "saved")
        assert app.conv is not None and app.conv.settings.tools == ("read_file",)
        await send(app, pilot, "Hello again.")
        await wait_for(pilot, lambda: not app.generating and len(prompts) == 2, "the answer")
        assert "read_file" in prompts[-1] and "list_folder" not in prompts[-1]
        await pilot.press("f4")  # the settings dialog's "Tools…" opens the same dialog
        await wait_for(pilot, lambda: isinstance(app.screen, SettingsScreen), "settings")
        app.screen.query_one("#tools", Button).press()
        await wait_for(pilot, lambda: isinstance(app.screen, ToolsScreen), "the tools dialog")
        assert app.screen.query_one("#tool-list", SelectionList).selected == ["read_file"]
        await pilot.press("escape")
        await wait_for(pilot, lambda: not isinstance(app.screen, ToolsScreen), "closed")


@pytest.mark.process  # a shell command or an MCP server
async def test_an_mcp_servers_tools_are_called_and_a_broken_server_is_one_status_line(
    scripted, folder: Path
):
    def reply(prompt: str) -> str:
        if results_in(prompt) == 0:
            return call("notes__add", a=20, b=22)
        return answer("It is 42.") if "42" in prompt.split("The result of ")[-1] else answer("?")

    servers = (
        McpServer("notes", command=sys.executable, args=(str(NOTES_SERVER),)),
        McpServer("broken", command=sys.executable, args=("-c", "import sys; sys.exit(3)")),
    )
    app, history = scripted(reply, mcp_servers=servers)
    cid = with_tools(history, folder, "mcp:notes")
    async with app.run_test(size=(140, 36)) as pilot:
        assert app.mcp is not None
        await wait_for(pilot, lambda: app.mcp is not None and app.mcp.states()["notes"]
                       .startswith("ready") and not app.mcp.states()["broken"]
                       .startswith("starting"), "the servers to start", limit=1200)
        # the status line follows each change a moment later (drawn on the app's thread):
        # the one after both servers settled names the broken one only
        await wait_for(pilot, lambda: "mcp broken failed" in app.status.tools
                       and "notes" not in app.status.tools, "the status line")
        await send(app, pilot, "Add 20 and 22.")
        screen = await approval(app, pilot)
        assert screen.tool == "notes__add" and screen.source == "notes"
        await pilot.press("a")
        await wait_for(pilot, lambda: not app.generating and len(rows(history, cid)) == 4,
                       "the answer")
        result = rows(history, cid)[2]
        assert result.content == "42" and result.stats is not None
        assert result.stats["status"] == "ok"
        assert rows(history, cid)[3].content == "It is 42."


async def test_the_loop_runs_the_same_with_a_remote_model(scripted, folder: Path, tmp_path: Path):
    """The chat talks to a remote engine (localllm's own endpoint in this process, on the
    scripted model): the calls come back as the wire's structured tool_calls, run here,
    and their results go back in the next request."""
    sent: list[str] = []

    def upstream_reply(prompt: str) -> str:
        sent.append(prompt)
        if not answered(prompt, "List the folder."):
            return call("list_folder", path=".")
        return answer("There is notes.txt.") if "notes.txt" in prompt else answer("?")

    up_settings = Settings(port=free_port(), data_dir=tmp_path / "up", cache_dir=tmp_path / "upc",
                           model="scripted")
    write_fake_model(up_settings.models_dir / "scripted.gguf")
    upstream = Engine(up_settings, backends=[FakeBackend(Script(reply=upstream_reply))])
    upstream.load("scripted")
    endpoint = BackgroundEndpoint(up_settings, upstream, Accounting.for_settings(up_settings))
    assert endpoint.error is None, endpoint.error
    remote = Remote("up", f"http://127.0.0.1:{up_settings.port}/v1", models=("scripted",))
    try:
        app, history = scripted(lambda prompt: answer("local"), remotes=(remote,),
                                model="up/scripted")
        cid = with_tools(history, folder, "list_folder")
        async with app.run_test(size=(110, 36)) as pilot:
            await wait_for(pilot, lambda: app.remote_model == "up/scripted", "the remote model")
            app.prompt_box.load_text("List the folder.")
            await pilot.press("enter")
            await approval(app, pilot)
            await pilot.press("a")
            await wait_for(pilot, lambda: not app.generating and len(rows(history, cid)) == 4,
                           "the remote's answer after the result")
            _, asked, result, final = rows(history, cid)
            assert asked.stats is not None and asked.stats["tool_calls"][0]["name"] == "list_folder"
            assert result.role == "tool" and "notes.txt" in result.content
            assert final.content == "There is notes.txt."
            assert "notes.txt  17 bytes" in sent[-1]  # the result reached the remote engine
    finally:
        endpoint.stop()
        upstream.close()

