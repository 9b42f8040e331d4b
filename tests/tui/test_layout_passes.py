"""A streaming answer grows with each redraw; each growth should cost one layout pass."""

from __future__ import annotations

import pytest
from textual.app import App, ComposeResult
from textual.containers import Vertical, VerticalScroll
from textual.pilot import Pilot
from textual.screen import Screen
from textual.widgets import Markdown

from localllm.tui.widgets.messages import ChatMessage


class Turns(App[None]):
    def compose(self) -> ComposeResult:
        with VerticalScroll():
            yield ChatMessage("assistant", "")
            with Vertical(classes="plain"):  # Textual's own widgets, for comparison
                yield Markdown("")


async def layout_passes_to_grow(
    md: Markdown, monkeypatch: pytest.MonkeyPatch, pilot: Pilot[None]
) -> int:
    """Layout passes while a paragraph already on screen grows by a few lines."""
    await md.append("word " * 30)
    await pilot.pause()
    passes = [0]
    real = Screen._refresh_layout

    def counted(self: Screen, *args: object, **kwargs: object) -> None:
        passes[0] += 1
        real(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(Screen, "_refresh_layout", counted)
    await md.append("word " * 60)
    await pilot.pause()
    await pilot.pause()
    monkeypatch.setattr(Screen, "_refresh_layout", real)
    return passes[0]


async def test_a_growing_answer_takes_one_layout_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    app = Turns()
    async with app.run_test(size=(60, 40)) as pilot:
        ours = app.query_one(ChatMessage).body
        plain = app.query_one(".plain Markdown", Markdown)
        plain_passes = await layout_passes_to_grow(plain, monkeypatch, pilot)
        our_passes = await layout_passes_to_grow(ours, monkeypatch, pilot)
        assert ours.size.height > 1  # it did grow, and was laid out
        assert plain_passes == 2  # Textual lays out again after the paragraph's size changed
        assert our_passes == 1
