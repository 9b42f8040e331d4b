"""`localllm service`: the systemd unit and launchd plist it writes, checked by their own
tools where present, and install / uninstall against a recording systemctl."""

from __future__ import annotations

import os
import plistlib
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from localllm.cli.service import render_launchd, render_systemd, serve_command

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.process
def test_systemd_unit_renders_and_verifies(tmp_path: Path):
    command = serve_command(["--", "--port", "9000", "--model", "my model"])
    assert command[-4:] == ["--port", "9000", "--model", "my model"]
    text = render_systemd(command)
    assert "Restart=on-failure" in text and "WantedBy=default.target" in text
    assert f"ExecStart={sys.executable} -m localllm serve --port 9000 --model 'my model'" in text
    if shutil.which("systemd-analyze") is None:
        pytest.skip("systemd-analyze is not installed")
    unit = tmp_path / "localllm.service"
    unit.write_text(text)
    done = subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert str(unit) not in done.stderr, done.stderr  # no warning about our file


def test_launchd_plist_renders_and_parses(tmp_path: Path):
    command = serve_command([])
    plist = plistlib.loads(render_launchd(command, tmp_path / "Logs" / "localllm"))
    assert plist["Label"] == "dev.localllm.serve"
    assert plist["ProgramArguments"] == [sys.executable, "-m", "localllm", "serve"]
    assert plist["RunAtLoad"] is True and plist["KeepAlive"] is True
    assert plist["StandardErrorPath"] == str(tmp_path / "Logs" / "localllm" / "localllm.log")


def test_the_repository_templates_are_the_packaged_ones():
    for name, packaged in (("systemd/localllm.service", "localllm.service"),
                           ("launchd/dev.localllm.serve.plist", "dev.localllm.serve.plist")):
        in_repo = REPO / "packaging" / name
        assert in_repo.read_bytes() == (REPO / "localllm" / "data" / "service" / packaged
                                        ).read_bytes()


def _env(tmp_path: Path, path: str) -> dict[str, str]:
    return {**os.environ, "PATH": path, "HOME": str(tmp_path / "home"),
            "XDG_CONFIG_HOME": str(tmp_path / "config"),
            "LOCALLLM_DATA_DIR": str(tmp_path / "data")}


@pytest.mark.skipif(sys.platform == "darwin", reason="the systemd path")
@pytest.mark.process
def test_install_and_uninstall_through_systemctl(tmp_path: Path):
    """A recording systemctl on PATH stands in for the user's service manager (the test
    must not start a real service): the unit is written and enabled, then removed."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "calls.txt"
    fake = bin_dir / "systemctl"
    fake.write_text(f"#!/bin/sh\necho \"$@\" >> {calls}\n")
    fake.chmod(0o755)
    env = _env(tmp_path, f"{bin_dir}:/usr/bin:/bin")
    cmd = [sys.executable, "-m", "localllm", "service"]
    done = subprocess.run([*cmd, "install", "--", "--port", "9001"], env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    unit = tmp_path / "config" / "systemd" / "user" / "localllm.service"
    assert "serve --port 9001" in unit.read_text()
    assert "enable-linger" in done.stderr
    assert calls.read_text().splitlines() == ["--user daemon-reload",
                                              "--user enable --now localllm.service"]
    done = subprocess.run([*cmd, "uninstall"], env=env, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    assert not unit.exists()
    assert calls.read_text().splitlines()[-2:] == ["--user disable --now localllm.service",
                                                   "--user daemon-reload"]
    done = subprocess.run([*cmd, "uninstall"], env=env, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 1 and "no service is installed" in done.stderr


@pytest.mark.process
def test_no_service_manager_says_which_it_looked_for(tmp_path: Path):
    empty = tmp_path / "empty"
    empty.mkdir()
    done = subprocess.run([sys.executable, "-m", "localllm", "service", "install"],
                          env=_env(tmp_path, str(empty)), capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 2
    wanted = "launchd (launchctl)" if sys.platform == "darwin" else "systemd (systemctl)"
    assert wanted in done.stderr and "Traceback" not in done.stderr


def test_dockerfile_runs_a_keyed_server_as_a_user_with_a_health_check():
    """Not built here (no registry for base images on this machine): its promises are read
    from it instead."""
    text = (REPO / "packaging" / "docker" / "Dockerfile").read_text()
    final = text.rsplit("\nFROM ", 1)[1]
    assert "\nUSER localllm" in final and "useradd" in final
    assert "LOCALLLM_HOST=0.0.0.0" in final and 'CMD ["serve"]' in final
    assert "HEALTHCHECK" in final and "/health" in final and 'VOLUME ["/data"]' in final
    assert "--no-auth" not in text  # the server refuses to start without a key
