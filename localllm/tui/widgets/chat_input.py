"""The prompt box: Enter sends, Ctrl+J inserts a newline, Up recalls earlier prompts,
and a slash command is completed with Tab (the commands it could be show on its
border while it is typed)."""

from __future__ import annotations

from dataclasses import dataclass

from textual import events
from textual.message import Message
from textual.widgets import TextArea

from localllm.tui.commands import COMMANDS, completions

NEWLINE_KEYS = ("ctrl+j", "shift+enter", "alt+enter")


class ChatInput(TextArea):
    @dataclass
    class Submitted(Message):
        text: str

    def __init__(self, *, recall: list[str] | None = None, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.show_line_numbers = False
        self.cursor_blink = False  # a steady cursor: calmer, and screenshots are repeatable
        self.recall = recall or []  # newest first
        self._recall_at = -1

    def on_text_area_changed(self) -> None:
        found = completions(self.text)
        self.border_subtitle = "  ".join(found) + ("  (Tab)" if found else "")
        if self.text.strip() in COMMANDS:
            self.border_subtitle = COMMANDS[self.text.strip()]

    async def on_key(self, event: events.Key) -> None:
        if event.key == "tab" and completions(self.text):
            event.stop()
            event.prevent_default()
            found = completions(self.text)
            done = found[0] + " " if len(found) == 1 else _shared_start(found)
            self.load_text(done)
            self.move_cursor(self.document.end)
            return
        # Textual calls this before the text area's own key handling (a subclass's handler
        # comes first), and prevent_default() keeps that from running. A priority binding
        # would not do: it runs before earlier keys reach the box, so a prompt typed fast
        # and then Enter was sent cut short.
        if event.key == "enter":
            event.stop()
            event.prevent_default()
            text = self.text.strip()
            if text:
                self.post_message(self.Submitted(text))
            return
        if event.key in NEWLINE_KEYS:
            event.stop()
            event.prevent_default()
            self.insert("\n")
            return
        if event.key == "up" and self.cursor_location[0] == 0 and self.recall:
            event.stop()
            event.prevent_default()
            self._recall_at = min(self._recall_at + 1, len(self.recall) - 1)
            self.load_text(self.recall[self._recall_at])
            self.move_cursor((0, 0))
            return
        if (
            event.key == "down"
            and self._recall_at >= 0
            and self.cursor_location[0] == (self.document.line_count - 1)
        ):
            event.stop()
            event.prevent_default()
            self._recall_at -= 1
            self.load_text(self.recall[self._recall_at] if self._recall_at >= 0 else "")
            self.move_cursor(self.document.end)
            return

    def remember(self, text: str) -> None:
        """Put a sent prompt at the front of the recall list and reset the position."""
        if not self.recall or self.recall[0] != text:
            self.recall.insert(0, text)
        self._recall_at = -1


def _shared_start(words: list[str]) -> str:
    """The longest start all `words` share."""
    first = words[0]
    n = 0
    while n < len(first) and all(len(w) > n and w[n] == first[n] for w in words):
        n += 1
    return first[:n]
