"""The `localllm` command in a child process, as a user runs it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import THREADS, ServerProcess, free_port


def cli(*args: str, stdin: str | None = None, tmp: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "LOCALLLM_CONFIG": str(tmp / "none.toml"),
           "LOCALLLM_DATA_DIR": str(tmp / "data"), "HF_HUB_CACHE": str(tmp / "hf")}
    return subprocess.run([sys.executable, "-m", "localllm", *args], input=stdin,
                          capture_output=True, text=True, env=env, timeout=120)


@pytest.mark.process
def test_run_streams_an_answer(tmp_path: Path):
    r = cli("run", "Write a haiku about the sea", "--max-tokens", "12", "--temperature", "0",
            "--threads", str(THREADS), tmp=tmp_path)
    assert r.returncode == 0, r.stderr
    again = cli("run", "Write a haiku about the sea", "--max-tokens", "12", "--temperature",
                "0", "--seed", "1", "--threads", str(THREADS), tmp=tmp_path)
    assert r.stdout.strip() and r.stdout == again.stdout
    assert "Traceback" not in r.stderr


@pytest.mark.process
def test_run_reads_stdin_and_system(tmp_path: Path):
    r = cli("run", "-", "--system", "You are a pirate.", "--max-tokens", "8", "--stats",
            "--threads", str(THREADS), stdin="Say hi", tmp=tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip()
    assert "generated 8 tokens" in r.stderr or "finish: stop" in r.stderr


@pytest.mark.process
def test_run_tools_on_the_starter_speaks_json_and_its_status_says_how_it_ended(
    tmp_path: Path,
):
    """`run --tools --json` in a real process on the real starter (which calls tools
    badly: what is checked is the face, whatever the model does): every stdout line is
    a JSON event, the last says the outcome, the exit status matches it, and with no
    terminal and nothing allowed no call ran. The prompt after a bare --tools is the
    prompt, not a tool list."""
    folder = tmp_path / "work"
    folder.mkdir()
    (folder / "NOTES.md").write_text("The secret word is pelican.\n")
    r = cli("run", "--folder", str(folder), "--steps", "1", "--max-tokens", "40",
            "--threads", str(THREADS), "--json", "--tools",
            "What is the secret word in NOTES.md?", tmp=tmp_path)
    events = [json.loads(line) for line in r.stdout.splitlines()]
    assert events and events[-1]["type"] == "end", r.stdout + r.stderr
    exits = {"done": 0, "step_limit": 3, "stopped": 4, "loop": 4}
    assert r.returncode == exits[events[-1]["outcome"]], r.stderr
    assert all(e["status"] in ("denied", "error", "not run") for e in events
               if e["type"] == "result")
    assert "Traceback" not in r.stderr
    bad = cli("run", "hi", "--tools", "read_file,rm_rf", tmp=tmp_path)
    assert bad.returncode == 2 and "rm_rf: not a built-in tool" in bad.stderr


@pytest.mark.process
def test_list_and_info(tmp_path: Path):
    r = cli("list", tmp=tmp_path)
    assert r.returncode == 0
    header, row = r.stdout.splitlines()[:2]
    assert header.split() == ["NAME", "FORMAT", "PARAMS", "QUANT", "SIZE", "CONTEXT", "INPUT",
                              "SOURCE"]
    assert row.split()[:4] == ["starter", "gguf", "135M", "Q4_1"]
    info = cli("info", "starter", tmp=tmp_path)
    assert info.returncode == 0
    assert "architecture     llama" in info.stdout
    assert "trained context  8192 tokens" in info.stdout
    assert "chat template    yes" in info.stdout


def test_list_info_and_ps_as_json(tmp_path: Path, server):
    import json

    models = json.loads(cli("list", "--json", tmp=tmp_path).stdout)
    starter = next(m for m in models if m["name"] == "starter")
    assert starter["format"] == "gguf" and starter["quantization"] == "Q4_1"
    assert starter["parameters"] == 134515008 and starter["trained_context"] == 8192
    info = json.loads(cli("info", "starter", "--json", tmp=tmp_path).stdout)
    assert info["architecture"] == "llama" and info["layers"] == 30
    assert info["kv_bytes"] == info["kv_bytes_per_token"] * info["default_context"] * 4
    assert info["chat_template"] is True and info["fill_in_middle"] is False
    assert info["kv_type"] == "f16" and info["capabilities"] == ["completion", "tools", "embedding"]
    q4 = json.loads(
        cli("info", "starter", "--json", "--kv-cache-type", "q4_0", tmp=tmp_path).stdout)
    assert q4["kv_type"] == "q4_0"  # ggml's q4_0: 32 values in 18 bytes, f16's 64
    assert q4["kv_bytes_per_token"] == info["kv_bytes_per_token"] * 18 // 64
    ps = cli("ps", "--json", "--port", str(server.port), tmp=tmp_path)
    assert ps.returncode == 0, ps.stderr
    health = json.loads(ps.stdout)
    assert health["status"] == "ok" and health["models"][0]["model"] == "starter"


@pytest.mark.process
def test_bench_measures_a_running_server(tmp_path: Path, server: ServerProcess):
    """`localllm bench` against a server (here by --url, as it is pointed at llama-server
    for a paired figure): every figure measured, the follow-up served from the cache."""
    r = cli("bench", "--url", server.base, "--rounds", "1", "--tokens", "8", "--json",
            tmp=tmp_path)
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)
    assert got["model"] == "starter" and got["rounds"] == 1
    for key in ("one_stream_decode_tps", "four_streams_aggregate_tps",
                "one_stream_first_token_s", "four_streams_slowest_first_token_s",
                "cold_prompt_first_token_s", "follow_up_first_token_s"):
        assert got[key] > 0, key
    assert got["cold_prompt_tokens"] > 1000
    assert 0.5 < got["follow_up_cached_share"] <= 1.0
    gone = cli("bench", "--port", str(free_port()), "--rounds", "1", tmp=tmp_path)
    assert gone.returncode == 1 and "no OpenAI-compatible server answers at" in gone.stderr


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (("run", "hi", "--model", "/no/such/model.gguf"), "was not found (no such file)"),
        (("info", "nonexistent-model"), "Local models: starter"),
        (("run", "hi", "--max-tokens", "abc"), "expected a whole number, got 'abc'"),
        (("run", "hi", "--temperature", "9"), "expected a value from 0 to 2, got 9.0"),
        (("serve", "--port", "70000"), "a port is at most 65535, got 70000"),
        (("run",), "run needs a prompt"),
        (("frobnicate",), "invalid choice: 'frobnicate'"),
    ],
)
@pytest.mark.process
def test_errors_are_one_line_with_exit_code_2(tmp_path: Path, args: tuple[str, ...],
                                              needle: str):
    r = cli(*args, tmp=tmp_path)
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith("localllm: error:") and needle in lines[0]


@pytest.mark.process
def test_a_bad_key_name_is_bad_input_exit_code_2(tmp_path: Path):
    assert cli("keys", "add", "ci", tmp=tmp_path).returncode == 0
    for name, needle in [("../x", "got '../x'"), ("", "got ''"), ("k" * 65, "1 to 64"),
                         ("two words", "got 'two words'"), ("ci", "exists already")]:
        r = cli("keys", "add", name, tmp=tmp_path)
        assert r.returncode == 2, (name, r.stderr)
        (line,) = r.stderr.strip().splitlines()
        assert line.startswith("localllm: error:") and needle in line, line
        assert r.stdout == ""  # no secret printed for a key that was not made


@pytest.mark.process
def test_port_in_use_is_a_clear_error(tmp_path: Path):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        port = s.getsockname()[1]
        r = cli("serve", "--port", str(port), tmp=tmp_path)
    assert r.returncode == 2
    assert f"cannot listen on 127.0.0.1:{port}" in r.stderr


@pytest.mark.process
def test_show_prints_the_template_and_the_default_sampling(tmp_path: Path):
    template = cli("show", "starter", "--template", tmp=tmp_path)
    assert template.returncode == 0, template.stderr
    assert "<|im_start|>" in template.stdout and "add_generation_prompt" in template.stdout
    params = cli("show", "starter", "--parameters", tmp=tmp_path)
    lines = dict(line.split(" ", 1) for line in params.stdout.splitlines())
    # the starter's model card recommends two, the short- and long-answer measurement
    # the penalty and its scope (models/sampling.py); the rest are localllm's defaults
    source = "SmolLM2's model card, benchmarked"
    assert lines["temperature"] == f"0.2  # {source}" and lines["top_k"] == "40"
    assert lines["top_p"] == f"0.9  # {source}"
    assert lines["repeat_penalty"] == f"1.1  # {source}"
    assert lines["penalize_prompt"] == f"False  # {source}"  # the answer's own tokens only
    both = cli("show", "starter", tmp=tmp_path).stdout
    assert "# chat template" in both and "# default sampling" in both


@pytest.mark.parametrize("shell", ["bash", "zsh", "fish"])
@pytest.mark.process
def test_completion_scripts(tmp_path: Path, shell: str):
    r = cli("completion", shell, tmp=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "localllm" in r.stdout and "_ARGCOMPLETE" in r.stdout


@pytest.mark.process
def test_completion_completes_subcommands(tmp_path: Path):
    """What the shell hook asks, in argcomplete's protocol, answered by localllm itself."""
    out = tmp_path / "out.txt"
    env = {**os.environ, "_ARGCOMPLETE": "1", "COMP_LINE": "localllm ser", "COMP_POINT": "12",
           "_ARGCOMPLETE_IFS": "\n", "_ARGCOMPLETE_STDOUT_FILENAME": str(out),
           "LOCALLLM_DATA_DIR": str(tmp_path / "data")}
    done = subprocess.run([sys.executable, "-m", "localllm"], env=env, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    words = set(out.read_text().split())
    assert {"serve", "service"} <= words, words
