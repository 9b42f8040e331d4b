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
from localllm.fsguard import PathRefused, read_user_file


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


MAX_FILE_BYTES = 16 << 20  # a host's MCP file larger than this is refused
SHOWN = 20  # servers named in the import's summary
MAX_JSON_DEPTH = 64  # servers sit at depth 3; deeper nesting is refused before parsing
_JSON_STRING = re.compile(r'"(?:[^"\\]|\\.)*"')


def json_depth(text: str) -> int:
    """How deep the JSON text's arrays and objects nest (strings skipped): linear, and
    without the recursion json.loads would need to find out."""
    depth = deepest = 0
    for m in re.finditer(r"[\[\]{}]", _JSON_STRING.sub('""', text)):
        depth += 1 if m.group() in "[{" else -1
        deepest = max(deepest, depth)
    return deepest


def _clean(raw_name: Any) -> str:
    return re.sub(r"[^A-Za-z0-9_-]", "-", str(raw_name)).strip("-") or "server"


def servers_in(data: Any) -> tuple[list[McpServer], list[str]]:
    """The servers a host's JSON declares, and a line for each one skipped (two names
    that would be stored as one are both skipped, by name)."""
    if not isinstance(data, dict):
        raise ValueError("the file holds no JSON object")
    table = data.get("mcpServers", data.get("servers"))
    if not isinstance(table, dict):
        raise ValueError(
            'it has no "mcpServers" (Claude Desktop, Cursor) or "servers" (VS Code) object'
        )
    by_name: dict[str, list[str]] = {}
    for raw_name in table:
        by_name.setdefault(_clean(raw_name), []).append(str(raw_name))
    found, skipped = [], []
    for raw_name, spec in table.items():
        name = _clean(raw_name)
        if len(by_name[name]) > 1:
            others = " and ".join(repr(n) for n in by_name[name])
            skipped.append(f"{raw_name}: {others} would both be named '{name}'; rename one")
            continue
        if not isinstance(spec, dict):
            skipped.append(f"{raw_name}: not an object")
            continue
        kind = str(spec.get("type", spec.get("transport", ""))).lower()
        enabled = not spec.get("disabled", False)
        env_spec = spec.get("env") or {}
        if not isinstance(env_spec, dict):
            skipped.append(f"{raw_name}: its env is not an object")
            continue
        env = {str(k): str(v) for k, v in env_spec.items()}
        if kind == "sse":
            skipped.append(f"{raw_name}: an SSE server (localllm speaks streamable HTTP)")
        elif spec.get("command"):
            raw_args = spec.get("args") or ()
            if not isinstance(raw_args, list | tuple):
                skipped.append(f"{raw_name}: its args is not a list")
                continue
            args = tuple(str(a) for a in raw_args)
            found.append(
                McpServer(name, command=str(spec["command"]), args=args, env=env, enabled=enabled)
            )
        elif spec.get("url") or spec.get("serverUrl"):
            url = str(spec.get("url") or spec.get("serverUrl"))
            found.append(McpServer(name, url=url, enabled=enabled))
        else:
            skipped.append(f"{raw_name}: neither a command nor a url")
    return found, skipped


def _read_hosts_file(file: Path) -> Any:
    """The JSON of a host's file; ValueError (or PathRefused) saying why not."""
    text = read_user_file(file, limit=MAX_FILE_BYTES)
    if text is None:
        raise PathRefused(f"{file}: it does not exist")
    depth = json_depth(text)
    if depth > MAX_JSON_DEPTH:
        raise ValueError(
            f"it nests {depth:,} levels deep; a host's file needs 3, and at most "
            f"{MAX_JSON_DEPTH} are read"
        )
    return json.loads(text)


def _import(settings: Settings, file: Path, path: Path, *, replace: bool) -> int:
    try:
        found, skipped = servers_in(_read_hosts_file(file))
    except ValueError as exc:  # JSONDecodeError included
        sys.stderr.write(f"localllm: error: {file}: {exc}\n")
        return EXIT_USAGE
    have = {s.name for s in settings.mcp_servers}
    taken = [s for s in found if s.name in have and not replace]
    for s in taken:
        skipped.append(f"{s.name}: a server of that name exists (--replace replaces it)")
    added = [s for s in found if s not in taken]

    def change(doc: Any) -> None:
        import tomlkit

        names = {s.name for s in added}
        tables = doc.get("mcp_servers")
        keep = [t for t in tables if t.get("name") not in names] if tables is not None else []
        doc["mcp_servers"] = tomlkit.aot()  # rebuilt once: linear in the servers
        for t in keep:
            doc["mcp_servers"].append(t)
        for server in added:
            _append(doc, server)

    if added:
        write_config(path, change)
    for line in skipped[:SHOWN]:
        sys.stderr.write(f"skipped {line}\n")
    if len(skipped) > SHOWN:
        sys.stderr.write(f"skipped {len(skipped) - SHOWN:,} more\n")
    shown = [s.name + ("" if s.enabled else " (disabled)") for s in added[:SHOWN]]
    more = f" and {len(added) - SHOWN:,} more" if len(added) > SHOWN else ""
    names = (", ".join(shown) or "none") + more
    sys.stderr.write(
        f"Imported {len(added):,} MCP server(s) into {path}: {names}\n"
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
