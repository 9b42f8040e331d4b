"""The dialogs of the chat's tools: approving one call, and choosing a conversation's
tools (F4's "Tools…", /tools, Ctrl+T)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Button, Input, Label, SelectionList, Static
from textual.widgets.selection_list import Selection

from localllm.agent.session import Decision
from localllm.agent.tool import Preview
from localllm.config import BUILTIN_TOOLS, MAX_AGENT_STEPS

TOOL_HELP = {
    "read_file": "read a file",
    "list_folder": "list a folder",
    "search_files": "search files for a pattern",
    "edit_file": "edit or create a file (each edit shown as a diff)",
    "run_command": "run a shell command (shown before it runs, stopped after 30 s)",
}


class ApprovalScreen(ModalScreen[Decision]):
    """One tool call, shown whole, and the user's answer: once, for the conversation,
    deny (the model is told), or Esc: deny and stop the turn."""

    BINDINGS = [
        Binding("a", "decide('once')", "Allow once"),
        Binding("c", "decide('always')", "Allow for this conversation"),
        Binding("d", "decide('deny')", "Deny"),
        Binding("escape", "decide('stop')", "Stop"),
    ]

    def __init__(self, tool: str, source: str, preview: Preview) -> None:
        super().__init__()
        self.tool, self.source, self.preview = tool, source, preview

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog wide", id="approval"):
            origin = "" if self.source == "built-in" else f" (MCP server {self.source})"
            yield Label(f"The model wants to call {self.tool}{origin}", classes="heading")
            with VerticalScroll(id="call-preview"):
                yield Static(
                    self.preview.text or "(no arguments)",
                    markup=False,
                    classes=f"preview {self.preview.language or ''}",
                )
            with Horizontal(classes="buttons"):
                yield Button("Allow once (a)", variant="primary", id="once")
                yield Button("Allow for this conversation (c)", variant="warning", id="always")
                yield Button("Deny (d)", variant="error", id="deny")
            yield Label("Esc denies and stops the turn.", classes="hint")

    def on_mount(self) -> None:
        self.query_one("#once", Button).focus()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        self.action_decide(event.button.id or "deny")

    def action_decide(self, decision: str) -> None:
        self.dismiss(decision)  # type: ignore[arg-type]


@dataclass(frozen=True, slots=True)
class ToolChoices:
    tools: tuple[str, ...]  # built-in names, and "mcp:NAME" for a server's tools
    folder: str
    steps: int


class ToolsScreen(ModalScreen[ToolChoices | None]):
    """Which tools this conversation's model may call (each call still asks first), the
    folder they work in, and how many tool steps an answer may take."""

    BINDINGS = [Binding("escape", "dismiss(None)", "Cancel")]

    def __init__(self, current: ToolChoices, servers: dict[str, str]) -> None:
        super().__init__()
        self.current = current
        self.servers = servers  # MCP server name -> its state

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog wide", id="tools"):
            yield Label("Tools for this conversation (every call asks first)", classes="heading")
            rows = [
                Selection(f"{name}: {TOOL_HELP[name]}", name, name in self.current.tools)
                for name in BUILTIN_TOOLS
            ]
            rows += [
                Selection(
                    f"MCP {name}: {state}", f"mcp:{name}", f"mcp:{name}" in self.current.tools
                )
                for name, state in self.servers.items()
            ]
            yield SelectionList[str](*rows, id="tool-list")
            yield Label(
                "Folder the file and shell tools work in · tool steps per answer "
                f"(1 to {MAX_AGENT_STEPS})"
            )
            with Horizontal(classes="pair"):
                yield Input(self.current.folder, id="folder")
                yield Input(str(self.current.steps), id="steps")
            yield Label("", id="error", classes="error")
            with Horizontal(classes="buttons"):
                yield Button("Save", variant="primary", id="save")
                yield Button("Cancel", id="cancel")

    def on_mount(self) -> None:
        for widget in self.query(Input):
            widget.cursor_blink = False

    def on_button_pressed(self, event: Button.Pressed) -> None:
        if event.button.id != "save":
            self.dismiss(None)
            return
        steps_text = self.query_one("#steps", Input).value.strip()
        try:
            steps = int(steps_text)
        except ValueError:
            steps = 0
        if not 1 <= steps <= MAX_AGENT_STEPS:
            self.query_one("#error", Label).update(
                f"Tool steps: '{steps_text}' is not a whole number from 1 to {MAX_AGENT_STEPS}"
            )
            return
        folder = self.query_one("#folder", Input).value.strip()
        if not folder or not Path(folder).expanduser().is_dir():
            self.query_one("#error", Label).update(f"Folder: '{folder}' is not a folder")
            return
        chosen = self.query_one("#tool-list", SelectionList).selected
        self.dismiss(ToolChoices(tuple(str(c) for c in chosen), folder, steps))
