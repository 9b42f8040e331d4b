"""Per-conversation settings: system prompt, sampling, answer length, context size, backend."""

from __future__ import annotations

import dataclasses

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Button, Input, Label, TextArea

from localllm.backends.base import SamplingParams
from localllm.config import SPECULATE_MODES
from localllm.history import ConversationSettings
from localllm.models.sampling import Recommended

FIELDS = (
    ("temperature", "Temperature (0 = greedy, up to 2)", float, 0.0, 2.0),
    ("top_p", "Top-p (above 0, up to 1)", float, 1e-9, 1.0),
    ("max_tokens", "Max tokens per answer (blank: until the model stops)", int, 1, 1_000_000),
    ("n_ctx", "Context size in tokens (blank: model default)", int, 16, 1_048_576),
)
BACKENDS = ("auto", "llamacpp", "mlx")
BACKEND_LABEL = "Backend: auto, llamacpp, mlx"


def parse_backend(text: str) -> str | None:
    value = text.strip().lower()
    if not value:
        return None
    if value not in BACKENDS:
        raise ValueError(f"Backend: '{text.strip()}' is not one of {', '.join(BACKENDS)}")
    return value


SPECULATE_LABEL = "Speculation: off, lookup, draft, auto (blank: the app default)"


def parse_speculate(text: str) -> str | None:
    value = text.strip().lower()
    if not value:
        return None
    if value not in SPECULATE_MODES:
        raise ValueError(
            f"Speculative decoding: '{text.strip()}' is not one of {', '.join(SPECULATE_MODES)}"
        )
    return value


THINKING_LABEL = "Thinking: on, off (blank: as the model's template decides)"


def parse_thinking(text: str) -> bool | None:
    value = text.strip().lower()
    if not value:
        return None
    if value in ("on", "yes", "true", "1"):
        return True
    if value in ("off", "no", "false", "0"):
        return False
    raise ValueError(f"Thinking: '{text.strip()}' is not on or off")


def parse_field(name: str, text: str) -> float | int | None:
    """A field's value, or ValueError naming the field and the allowed range."""
    spec = next(f for f in FIELDS if f[0] == name)
    _, label, kind, low, high = spec
    text = text.strip()
    if not text:
        return None
    try:
        value = kind(text)
    except ValueError:
        raise ValueError(f"{label.split(' (')[0]}: '{text}' is not a number") from None
    if not low <= value <= high:
        raise ValueError(f"{label.split(' (')[0]}: {value} is outside {low:g}..{high:g}")
    return value


class SettingsScreen(ModalScreen[ConversationSettings | str | None]):
    """The settings, or "tools" when the user asked for the tools dialog instead."""

    BINDINGS = [Binding("escape", "dismiss(None)", "Cancel")]

    def __init__(
        self, settings: ConversationSettings, recommended: Recommended | None = None
    ) -> None:
        super().__init__()
        self.current = settings
        self.recommended = recommended or Recommended()  # the model's own sampling

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog wide", id="settings"):
            yield Label("Conversation settings", classes="heading")
            # the fields scroll; the buttons below them stay in view on a short terminal
            with VerticalScroll(id="settings-fields"):
                yield Label("System prompt")
                yield TextArea(self.current.system_prompt, id="system_prompt")
                for name, label, *_ in FIELDS:
                    value = getattr(self.current, name)
                    yield Label(label + self.blank_means(name))
                    yield Input("" if value is None else str(value), id=name)
                yield Label(f"{BACKEND_LABEL} · {SPECULATE_LABEL}")
                with Horizontal(classes="pair"):
                    current = self.current
                    yield Input(current.backend or "", placeholder="backend", id="backend")
                    yield Input(
                        current.speculate or "", placeholder="speculative decoding", id="speculate"
                    )
                yield Label(THINKING_LABEL)
                thinking = self.current.thinking
                shown = "" if thinking is None else ("on" if thinking else "off")
                yield Input(shown, placeholder="thinking", id="thinking")
            yield Label("", id="error", classes="error")
            with Horizontal(classes="buttons"):
                yield Button("Save", variant="primary", id="save")
                yield Button("Cancel", id="cancel")
                yield Button("Tools…", id="tools")

    def blank_means(self, name: str) -> str:
        """What a blank sampling field gets, and where that value comes from."""
        rec = self.recommended
        if name in rec.values:
            return f" · blank: {rec.values[name]:g} ({rec.source})"
        if name in ("temperature", "top_p"):
            return f" · blank: {getattr(SamplingParams(), name):g} (localllm's default)"
        return ""

    def on_mount(self) -> None:
        for widget in self.query("Input, TextArea"):
            widget.cursor_blink = False  # type: ignore[attr-defined]

    def on_button_pressed(self, event: Button.Pressed) -> None:
        if event.button.id != "save":
            self.dismiss("tools" if event.button.id == "tools" else None)
            return
        try:
            values: dict[str, float | int | str | None] = {
                name: parse_field(name, self.query_one(f"#{name}", Input).value)
                for name, *_ in FIELDS
            }
            values["backend"] = parse_backend(self.query_one("#backend", Input).value)
            values["speculate"] = parse_speculate(self.query_one("#speculate", Input).value)
            thinking = parse_thinking(self.query_one("#thinking", Input).value)
        except ValueError as exc:
            self.query_one("#error", Label).update(str(exc))
            return
        system = self.query_one("#system_prompt", TextArea).text
        self.dismiss(
            dataclasses.replace(self.current, system_prompt=system, thinking=thinking, **values)  # type: ignore[arg-type]
        )
