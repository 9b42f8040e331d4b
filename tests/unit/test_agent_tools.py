"""The chat's tools without a screen: the folder they are confined to, the bounds on
what they read and run, the checks a call passes before the user is asked, and the MCP
host's servers (a real one over stdio, one that exits at start, one that dies later)."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from localllm.agent import builtin
from localllm.agent.builtin import builtin_tools
from localllm.agent.mcp_host import McpHost
from localllm.agent.session import AgentSession, Decision
from localllm.agent.tool import Preview, Tool
from localllm.agent.workspace import ToolRefused, Workspace
from localllm.backends.base import ToolCall
from localllm.config import BUILTIN_TOOLS, ConfigError, McpServer, Settings, _validate_agent

NOTES_SERVER = Path(__file__).parents[1] / "tui" / "mcp_notes.py"


@pytest.fixture
def ws(tmp_path: Path) -> Workspace:
    root = tmp_path / "work"
    (root / "src").mkdir(parents=True)
    (root / "src" / "a.py").write_text("def f():\n    return 42\n")
    (root / "notes.txt").write_text("one\ntwo\nthree\n")
    (tmp_path / "secret.txt").write_text("outside")
    return Workspace(root)


def tools(ws: Workspace) -> dict[str, Tool]:
    return {t.name: t for t in builtin_tools(ws, BUILTIN_TOOLS)}


def run(tool: Tool, **args: Any) -> str:
    return asyncio.run(tool.call(tool.checked(json.dumps(args))))


def test_paths_that_lead_out_of_the_folder_are_refused_with_the_reason(ws: Workspace):
    read = tools(ws)["read_file"]
    (ws.root / "link").symlink_to(ws.root.parent / "secret.txt")
    os.mkfifo(ws.root / "pipe")
    for path, said in [
        ("../secret.txt", "outside the folder"),
        (str(ws.root.parent / "secret.txt"), "outside the folder"),
        ("link", "through a symlink"),
        ("/dev/null", "outside the folder"),
        ("pipe", "not a regular file"),
        ("missing.txt", "does not exist"),
    ]:
        with pytest.raises(ToolRefused, match=said):
            run(read, path=path)
    assert run(read, path="src/a.py") == "def f():\n    return 42"


def test_reading_listing_and_searching(ws: Workspace):
    t = tools(ws)
    part = run(t["read_file"], path="notes.txt", start_line=2, max_lines=1)
    assert part == "[lines 2-2 of 3]\ntwo"
    listing = run(t["list_folder"], path=".")
    assert listing.splitlines()[0] == "src/" and "notes.txt  14 bytes" in listing
    assert run(t["search_files"], pattern=r"return \d+") == "src/a.py:2: return 42"
    assert run(t["search_files"], pattern="one", glob="*.py") == "no matches"
    with pytest.raises(ToolRefused, match="not a regular expression"):
        run(t["search_files"], pattern="(")
    (ws.root / "big.bin").write_bytes(b"\x00one" * 10)
    assert "big.bin" not in run(t["search_files"], pattern="one")  # binary: not searched


def test_a_long_file_is_cut_and_says_so(ws: Workspace):
    (ws.root / "long.txt").write_text("x" * 20_000)
    out = run(tools(ws)["read_file"], path="long.txt")
    assert out.endswith("[cut: 16,000 of 20,000 characters shown]")


def test_an_edit_must_match_once_shows_a_diff_and_is_written_whole(ws: Workspace):
    edit = tools(ws)["edit_file"]
    args = {"path": "notes.txt", "old_text": "two", "new_text": "TWO"}
    preview = edit.preview(args)
    assert preview.language == "diff" and "-two\n+TWO\n" in preview.text
    assert (ws.root / "notes.txt").read_text() == "one\ntwo\nthree\n"  # a preview writes nothing
    assert run(edit, **args) == "edited notes.txt (3 lines)"
    assert (ws.root / "notes.txt").read_text() == "one\nTWO\nthree\n"
    (ws.root / "twice.txt").write_text("a a")
    with pytest.raises(ToolRefused, match="occurs 2 times"):
        run(edit, path="twice.txt", old_text="a", new_text="b")
    made = run(edit, path="new/made.txt", old_text="", new_text="hi\n")
    assert made == "created new/made.txt (1 lines)"
    with pytest.raises(ToolRefused, match="exists"):
        run(edit, path="notes.txt", old_text="", new_text="clobber")
    with pytest.raises(ToolRefused, match="outside"):
        run(edit, path="../evil.txt", old_text="", new_text="x")
    assert not (ws.root.parent / "evil.txt").exists()
    assert not list(ws.root.rglob("*.localllm-tmp"))


@pytest.mark.process  # a shell command or an MCP server
def test_a_command_runs_in_the_folder_its_output_is_bounded_and_its_time_too(
    ws: Workspace, monkeypatch: pytest.MonkeyPatch
):
    cmd = tools(ws)["run_command"]
    assert run(cmd, command="pwd; exit 3") == f"exit status 3\n{ws.root}\n"
    out = run(cmd, command="head -c 20000 /dev/zero | tr '\\0' y")
    assert out.endswith(f"[cut: the first {builtin.OUTPUT_LIMIT:,} of 20,000 bytes shown]")
    out = run(cmd, command="echo started; sleep 30", timeout_s=0.5)
    assert out == "started\n\n[stopped: still running after 0.5 s]"


class Asker:
    def __init__(self, *answers: Decision) -> None:
        self.answers = list(answers)
        self.asked: list[tuple[str, Preview]] = []

    async def __call__(self, tool: Tool, args: dict[str, Any], preview: Preview) -> Decision:
        self.asked.append((tool.name, preview))
        return self.answers.pop(0)


def test_calls_that_cannot_run_are_told_to_the_model_and_the_user_is_not_asked(ws: Workspace):
    session = AgentSession(builtin_tools(ws, ("read_file", "edit_file")))
    ask = Asker()
    cases = [
        (ToolCall("1", "run_command", '{"command": "ls"}'), "There is no tool named"),
        (ToolCall("2", "edit_file", '{"path": "notes.txt"}'), "'old_text' is a required property"),
        (ToolCall("3", "read_file", '{"path": 7}'), "at 'path': 7 is not of type 'string'"),
        (ToolCall("4", "read_file", "{not json"), "not JSON"),
        (ToolCall("5", "read_file", '["notes.txt"]'), "must be a JSON object"),
        # what cannot run whatever the user says is not asked about either
        (ToolCall("6", "read_file", '{"path": "../secret.txt"}'), "outside the folder"),
        (ToolCall("7", "read_file", '{"path": "src"}'), "is a folder"),
        (ToolCall("8", "edit_file", '{"path": "notes.txt", "old_text": "four", '
                                    '"new_text": "4"}'), "occurs 0 times"),
    ]
    for call, said in cases:
        result = asyncio.run(session.run(call, ask))
        assert result.status == "error" and said in result.result, result
    assert ask.asked == []


def test_approval_once_always_deny_and_stop(ws: Workspace):
    session = AgentSession(builtin_tools(ws, ("read_file", "list_folder")))
    read = ToolCall("r", "read_file", '{"path": "notes.txt"}')
    ask = Asker("deny", "once", "always", "stop")
    denied = asyncio.run(session.run(read, ask))
    assert denied.status == "denied" and "denied" in denied.result
    assert asyncio.run(session.run(read, ask)).result == "one\ntwo\nthree"
    assert asyncio.run(session.run(read, ask)).status == "ok"  # "always" given here
    assert asyncio.run(session.run(read, ask)).status == "ok"  # not asked again
    assert [name for name, _ in ask.asked] == ["read_file"] * 3
    listing = ToolCall("l", "list_folder", "{}")
    assert asyncio.run(session.run(listing, ask)).status == "stopped"  # another tool asks
    spec = session.spec()
    assert spec is not None and spec.names() == ["read_file", "list_folder"]
    assert AgentSession([]).spec() is None


def test_config_checks_tools_and_mcp_servers(tmp_path: Path):
    base = Settings(data_dir=tmp_path, cache_dir=tmp_path)
    for changes, said in [
        ({"chat_tools": ("rm_rf",)}, "rm_rf is not a built-in tool"),
        ({"agent_steps": 0}, "agent_steps must be 1 to 100"),
        ({"mcp_servers": (McpServer("x"),)}, "give a command"),
        ({"mcp_servers": (McpServer("x", command="a", url="http://h"),)}, "one of the two"),
        ({"mcp_servers": (McpServer("a b", command="a"),)}, "letters, digits"),
        ({"mcp_servers": (McpServer("a", command="a"), McpServer("a", command="b"))}, "2 times"),
        ({"mcp_servers": (McpServer("a", url="ftp://h"),)}, "http:// or https://"),
    ]:
        import dataclasses

        with pytest.raises(ConfigError, match=said):
            _validate_agent(dataclasses.replace(base, **changes))  # type: ignore[arg-type]


@pytest.mark.process  # a shell command or an MCP server
def test_mcp_servers_ready_failed_at_start_and_dead_later(tmp_path: Path):
    dies = tmp_path / "dies.py"
    dies.write_text(NOTES_SERVER.read_text().replace(
        "    return f\"{len(kept)} notes kept\"", "    import os\n    os._exit(1)"))
    host = McpHost((
        McpServer("notes", command=sys.executable, args=(str(NOTES_SERVER),)),
        McpServer("exits", command=sys.executable, args=("-c", "import sys; sys.exit(3)")),
        McpServer("dies", command=sys.executable, args=(str(dies),)),
        McpServer("off", command="/nonexistent", enabled=False),
    ), log_file=tmp_path / "mcp.log")
    host.start()
    try:
        host.wait_ready()
        states = host.states()
        assert states["notes"] == "ready (2 tools)" and states["dies"] == "ready (2 tools)"
        assert states["exits"].startswith("failed: ") and "off" not in states
        by_name = {t.name: t for t in host.tools()}
        assert sorted(by_name) == ["dies__add", "dies__note", "notes__add", "notes__note"]
        add = by_name["notes__add"]
        assert add.parameters["required"] == ["a", "b"] and add.source == "notes"
        assert asyncio.run(add.call({"a": 2, "b": 40})) == "42"
        with pytest.raises(ToolRefused, match="reported an error"):
            asyncio.run(add.call({"a": "x", "b": 1}))
        with pytest.raises(ToolRefused):
            asyncio.run(by_name["dies__note"].call({"text": "bye"}))  # the server exits
        for _ in range(200):  # its watcher marks it stopped and takes its tools away
            if host.states()["dies"].startswith("stopped: "):
                break
            time.sleep(0.02)
        assert host.states()["dies"].startswith("stopped: "), host.states()
        assert [t.name for t in host.tools()] == ["notes__add", "notes__note"]
        assert asyncio.run(by_name["notes__note"].call({"text": "hi"})) == "1 notes kept"
    finally:
        host.close()


@pytest.mark.process  # a shell command or an MCP server
def test_mcp_cli_imports_hosts_json_lists_over_stdio_and_http_and_removes(tmp_path: Path):
    import subprocess

    from tests.conftest import free_port

    port = free_port()
    http = subprocess.Popen([sys.executable, str(NOTES_SERVER), str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    config = tmp_path / "config.toml"
    config.write_text("# mine\nport = 8123\n")
    env = {**os.environ, "LOCALLLM_CONFIG": str(config), "LOCALLLM_DATA_DIR": str(tmp_path)}

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "localllm", "mcp", *args], env=env,
                              capture_output=True, text=True, timeout=120)

    hosts = tmp_path / "claude_desktop_config.json"
    hosts.write_text(json.dumps({"mcpServers": {
        "notes": {"command": sys.executable, "args": [str(NOTES_SERVER)],
                  "env": {"NOTES_MODE": "test"}},
        "web notes": {"type": "http", "url": f"http://127.0.0.1:{port}/mcp"},
        "legacy": {"type": "sse", "url": "http://127.0.0.1:1/sse"},
        "off": {"command": "nothing-here", "disabled": True},
    }}))
    try:
        done = cli("import", str(hosts))
        assert done.returncode == 0, done.stderr
        assert "skipped legacy: an SSE server" in done.stderr
        assert "Imported 3 MCP server(s)" in done.stderr
        text = config.read_text()
        assert text.startswith("# mine\nport = 8123\n")  # the user's file kept as written
        assert 'name = "web-notes"' in text and "enabled = false" in text
        again = cli("import", str(hosts))
        assert "a server of that name exists" in again.stderr and again.returncode == 1
        for _ in range(50):  # the HTTP server may still be starting
            by_name = {r["name"]: r for r in json.loads(cli("list", "--json").stdout)}
            if by_name["web-notes"]["state"].startswith("ready"):
                break
            time.sleep(0.2)
        assert by_name["notes"]["state"] == "ready (2 tools)"
        assert by_name["web-notes"]["state"] == "ready (2 tools)", by_name
        assert by_name["web-notes"]["tools"] == ["web-notes__add", "web-notes__note"]
        assert by_name["off"]["state"] == "disabled"
        assert cli("rm", "nope").returncode == 2
        assert cli("rm", "off").returncode == 0
        assert [r["name"] for r in json.loads(cli("list", "--json").stdout)] == [
            "notes", "web-notes"]
        bad = tmp_path / "bad.json"
        bad.write_text('{"other": {}}')
        refused = cli("import", str(bad))
        assert refused.returncode == 2 and 'no "mcpServers"' in refused.stderr
    finally:
        http.terminate()
        http.wait(10)


@pytest.mark.process  # a shell command or an MCP server
def test_a_server_killed_from_outside_is_noticed_by_its_ping(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    import signal

    from localllm.agent import mcp_host

    monkeypatch.setattr(mcp_host, "PING_EVERY_S", 0.1)
    pid_file = tmp_path / "notes.pid"
    server = McpServer("notes", command=sys.executable, args=(str(NOTES_SERVER),),
                       env={"NOTES_PID_FILE": str(pid_file)})
    changes: list[dict[str, str]] = []
    host = McpHost((server,), on_change=lambda: changes.append(host.states()))
    host.start()
    try:
        host.wait_ready()
        assert host.states() == {"notes": "ready (2 tools)"}
        os.kill(int(pid_file.read_text()), signal.SIGKILL)
        for _ in range(300):
            if host.states()["notes"].startswith("stopped: "):
                break
            time.sleep(0.02)
        assert host.states()["notes"].startswith("stopped: "), host.states()
        assert host.tools() == [] and changes[-1] == host.states()  # the chat was told
    finally:
        host.close()


@pytest.mark.process  # an MCP server
def test_closing_does_not_wait_for_a_server_that_never_answers(tmp_path: Path):
    silent = McpServer("silent", command=sys.executable, args=("-c", "import time; time.sleep(60)"))
    host = McpHost((silent,))
    host.start()
    for _ in range(100):  # it is started and waits for its `initialize` answer
        if host._starting:
            break
        time.sleep(0.02)
    assert host.states() == {"silent": "starting"}
    host.close()  # joins the servers' thread for at most 10 s
    assert not host._thread.is_alive()  # it did not wait out the 30 s start limit
    assert host.states() == {"silent": "closed"}

