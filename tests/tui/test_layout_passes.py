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


async def layout_passes(
    md: Markdown, text: str, monkeypatch: pytest.MonkeyPatch, pilot: Pilot[None]
) -> int:
    """Layout passes of the screen from appending `text` until all is settled."""
    passes = [0]
    real = Screen._refresh_layout

    def counted(self: Screen, *args: object, **kwargs: object) -> None:
        passes[0] += 1
        real(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(Screen, "_refresh_layout", counted)
    await md.append(text)
    for _ in range(3):
        await pilot.pause()
    monkeypatch.setattr(Screen, "_refresh_layout", real)
    return passes[0]


async def layout_passes_to_grow(
    md: Markdown, monkeypatch: pytest.MonkeyPatch, pilot: Pilot[None]
) -> int:
    """Layout passes while a paragraph already on screen grows by a few lines."""
    await md.append("word " * 30)
    await pilot.pause()
    return await layout_passes(md, "word " * 60, monkeypatch, pilot)


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


async def test_new_blocks_in_an_answer_take_one_layout_pass(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The first words of an answer mount its first paragraph; a blank line and more words
    finish that paragraph and mount the next. Textual's Markdown lays the screen out again
    for late requests from the mount (twice each, here); a chat turn once."""
    app = Turns()
    async with app.run_test(size=(60, 40)) as pilot:
        ours = app.query_one(ChatMessage).body
        plain = app.query_one(".plain Markdown", Markdown)
        counts = {}
        for name, md in (("plain", plain), ("ours", ours)):
            first = await layout_passes(md, "Once upon", monkeypatch, pilot)
            await md.append(" a time " * 10)
            await pilot.pause()
            second = await layout_passes(md, "there.\n\nThe keeper", monkeypatch, pilot)
            counts[name] = (first, second)
        assert len(ours.children) == 2  # two paragraphs, both mounted and laid out
        assert all(block.size.height >= 1 for block in ours.children)
        assert max(counts["plain"]) >= 2
        assert counts["ours"] == (1, 1)


@pytest.mark.parametrize(
    ("answer", "block"),
    [("Once upon a time", "MarkdownParagraph"), ("```python\nprint(1)\n```\n", "MarkdownFence")],
)
async def test_an_answer_streams_into_its_open_paragraph(answer: str, block: str) -> None:
    """The answer's first paragraph is mounted before it streams; an answer that starts with
    another kind of block replaces it."""
    app = Turns()
    async with app.run_test(size=(60, 40)) as pilot:
        body = app.query_one(ChatMessage).body
        await body.open_paragraph()
        opened = list(body.children)
        assert [type(b).__name__ for b in opened] == ["MarkdownParagraph"]
        await body.append(answer[:5])
        await body.append(answer[5:])
        await pilot.pause()
        assert [type(b).__name__ for b in body.children] == [block]
        assert (body.children[0] is opened[0]) == (block == "MarkdownParagraph")  # updated
        assert body.source == answer
        first = body.children[0]
        shown = str(first.render()) if block == "MarkdownParagraph" else first.code  # type: ignore[attr-defined]
        assert ("Once upon a time" if block == "MarkdownParagraph" else "print(1)") in shown


async def test_a_redraw_that_keeps_the_height_takes_no_layout_pass(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The first words of an answer fill its open (one line) paragraph, and more words on
    the same line keep its height: the paragraph is repainted, the screen is not laid out
    again (Textual's Markdown lays it out for each). Growing by a line still lays it out."""
    app = Turns()
    async with app.run_test(size=(60, 40)) as pilot:
        ours = app.query_one(ChatMessage).body
        plain = app.query_one(".plain Markdown", Markdown)
        await ours.open_paragraph()
        await plain.append("Once")
        await pilot.pause()
        first = await layout_passes(ours, "Once", monkeypatch, pilot)
        same = {
            name: await layout_passes(md, " upon a time", monkeypatch, pilot)
            for name, md in (("plain", plain), ("ours", ours))
        }
        paragraph = ours.children[0]
        assert str(paragraph.render()) == "Once upon a time"  # the new text is on screen
        assert paragraph.size.height == 1
        grown = await layout_passes(ours, " there lived a keeper" * 4, monkeypatch, pilot)
        assert paragraph.size.height == 2  # one line more, laid out
        assert "keeper there lived" in str(paragraph.render())
        assert (first, same["ours"], grown) == (0, 0, 1)
        assert same["plain"] == 1
