"""`localllm launch`: the configuration each client needs, written over what the user has
(kept, and backed up) or printed; the client is then started when it is installed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import tomllib

from localllm.cli import main


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("CODEX_HOME", str(tmp_path / ".codex"))
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))  # no client installed
    return tmp_path


def test_codex_provider_is_added_to_the_users_config(home: Path, capsys: pytest.CaptureFixture):
    config = home / ".codex" / "config.toml"
    config.parent.mkdir()
    config.write_text('model = "gpt-5"\n\n[mcp_servers.docs]\ncommand = "docs-mcp"\n')
    assert main(["launch", "codex", "--port", "9001"]) == 2  # written; codex is not installed
    assert "codex is not on PATH" in capsys.readouterr().err
    written = tomllib.loads(config.read_text())
    assert written["model"] == "gpt-5" and written["mcp_servers"]["docs"]["command"] == "docs-mcp"
    provider = written["model_providers"]["localllm"]
    assert provider["base_url"] == "http://127.0.0.1:9001/v1"
    assert provider["wire_api"] == "responses"
    assert written["profiles"]["localllm"] == {"model": "starter", "model_provider": "localllm"}
    backups = list(config.parent.glob("config.toml.bak-*"))
    assert len(backups) == 1 and "gpt-5" in backups[0].read_text()
    # again, on another port: our block is replaced, not repeated; the rest stays
    main(["launch", "codex", "--port", "9002"])
    again = tomllib.loads(config.read_text())
    assert again["model_providers"]["localllm"]["base_url"] == "http://127.0.0.1:9002/v1"
    assert config.read_text().count("[model_providers.localllm]") == 1
    assert again["mcp_servers"]["docs"]["command"] == "docs-mcp"


def test_print_changes_nothing(home: Path, capsys: pytest.CaptureFixture):
    assert main(["launch", "opencode", "--print"]) == 0
    shown = capsys.readouterr().out
    assert not (home / ".config" / "opencode" / "opencode.json").exists()
    config = json.loads(shown.split("\n", 1)[1])
    assert config["provider"]["localllm"]["options"]["baseURL"] == "http://127.0.0.1:8642/v1"
    assert main(["launch", "claude", "--print"]) == 0
    shown = capsys.readouterr().out
    assert "export ANTHROPIC_BASE_URL=http://127.0.0.1:8642\n" in shown
    # every tier it asks for names the local model (its background work asks for haiku),
    # and an answer may take longer than its 5-minute idle bound to start
    for tier in ("OPUS", "SONNET", "HAIKU"):
        assert f"export ANTHROPIC_DEFAULT_{tier}_MODEL=starter\n" in shown
    assert "export CLAUDE_STREAM_IDLE_TIMEOUT_MS=1800000\n" in shown


def test_opencode_keeps_other_providers(home: Path):
    config = home / ".config" / "opencode" / "opencode.json"
    config.parent.mkdir(parents=True)
    config.write_text(json.dumps({"provider": {"ollama": {"name": "Ollama"}}, "theme": "x"}))
    main(["launch", "opencode"])
    written = json.loads(config.read_text())
    assert set(written["provider"]) == {"ollama", "localllm"} and written["theme"] == "x"


@pytest.mark.parametrize("client, says", [("aider", "ollama_chat/starter"),
                                          ("continue", "apiBase: http://127.0.0.1:8642/v1"),
                                          ("zed", '"api_url": "http://127.0.0.1:8642"')])
def test_snippets(home: Path, capsys: pytest.CaptureFixture, client: str, says: str):
    assert main(["launch", client]) == 0
    assert says in capsys.readouterr().out
