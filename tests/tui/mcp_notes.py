"""A small MCP server over stdio for the chat's tests (tests/tui/test_agent.py), written
with the official SDK: `add` answers the sum, `note` keeps a line. Given a port, it
serves streamable HTTP on it instead."""

from __future__ import annotations

from mcp.server.mcpserver import MCPServer

server = MCPServer("notes")
kept: list[str] = []


@server.tool()
def add(a: int, b: int) -> str:
    """Add two whole numbers."""
    return str(a + b)


@server.tool()
def note(text: str) -> str:
    """Keep a line of text; answers how many are kept."""
    kept.append(text)
    return f"{len(kept)} notes kept"


if __name__ == "__main__":
    import os
    import sys

    if os.environ.get("NOTES_PID_FILE"):  # a test kills it from outside
        with open(os.environ["NOTES_PID_FILE"], "w") as f:
            f.write(str(os.getpid()))

    if len(sys.argv) > 1:  # a port: served over streamable HTTP at /mcp
        server.run(transport="streamable-http", host="127.0.0.1", port=int(sys.argv[1]))
    else:
        server.run()
