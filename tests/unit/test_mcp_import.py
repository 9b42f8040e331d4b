"""`localllm mcp import` as a careless user and a hostile file meet it (issue #51): a file
nested 100,000 deep, tens of thousands of servers, names that would collide once
cleaned, a symlinked config, two imports in one second. One line and exit 2 for what it
cannot read; the user's config is kept, comments and all."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import tomllib

from localllm.cli import main
from localllm.cli.mcp import MAX_JSON_DEPTH, json_depth


@pytest.fixture
def config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "config.toml"
    path.write_text("# my settings\nport = 8123\n")
    monkeypatch.setenv("LOCALLLM_CONFIG", str(path))
    monkeypatch.setenv("LOCALLLM_DATA_DIR", str(tmp_path / "data"))
    return path


def hosts(tmp_path: Path, servers: dict) -> Path:
    path = tmp_path / "claude_desktop_config.json"
    path.write_text(json.dumps({"mcpServers": servers}))
    return path


def test_a_file_nested_deeper_than_any_host_writes_is_refused_before_parsing(
    tmp_path: Path, config: Path, capsys: pytest.CaptureFixture
):
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100_000 + "]" * 100_000)
    assert main(["mcp", "import", str(deep)]) == 2
    err = capsys.readouterr().err
    assert err == (
        f"localllm: error: {deep}: it nests 100,000 levels deep; a host's file needs 3, "
        f"and at most {MAX_JSON_DEPTH} are read\n"
    )
    assert config.read_text() == "# my settings\nport = 8123\n"
    # brackets inside strings are text, not nesting
    assert json_depth(json.dumps({"a": ["[[[[{{{{" * 50]})) == 2


def test_names_that_would_collide_are_refused_by_name_and_the_rest_imported(
    tmp_path: Path, config: Path, capsys: pytest.CaptureFixture
):
    file = hosts(tmp_path, {
        "a b": {"command": "one"},
        "a-b": {"command": "two"},
        "c": {"command": "three"},
    })
    assert main(["mcp", "import", str(file)]) == 0
    err = capsys.readouterr().err
    assert "skipped a b: 'a b' and 'a-b' would both be named 'a-b'; rename one" in err
    assert "skipped a-b: 'a b' and 'a-b' would both be named 'a-b'; rename one" in err
    assert "Imported 1 MCP server(s)" in err
    servers = tomllib.loads(config.read_text())["mcp_servers"]
    assert [(s["name"], s["command"]) for s in servers] == [("c", "three")]


def test_many_servers_import_whole_and_replace_once(
    tmp_path: Path, config: Path, capsys: pytest.CaptureFixture
):
    n = 3_000
    file = hosts(tmp_path, {f"s{i}": {"command": "npx", "args": [f"pkg-{i}"]} for i in range(n)})
    assert main(["mcp", "import", str(file)]) == 0
    assert main(["mcp", "import", "--replace", str(file)]) == 0
    err = capsys.readouterr().err
    assert f"Imported {n:,} MCP server(s)" in err and f"and {n - 20:,} more" in err
    written = tomllib.loads(config.read_text())
    assert len(written["mcp_servers"]) == n and written["port"] == 8123
    last = {"name": f"s{n - 1}", "command": "npx", "args": [f"pkg-{n - 1}"]}
    assert written["mcp_servers"][-1] == last


def test_twice_in_one_second_keeps_the_users_file_and_a_symlink_stays_one(
    tmp_path: Path, config: Path, capsys: pytest.CaptureFixture
):
    dotfiles = tmp_path / "dotfiles"
    dotfiles.mkdir()
    real = dotfiles / "localllm.toml"
    real.write_text(config.read_text())
    config.unlink()
    config.symlink_to(real)
    file = hosts(tmp_path, {"notes": {"command": "notes-mcp"}})
    assert main(["mcp", "import", str(file)]) == 0
    assert main(["mcp", "import", str(file)]) == 1  # nothing new: the name exists
    assert "a server of that name exists" in capsys.readouterr().err
    assert config.is_symlink() and real.read_text().startswith("# my settings\nport = 8123\n")
    assert [s["name"] for s in tomllib.loads(real.read_text())["mcp_servers"]] == ["notes"]


@pytest.mark.parametrize(
    "content, said",
    [
        (b"\xff\xfe{}", "is not UTF-8 text (byte 0 is 0xff)"),
        (b"{", "Expecting property name"),
        (b"[]", "the file holds no JSON object"),
        (b'{"servers": 3}', 'it has no "mcpServers"'),
    ],
)
def test_a_file_it_cannot_read_is_one_line_and_exit_2(
    tmp_path: Path, config: Path, capsys: pytest.CaptureFixture, content: bytes, said: str
):
    file = tmp_path / "hosts.json"
    file.write_bytes(content)
    assert main(["mcp", "import", str(file)]) == 2
    err = capsys.readouterr().err
    assert said in err and len(err.strip().splitlines()) == 1, err
