"""`localllm service install|uninstall|status|logs`: the endpoint as a user service.

Linux: a systemd user unit (~/.config/systemd/user/localllm.service), no root needed.
macOS: a launchd LaunchAgent (~/Library/LaunchAgents/dev.localllm.serve.plist), logs in
~/Library/Logs/localllm/. The templates are package data (localllm/data/service/), also
reachable as packaging/systemd/ and packaging/launchd/ in the repository.
"""

from __future__ import annotations

import argparse
import os
import plistlib
import shlex
import shutil
import subprocess
import sys
from importlib import resources
from pathlib import Path
from typing import Any

from localllm.cli.common import EXIT_USAGE
from localllm.config import Settings
from localllm.fsguard import write_user_file

UNIT = "localllm.service"
LABEL = "dev.localllm.serve"


def add_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    service = sub.add_parser(
        "service", parents=[common], help="run the endpoint as a user service (systemd, launchd)"
    )
    actions = service.add_subparsers(dest="service_command", metavar="ACTION", required=True)
    install = actions.add_parser("install", help="write, enable and start the service")
    install.add_argument(
        "--print", action="store_true", help="print the unit / plist and change nothing"
    )
    install.add_argument(
        "serve_args",
        nargs=argparse.REMAINDER,
        help="after --: flags for `localllm serve` (e.g. -- --port 9000 --model NAME)",
    )
    actions.add_parser("uninstall", help="stop, disable and remove the service")
    actions.add_parser("status", help="whether the service runs")
    logs = actions.add_parser("logs", help="the service's log")
    logs.add_argument("-f", "--follow", action="store_true", help="keep printing new lines")
    logs.add_argument("-n", "--lines", type=int, default=100, help="lines to show (default 100)")
    service.set_defaults(run=run)


def serve_command(extra: list[str]) -> list[str]:
    """The command the service runs: this interpreter, so pipx, uv and venv installs work."""
    extra = extra[1:] if extra[:1] == ["--"] else extra
    return [sys.executable, "-m", "localllm", "serve", *extra]


def _template(name: str) -> str:
    return (resources.files("localllm") / "data" / "service" / name).read_text("utf-8")


def render_systemd(command: list[str]) -> str:
    return _template(UNIT).replace("{command}", shlex.join(command))


def render_launchd(command: list[str], log_dir: Path) -> bytes:
    plist = plistlib.loads(_template(LABEL + ".plist").encode())
    plist["ProgramArguments"] = command
    for key in ("StandardOutPath", "StandardErrorPath"):
        plist[key] = plist[key].replace("{log_dir}", str(log_dir))
    return plistlib.dumps(plist)


def _manager() -> str | None:
    if sys.platform == "darwin":
        return "launchd" if shutil.which("launchctl") else None
    return "systemd" if shutil.which("systemctl") else None


def _systemd_dir() -> Path:
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "systemd" / "user"


def _launchd_paths() -> tuple[Path, Path]:
    home = Path.home()
    return (
        home / "Library" / "LaunchAgents" / f"{LABEL}.plist",
        home / "Library" / "Logs" / "localllm",
    )


def _run(*cmd: str) -> int:
    return subprocess.run(cmd, check=False).returncode


def run(settings: Settings, args: argparse.Namespace) -> int:
    action = args.service_command
    command = serve_command(getattr(args, "serve_args", None) or [])
    if action == "install" and args.print:
        if sys.platform == "darwin":
            sys.stdout.write(render_launchd(command, _launchd_paths()[1]).decode())
        else:
            sys.stdout.write(render_systemd(command))
        return 0
    manager = _manager()
    if manager is None:
        looked = "launchd (launchctl)" if sys.platform == "darwin" else "systemd (systemctl)"
        sys.stderr.write(
            f"localllm: error: a user service needs {looked}, and it is not on this system; "
            "run `localllm serve` under your own supervisor instead (`localllm service "
            "install --print` shows the unit)\n"
        )
        return EXIT_USAGE
    if manager == "systemd":
        return _systemd(action, command, args)
    return _launchd(action, command, args)


def _systemd(action: str, command: list[str], args: argparse.Namespace) -> int:
    path = _systemd_dir() / UNIT
    ctl = ("systemctl", "--user")
    if action == "install":
        write_user_file(path, render_systemd(command), backup=False)
        rc = _run(*ctl, "daemon-reload") or _run(*ctl, "enable", "--now", UNIT)
        if rc == 0:
            user = os.environ.get("USER", "$USER")
            sys.stderr.write(
                f"Installed {path} and started it. It starts with your session; to start it "
                f"at boot without a login: loginctl enable-linger {user}\n"
            )
        return rc
    if action == "uninstall":
        if not path.exists():
            sys.stderr.write(f"localllm: error: no service is installed ({path} does not exist)\n")
            return 1
        _run(*ctl, "disable", "--now", UNIT)
        path.unlink()
        _run(*ctl, "daemon-reload")
        sys.stderr.write(f"Stopped, disabled and removed {path}.\n")
        return 0
    if action == "status":
        return _run(*ctl, "status", "--no-pager", UNIT)
    follow = ["-f"] if args.follow else []
    return _run("journalctl", "--user", "-u", UNIT, "-n", str(args.lines), "--no-pager", *follow)


def _launchd(action: str, command: list[str], args: argparse.Namespace) -> int:
    path, log_dir = _launchd_paths()
    domain = f"gui/{os.getuid()}"
    if action == "install":
        log_dir.mkdir(parents=True, exist_ok=True)
        write_user_file(path, render_launchd(command, log_dir), backup=False)
        _run("launchctl", "bootout", f"{domain}/{LABEL}")  # an older copy, if loaded
        rc = _run("launchctl", "bootstrap", domain, str(path))
        if rc == 0:
            sys.stderr.write(f"Installed {path} and started it; logs in {log_dir}.\n")
        return rc
    if action == "uninstall":
        if not path.exists():
            sys.stderr.write(f"localllm: error: no service is installed ({path} does not exist)\n")
            return 1
        _run("launchctl", "bootout", f"{domain}/{LABEL}")
        path.unlink()
        sys.stderr.write(f"Stopped and removed {path}.\n")
        return 0
    if action == "status":
        return _run("launchctl", "print", f"{domain}/{LABEL}")
    log = log_dir / "localllm.log"
    if not log.exists():
        sys.stderr.write(f"localllm: error: no log yet at {log}\n")
        return 1
    return _run("tail", "-n", str(args.lines), *(["-F"] if args.follow else []), str(log))
