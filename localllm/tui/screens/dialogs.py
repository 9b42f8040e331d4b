"""Small dialogs: rename, confirm, and the full-context choice."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Input, Label


class RenameScreen(ModalScreen[str | None]):
    BINDINGS = [Binding("escape", "dismiss(None)", "Cancel")]

    def __init__(self, title: str) -> None:
        super().__init__()
        self._title = title

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog"):
            yield Label("Rename conversation")
            title = Input(self._title, id="title")
            title.cursor_blink = False
            yield title
            with Horizontal(classes="buttons"):
                yield Button("Rename", variant="primary", id="ok")
                yield Button("Cancel", id="cancel")

    def on_input_submitted(self) -> None:
        self.dismiss(self.query_one("#title", Input).value.strip() or None)

    def on_button_pressed(self, event: Button.Pressed) -> None:
        if event.button.id == "ok":
            self.on_input_submitted()
        else:
            self.dismiss(None)


class ConfirmScreen(ModalScreen[bool]):
    BINDINGS = [Binding("escape", "dismiss(False)", "Cancel")]

    def __init__(self, question: str, yes: str = "Delete") -> None:
        super().__init__()
        self._question, self._yes = question, yes

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog"):
            yield Label(self._question)
            with Horizontal(classes="buttons"):
                yield Button(self._yes, variant="error", id="yes")
                yield Button("Cancel", id="no")

    def on_button_pressed(self, event: Button.Pressed) -> None:
        self.dismiss(event.button.id == "yes")


class FullContextScreen(ModalScreen[str]):
    """The next turn does not fit: say so with the numbers and let the user choose."""

    BINDINGS = [Binding("escape", "dismiss('cancel')", "Cancel")]

    def __init__(self, prompt_tokens: int, n_ctx: int) -> None:
        super().__init__()
        self.prompt_tokens, self.n_ctx = prompt_tokens, n_ctx

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog", id="full-context"):
            yield Label("The conversation no longer fits in the context", classes="heading")
            yield Label(
                f"The next turn needs {self.prompt_tokens:,} tokens of prompt; the context "
                f"holds {self.n_ctx:,}. Nothing has been cut."
            )
            with Horizontal(classes="buttons"):
                yield Button("New chat with this prompt", variant="primary", id="new")
                yield Button("Drop oldest turns", variant="warning", id="drop")
                yield Button("Cancel", id="cancel")

    def on_button_pressed(self, event: Button.Pressed) -> None:
        self.dismiss(event.button.id or "cancel")
