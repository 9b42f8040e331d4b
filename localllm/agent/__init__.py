"""The chat's tools: built-in file and shell tools (builtin.py) confined to one folder
(workspace.py), MCP servers' tools (mcp_host.py), and one conversation's approvals and
calls (session.py). The loop that runs them between answers is the chat's
(tui/agent_turns.py)."""
