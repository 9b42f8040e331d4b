"""A streaming answer's redraws: new words repaint the live text, and the screen is laid
out again only when the text outgrows its reserve (finished blocks become Markdown then).
Layout passes are counted with the screen's public layout signal."""

from __future__ import annotations

from textual.app import App, ComposeResult
from textual.containers import VerticalScroll
from textual.pilot import Pilot
from textual.widgets import Markdown

from localllm.tui.live import LiveText
from localllm.tui.widgets.messages import ChatMessage

STORY = (
    "The keeper climbed the stairs every night and lit the lamp while the sea roared "
    "below the rocks and gulls slept on the ledges of the old tower. "
)


class Turns(App[None]):
    CSS_PATH = "../../localllm/tui/app.tcss"

    def compose(self) -> ComposeResult:
        with VerticalScroll():
            yield ChatMessage("assistant", "")


async def streamed(pilot: Pilot[None], turn: ChatMessage, pieces: list[str]) -> list[int]:
    """Stream `pieces` into `turn`, one redraw each; the layout passes each one caused."""
    passes: list[int] = []
    count = [0]

    def laid_out(_screen: object) -> None:
        count[0] += 1

    pilot.app.screen.screen_layout_refresh_signal.subscribe(turn, laid_out)
    for piece in pieces:
        before = count[0]
        await turn.add_text(piece)
        await pilot.pause()
        await pilot.pause()
        passes.append(count[0] - before)
    pilot.app.screen.screen_layout_refresh_signal.unsubscribe(turn)
    return passes


def words(text: str, size: int = 4) -> list[str]:
    parts = text.split(" ")
    return [" ".join(parts[i:i + size]) + " " for i in range(0, len(parts), size)]


async def test_new_words_repaint_without_a_layout() -> None:
    app = Turns()
    async with app.run_test(size=(80, 40)) as pilot:
        turn = app.query_one(ChatMessage)
        await turn.start_answer()
        await pilot.pause()
        pieces = words(STORY * 3)  # about 6 lines at this width: within the reserve
        passes = await streamed(pilot, turn, pieces)
        live = turn.live
        assert sum(passes) == 0, passes  # every redraw was a repaint only
        assert live.layouts == 0 and live.text == "".join(pieces).rstrip("\n")
        # what the screen shows is the text: its last line holds the newest words
        shown = [live.render_line(y).text.rstrip() for y in range(live.reserved)]
        assert shown[0].startswith("The keeper climbed")
        assert pieces[-1].strip() in " ".join(shown)


async def test_outgrowing_the_reserve_hands_finished_blocks_to_the_markdown() -> None:
    app = Turns()
    async with app.run_test(size=(80, 40)) as pilot:
        turn = app.query_one(ChatMessage)
        await turn.start_answer()
        await pilot.pause()
        text = (STORY * 3 + "\n\n") * 3 + STORY * 2
        pieces = words(text)
        text = "".join(pieces)
        passes = await streamed(pilot, turn, pieces)
        live = turn.live
        laid_out = sum(1 for p in passes if p)
        assert laid_out >= 1  # the text outgrew the reserve: blocks went to the Markdown
        assert laid_out <= len(pieces) // 4, passes  # most redraws took no layout
        source = turn.body.source
        assert source and text.startswith(source) and source.endswith("\n\n")
        assert source + live.text == text.rstrip("\n")  # nothing lost, nothing twice
        await turn.end_answer()
        await pilot.pause()
        assert turn.body.source == text and not turn.query(LiveText)


async def test_a_code_block_streams_as_code_then_becomes_markdown() -> None:
    app = Turns()
    async with app.run_test(size=(80, 40)) as pilot:
        turn = app.query_one(ChatMessage)
        await turn.start_answer()
        await pilot.pause()
        await streamed(pilot, turn, ["Here:\n\n```python\n", "print(1)\n", "x = 2\n"])
        live = turn.live
        assert live.has_class("code") and live.text == "print(1)\nx = 2"
        assert turn.body.source == "Here:\n\n"  # handed over when the code block opened
        await streamed(pilot, turn, ["```\n\nDone."])
        assert not live.has_class("code") and live.text == "Done."
        assert turn.body.source.endswith("x = 2\n```\n\n")
        await turn.end_answer()
        await pilot.pause()
        fences = [b for b in turn.body.children if type(b).__name__ == "MarkdownFence"]
        assert len(fences) == 1 and "x = 2" in fences[0].code  # type: ignore[attr-defined]


async def test_a_stored_answer_is_markdown_from_the_start() -> None:
    class Stored(App[None]):
        def compose(self) -> ComposeResult:
            yield ChatMessage("assistant", "**Bold** and\n\n- a\n- b\n")

    app = Stored()
    async with app.run_test(size=(80, 20)):
        turn = app.query_one(ChatMessage)
        assert isinstance(turn.body, Markdown) and not turn.query(LiveText)
        assert turn.body.source == "**Bold** and\n\n- a\n- b\n"
