"""`localllm mcp import|list|rm`: the MCP servers whose tools the chat may offer.

Servers are [[mcp_servers]] tables in the config file. `import` reads the JSON other
hosts keep (Claude Desktop's and Cursor's `mcpServers`, VS Code's `servers`, Cline's
`disabled`) and adds what it can serve: stdio commands and streamable-HTTP URLs; an SSE
server is skipped, with the reason. `list` starts each enabled server and says whether
it answers and which tools it has."""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from pathlib import Path
from typing import Any

from localllm.cli.common import EXIT_USAGE, drop_table, write_config
from localllm.config import McpServer, Settings, config_path


def add_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    mcp = sub.add_parser(
        "mcp", parents=[common], help="MCP servers for the chat's tools (import, list, rm)"
    )
    actions = mcp.add_subparsers(dest="mcp_command", metavar="ACTION", required=True)
    imp = actions.add_parser(
        "import", help="add the servers of a Claude Desktop, Cursor or VS Code JSON file"
    )
    imp.add_argument("file", type=Path, help="e.g. claude_desktop_config.json or .vscode/mcp.json")
    imp.add_argument("--replace", action="store_true", help="replace servers of the same name")
    listing = actions.add_parser("list", help="the servers, whether they start, their tools")
    listing.add_argument("--json", action="store_true", help="machine-readable output")
    rm = actions.add_parser("rm", help="forget a server")
    rm.add_argument("name")
    mcp.set_defaults(run=run)


def run(settings: Settings, args: argparse.Namespace) -> int:
    path = config_path(os.environ)
    if args.mcp_command == "import":
        return _import(settings, args.file, path, replace=args.replace)
    if args.mcp_command == "rm":
        if not write_config(path, lambda doc: drop_table(doc, "mcp_servers", args.name)):
            known = ", ".join(s.name for s in settings.mcp_servers) or "none"
            sys.stderr.write(
                f"localllm: error: no MCP server named '{args.name}' in {path} (servers: {known})\n"
            )
            return EXIT_USAGE
        sys.stderr.write(f"Removed the MCP server '{args.name}'.\n")
        return 0
    return _list(settings, as_json=args.json)


def servers_in(data: Any) -> tuple[list[McpServer], list[str]]:
    """The servers a host's JSON declares, and a line for each one skipped."""
    if not isinstance(data, dict):
        raise ValueError("the file holds no JSON object")
    table = data.get("mcpServers", data.get("servers"))
    if not isinstance(table, dict):
        raise ValueError(
            'it has no "mcpServers" (Claude Desktop, Cursor) or "servers" (VS Code) object'
        )
    found, skipped = [], []
    for raw_name, spec in table.items():
        name = re.sub(r"[^A-Za-z0-9_-]", "-", str(raw_name)).strip("-") or "server"
        if not isinstance(spec, dict):
            skipped.append(f"{raw_name}: not an object")
            continue
        kind = str(spec.get("type", spec.get("transport", ""))).lower()
        enabled = not spec.get("disabled", False)
        env = {str(k): str(v) for k, v in (spec.get("env") or {}).items()}
        if kind == "sse":
            skipped.append(f"{raw_name}: an SSE server (localllm speaks streamable HTTP)")
        elif spec.get("command"):
            args = tuple(str(a) for a in spec.get("args") or ())
            found.append(
                McpServer(name, command=str(spec["command"]), args=args, env=env, enabled=enabled)
            )
        elif spec.get("url") or spec.get("serverUrl"):
            url = str(spec.get("url") or spec.get("serverUrl"))
            found.append(McpServer(name, url=url, enabled=enabled))
        else:
            skipped.append(f"{raw_name}: neither a command nor a url")
    return found, skipped


def _import(settings: Settings, file: Path, path: Path, *, replace: bool) -> int:
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
        found, skipped = servers_in(data)
    except OSError as exc:
        sys.stderr.write(f"localllm: error: cannot read {file}: {exc.strerror}\n")
        return EXIT_USAGE
    except ValueError as exc:  # JSONDecodeError included
        sys.stderr.write(f"localllm: error: {file}: {exc}\n")
        return EXIT_USAGE
    have = {s.name for s in settings.mcp_servers}
    taken = [s for s in found if s.name in have and not replace]
    for s in taken:
        skipped.append(f"{s.name}: a server of that name exists (--replace replaces it)")
    added = [s for s in found if s not in taken]

    def change(doc: Any) -> None:
        for server in added:
            drop_table(doc, "mcp_servers", server.name)
            _append(doc, server)

    if added:
        write_config(path, change)
    for line in skipped:
        sys.stderr.write(f"skipped {line}\n")
    names = ", ".join(s.name + ("" if s.enabled else " (disabled)") for s in added) or "none"
    sys.stderr.write(
        f"Imported {len(added)} MCP server(s) into {path}: {names}\n"
        "Turn their tools on per conversation in the chat (Ctrl+T).\n"
    )
    return 0 if added or not found else 1


def _append(doc: Any, server: McpServer) -> None:
    import tomlkit

    table = tomlkit.table()
    table["name"] = server.name
    if server.command is not None:
        table["command"] = server.command
        if server.args:
            table["args"] = list(server.args)
    if server.url is not None:
        table["url"] = server.url
    if server.env:
        table["env"] = dict(server.env)
    if not server.enabled:
        table["enabled"] = False
    if "mcp_servers" not in doc:
        doc["mcp_servers"] = tomlkit.aot()
    doc["mcp_servers"].append(table)


def _list(settings: Settings, *, as_json: bool) -> int:
    from localllm.agent.mcp_host import McpHost

    host = McpHost(settings.mcp_servers, log_file=settings.data_dir / "logs" / "mcp.log")
    host.start()
    try:
        host.wait_ready()
        states = host.states()
        tools = host.tools()
    finally:
        host.close()
    records: list[dict[str, Any]] = [
        {
            "name": s.name,
            "transport": "http" if s.url else "stdio",
            "target": s.url or " ".join([s.command or "", *s.args]),
            "enabled": s.enabled,
            "state": states.get(s.name, "disabled"),
            "tools": [t.name for t in tools if t.source == s.name],
        }
        for s in settings.mcp_servers
    ]
    if as_json:
        sys.stdout.write(json.dumps(records, indent=2) + "\n")
        return 0
    if not records:
        print("No MCP servers. Import some: localllm mcp import claude_desktop_config.json")
        return 0
    from localllm.cli.common import print_table

    rows = [("NAME", "TRANSPORT", "STATE", "TOOLS", "COMMAND OR URL")]
    for s in settings.mcp_servers:
        names = ", ".join(t.name for t in tools if t.source == s.name) or "-"
        target = s.url or " ".join([s.command or "", *s.args])
        state = states.get(s.name, "disabled")
        rows.append((s.name, "http" if s.url else "stdio", state, names, target))
    print_table(rows)
    return 0
