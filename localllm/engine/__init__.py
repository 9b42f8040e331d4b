"""The runtime every client (CLI, endpoint, TUI) shares."""
