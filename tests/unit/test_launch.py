"""`localllm launch`: the configuration each client needs, written over what the user has
(kept, and backed up) or printed; the client is then started when it is installed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import tomllib
from hypothesis import given
from hypothesis import strategies as st

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


# -- the user's config is never destroyed (issue #51) -------------------------------------
def _codex(home: Path) -> Path:
    config = home / ".codex" / "config.toml"
    config.parent.mkdir(exist_ok=True)
    return config


def test_two_launches_in_one_second_keep_the_original_in_a_backup_of_its_own(home: Path):
    config = _codex(home)
    config.write_text('model = "gpt-5"  # mine\n')
    for model in ("a", "b", "c"):
        main(["launch", "codex", "--model", model])
    backups = sorted(config.parent.glob("config.toml.bak-*"))
    assert len(backups) == 3  # none replaced another, whatever the clock said
    assert 'model = "gpt-5"  # mine\n' in [b.read_text() for b in backups]
    assert tomllib.loads(config.read_text())["profiles"]["localllm"]["model"] == "c"


@pytest.mark.process
def test_launches_racing_in_two_processes_keep_the_original(home: Path):
    import subprocess
    import sys

    config = _codex(home)
    config.write_text("# the user's own\n")
    argv = [sys.executable, "-m", "localllm", "launch", "codex", "--model"]
    procs = [subprocess.Popen([*argv, m], stderr=subprocess.PIPE) for m in ("x", "y")]
    for p in procs:
        _, err = p.communicate(timeout=120)
        assert b"Traceback" not in err
    texts = [b.read_text() for b in config.parent.glob("config.toml.bak-*")]
    assert "# the user's own\n" in texts
    assert tomllib.loads(config.read_text())["profiles"]["localllm"]["model"] in ("x", "y")


def test_an_existing_localllm_provider_is_merged_not_declared_twice(home: Path):
    config = _codex(home)
    config.write_text(
        '[model_providers.localllm]\nname = "mine"\nrequest_max_retries = 9\n\n'
        '[profiles.localllm]\nmodel = "old"\n\n[tools]\nweb_search = true\n'
    )
    main(["launch", "codex", "--model", "new"])
    written = tomllib.loads(config.read_text())  # valid TOML: nothing declared twice
    provider = written["model_providers"]["localllm"]
    assert provider["request_max_retries"] == 9 and provider["name"] == "localllm"
    assert written["profiles"]["localllm"]["model"] == "new" and written["tools"]["web_search"]


# "--" alone: Python 3.11's argparse drops it from `--model=--` (a clean one-line error)
@given(model=st.text(min_size=1, max_size=40).filter(lambda m: m != "--"), user=st.dictionaries(
    st.text(alphabet="abcxyz_", min_size=1, max_size=6).filter(
        lambda k: k not in ("model_providers", "profiles")
    ),
    st.one_of(st.text(max_size=20), st.integers(), st.booleans()),
    max_size=4,
))
def test_any_model_name_is_escaped_and_the_users_keys_stay(model: str, user: dict):
    import tempfile

    with tempfile.TemporaryDirectory(prefix="home-") as tmp:
        _launch_in(Path(tmp), model, user)


def _launch_in(home: Path, model: str, user: dict) -> None:
    import os

    import tomlkit

    config = home / ".codex" / "config.toml"
    config.parent.mkdir()
    config.write_text(tomlkit.dumps(user))
    old = {k: os.environ.get(k) for k in ("HOME", "CODEX_HOME", "PATH")}
    os.environ.update(HOME=str(home), CODEX_HOME=str(config.parent), PATH=str(home / "bin"))
    try:
        # --model=X: a name that starts with '-' is a value, not a flag
        assert main(["launch", "codex", f"--model={model}"]) == 2  # codex is not installed
    finally:
        for k, v in old.items():
            os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)
    written = tomllib.loads(config.read_text())
    assert written["profiles"]["localllm"]["model"] == model  # exactly, no injected keys
    assert set(written) == set(user) | {"model_providers", "profiles"}
    assert all(written[k] == v for k, v in user.items())


def test_a_symlinked_config_is_edited_through_its_link(home: Path):
    dotfiles = home / "dotfiles"
    dotfiles.mkdir()
    (dotfiles / "codex.toml").write_text('model = "gpt-5"\n')
    config = home / ".codex" / "config.toml"
    config.parent.mkdir()
    config.symlink_to(dotfiles / "codex.toml")
    main(["launch", "codex"])
    assert config.is_symlink()  # the dotfiles repository still owns the file
    assert "localllm" in tomllib.loads((dotfiles / "codex.toml").read_text())["model_providers"]


@pytest.mark.parametrize(
    "client, name, content, said",
    [
        ("codex", ".codex/config.toml", b'model = "caf\xe9"\n', "not UTF-8 text (byte 12 is 0xe9)"),
        ("codex", ".codex/config.toml", b"model = = 1\n", "is not valid TOML"),
        ("codex", ".codex/config.toml", b"model_providers = 3\n", "'model_providers' is not a"),
        ("opencode", ".config/opencode/opencode.json", b"[1, 2]", "holds a JSON list"),
        ("opencode", ".config/opencode/opencode.json", b'{"provider": 1}', 'provider" is a'),
        ("opencode", ".config/opencode/opencode.json", b"{", "is not valid JSON"),
    ],
)
def test_a_config_it_cannot_read_is_refused_in_one_line_and_left_alone(
    home: Path, capsys: pytest.CaptureFixture, client: str, name: str, content: bytes, said: str
):
    path = home / name
    path.parent.mkdir(parents=True)
    path.write_bytes(content)
    assert main(["launch", client]) == 2
    err = capsys.readouterr().err
    assert said in err and str(path) in err and len(err.strip().splitlines()) == 1, err
    assert path.read_bytes() == content and not list(path.parent.glob("*.bak-*"))
