"""`localllm launch`: the configuration each client needs, written over what the user has
(kept, and backed up) or printed; the client is then started when it is installed."""

from __future__ import annotations

import json
import os
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


def _profile(home: Path) -> dict:
    return tomllib.loads((home / ".codex" / "localllm.config.toml").read_text())


def test_codex_gets_a_profile_file_and_its_config_is_left_alone(
    home: Path, capsys: pytest.CaptureFixture
):
    config = home / ".codex" / "config.toml"
    config.parent.mkdir()
    mine = 'model = "gpt-5"\n\n[mcp_servers.docs]\ncommand = "docs-mcp"\n'
    config.write_text(mine)
    assert main(["launch", "codex", "--port", "9001"]) == 2  # written; codex is not installed
    err = capsys.readouterr().err
    assert "codex is not on PATH" in err
    assert "no server answers at http://127.0.0.1:9001; start one with `localllm serve`" in err
    assert config.read_text() == mine and not list(config.parent.glob("config.toml.bak-*"))
    profile = _profile(home)
    assert profile["model"] == "starter" and profile["model_provider"] == "localllm"
    provider = profile["model_providers"]["localllm"]
    assert provider["base_url"] == "http://127.0.0.1:9001/v1"
    assert provider["wire_api"] == "responses" and provider["env_key"] == "LOCALLLM_API_KEY"
    # again, on another port: our table is replaced, not repeated; the old one backed up
    main(["launch", "codex", "--port", "9002"])
    assert _profile(home)["model_providers"]["localllm"]["base_url"] == "http://127.0.0.1:9002/v1"
    text = (home / ".codex" / "localllm.config.toml").read_text()
    assert text.count("[model_providers.localllm]") == 1
    backups = list(config.parent.glob("localllm.config.toml.bak-*"))
    assert len(backups) == 1 and "9001" in backups[0].read_text()


def test_a_legacy_profile_table_moves_into_the_profile_file(
    home: Path, capsys: pytest.CaptureFixture
):
    """What an earlier launch (and Codex before profile files) wrote into config.toml makes
    Codex 0.171 refuse `--profile localllm`: the table, the selector and our provider move
    out, with the user's own keys in them; the rest of config.toml stays as it was."""
    config = _codex(home)
    config.write_text(
        'profile = "localllm"\nmodel = "gpt-5"  # mine\n\n'
        '[model_providers.localllm]\nname = "mine"\nrequest_max_retries = 9\n\n'
        '[model_providers.other]\nname = "other"\n\n'
        '[profiles.localllm]\nmodel = "old"\napproval_policy = "never"\n\n'
        '[profiles.work]\nmodel = "gpt-5"\n\n[tools]\nweb_search = true\n'
    )
    main(["launch", "codex", "--model", "new"])
    assert "moved the localllm profile out of" in capsys.readouterr().err
    written = tomllib.loads(config.read_text())
    assert "profile" not in written and "localllm" not in written["profiles"]
    assert written["profiles"]["work"] == {"model": "gpt-5"}
    assert set(written["model_providers"]) == {"other"} and written["tools"]["web_search"]
    assert 'model = "gpt-5"  # mine' in config.read_text()  # comments stay
    profile = _profile(home)
    assert profile["model"] == "new" and profile["approval_policy"] == "never"
    provider = profile["model_providers"]["localllm"]
    assert provider["request_max_retries"] == 9 and provider["name"] == "localllm"
    backups = list(config.parent.glob("config.toml.bak-*"))
    assert len(backups) == 1 and "[profiles.localllm]" in backups[0].read_text()


@pytest.mark.process
def test_launch_points_the_client_at_the_model_the_server_serves(
    home: Path, tmp_path: Path, starter_ref, capsys: pytest.CaptureFixture
):
    from tests.conftest import ServerProcess

    coder = tmp_path / "coder-copy.gguf"
    coder.symlink_to(starter_ref.path)
    srv = ServerProcess(tmp_path, "--model", str(coder))
    try:
        args = ["--port", str(srv.port)]
        assert main(["launch", "codex", *args]) == 2  # written; codex is not installed
        said = capsys.readouterr().err
        assert f"the server at {srv.base} serves coder-copy; codex will use it" in said
        assert _profile(home)["model"] == "coder-copy"
        assert main(["launch", "opencode", "--print", *args]) == 0
        shown = json.loads(capsys.readouterr().out.split("\n", 1)[1])
        assert list(shown["provider"]["localllm"]["models"]) == ["coder-copy"]
        assert main(["launch", "claude", "--print", *args, "--model", "mine"]) == 0
        assert "export ANTHROPIC_MODEL=mine\n" in capsys.readouterr().out  # --model wins
    finally:
        srv.stop()


def _fake_codex(home: Path, version: str) -> Path:
    """A `codex` on PATH that says its version and records how it was started."""
    import sys

    bin_dir = home / "bin"
    bin_dir.mkdir(exist_ok=True)
    exe = bin_dir / "codex"
    exe.write_text(
        f"#!{sys.executable}\nimport json, os, sys\n"
        f"if sys.argv[1:] == ['--version']:\n    print('codex-cli {version}'); sys.exit(0)\n"
        f"open({str(home / 'started.json')!r}, 'w').write(json.dumps("
        "[sys.argv[1:], os.environ.get('LOCALLLM_API_KEY')]))\n"
    )
    exe.chmod(0o755)
    return home / "started.json"


@pytest.mark.process
def test_the_client_is_started_with_the_arguments_after_the_dashes(
    home: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
):
    import subprocess
    import sys

    started = _fake_codex(home, "0.171.0")
    argv = [sys.executable, "-m", "localllm", "launch", "codex", "--model", "m", "--",
            "exec", "--skip-git-repo-check", "fix the test"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120, env=os.environ)
    assert done.returncode == 0, done.stderr
    args, key = json.loads(started.read_text())
    assert args == ["--profile", "localllm", "exec", "--skip-git-repo-check", "fix the test"]
    assert key == "unused" and "older than" not in done.stderr
    _fake_codex(home, "0.99.0")
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120, env=os.environ)
    assert "Codex CLI 0.99.0 is older than the versions launch is tested with" in done.stderr
    assert main(["launch", "zed", "--", "x"]) == 2
    assert "zed is not started by launch; it takes no arguments" in capsys.readouterr().err


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
    assert main(["launch", client, "--print"]) == 0
    assert says in capsys.readouterr().out


# -- the user's config is never destroyed (issue #51) -------------------------------------
def _codex(home: Path) -> Path:
    config = home / ".codex" / "config.toml"
    config.parent.mkdir(exist_ok=True)
    return config


def test_two_launches_in_one_second_keep_the_original_in_a_backup_of_its_own(home: Path):
    profile = _codex(home).parent / "localllm.config.toml"
    profile.write_text('approval_policy = "never"  # mine\n')
    for model in ("a", "b", "c"):
        main(["launch", "codex", "--model", model])
    backups = sorted(profile.parent.glob("localllm.config.toml.bak-*"))
    assert len(backups) == 3  # none replaced another, whatever the clock said
    assert 'approval_policy = "never"  # mine\n' in [b.read_text() for b in backups]
    assert _profile(home)["model"] == "c" and _profile(home)["approval_policy"] == "never"


@pytest.mark.process
def test_launches_racing_in_two_processes_keep_the_original(home: Path):
    import subprocess
    import sys

    profile = _codex(home).parent / "localllm.config.toml"
    profile.write_text("# the user's own\n")
    argv = [sys.executable, "-m", "localllm", "launch", "codex", "--model"]
    procs = [subprocess.Popen([*argv, m], stderr=subprocess.PIPE) for m in ("x", "y")]
    for p in procs:
        _, err = p.communicate(timeout=120)
        assert b"Traceback" not in err
    texts = [b.read_text() for b in profile.parent.glob("localllm.config.toml.bak-*")]
    assert "# the user's own\n" in texts
    assert _profile(home)["model"] in ("x", "y")


# "--" alone: Python 3.11's argparse drops it from `--model=--` (a clean one-line error)
@given(model=st.text(min_size=1, max_size=40).filter(lambda m: m != "--"), user=st.dictionaries(
    st.text(alphabet="abcxyz_", min_size=1, max_size=6).filter(
        lambda k: k not in ("model_providers", "profiles", "profile")
    ),
    st.one_of(st.text(max_size=20), st.integers(), st.booleans()),
    max_size=4,
))
def test_any_model_name_is_escaped_and_the_users_keys_stay(model: str, user: dict):
    import tempfile

    with tempfile.TemporaryDirectory(prefix="home-") as tmp:
        _launch_in(Path(tmp), model, user)


def _launch_in(home: Path, model: str, user: dict) -> None:
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
    assert tomllib.loads(config.read_text()) == user  # theirs, untouched
    profile = tomllib.loads((config.parent / "localllm.config.toml").read_text())
    assert profile["model"] == model  # exactly, no injected keys
    assert set(profile) == {"model", "model_provider", "model_providers"}


def test_a_symlinked_config_is_edited_through_its_link(home: Path):
    dotfiles = home / "dotfiles"
    dotfiles.mkdir()
    (dotfiles / "codex.toml").write_text('model = "gpt-5"\n')
    (dotfiles / "localllm.toml").write_text('approval_policy = "never"\n')
    config = home / ".codex" / "config.toml"
    config.parent.mkdir()
    config.symlink_to(dotfiles / "codex.toml")
    profile = config.parent / "localllm.config.toml"
    profile.symlink_to(dotfiles / "localllm.toml")
    main(["launch", "codex"])
    assert config.is_symlink() and profile.is_symlink()  # the dotfiles still own them
    written = tomllib.loads((dotfiles / "localllm.toml").read_text())
    assert written["model_provider"] == "localllm" and written["approval_policy"] == "never"


@pytest.mark.parametrize(
    "client, name, content, said",
    [
        ("codex", ".codex/config.toml", b'model = "caf\xe9"\n', "not UTF-8 text (byte 12 is 0xe9)"),
        ("codex", ".codex/config.toml", b"model = = 1\n", "is not valid TOML"),
        ("codex", ".codex/localllm.config.toml", b"model_providers = 3\n",
         "'model_providers' is not a"),
        ("codex", ".codex/localllm.config.toml", b"[x\n", "is not valid TOML"),
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
