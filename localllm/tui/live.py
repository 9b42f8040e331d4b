"""The growing end of a streaming answer, drawn cheaply.

Textual lays out the whole screen (every widget of every turn) whenever a widget's
height changes, and a Markdown answer that is parsed and laid out again for each new
word costs a two-core machine 9-15 ms per redraw, time the model's decode loses. So a
streaming answer is split in two:

- the newest text is plain text in a `LiveText`, whose height is reserved a few lines
  ahead: new words repaint that one widget, and the screen is laid out again only when
  the text outgrows its reserve;
- the finished blocks in it (paragraphs that a blank line closed, code blocks whose
  fence closed) go to the turn's Markdown at that moment, in the same layout, and are
  not touched again. A code block is shown alone in the live text, styled as code, so
  blocks are handed over when one opens and when it closes.

So text becomes Markdown a few lines after its block closes, and all of it when the
answer ends.
"""

from __future__ import annotations

import re

from textual import events
from textual.content import Content
from textual.geometry import Region, Size
from textual.strip import Strip
from textual.widget import Widget

# a fence opens or closes a code block: three or more backticks or tildes, indented
# by at most three spaces (CommonMark)
_FENCE = re.compile(r" {0,3}(`{3,}|~{3,})")


def open_block(text: str) -> tuple[int, bool]:
    """Where the still-open last block of Markdown `text` starts, and whether it is a
    code block. Everything before that index is finished blocks: paragraphs and lists
    closed by a blank line, code blocks closed by their fence."""
    start = 0  # the open block's first character
    fence = ""  # the fence of the code block we are in, if any
    pos = 0
    for line in text.splitlines(keepends=True):
        end = pos + len(line)
        complete = line.endswith(("\n", "\r"))
        match = _FENCE.match(line)
        if fence:
            if (
                complete
                and match
                and match.group(1)[0] == fence[0]
                and len(match.group(1)) >= len(fence)
                and not line[match.end() :].strip()
            ):
                fence = ""
                start = end  # the code block is finished, fence line and all
        elif match and complete and (match.group(1)[0] == "~" or "`" not in line[match.end() :]):
            fence = match.group(1)
            start = pos  # a code block opens here
        elif complete and not line.strip():
            start = end  # a blank line closes the block above it
        pos = end
    return start, bool(fence)


def shown_text(block: str, code: bool) -> str:
    """The open block as `LiveText` shows it: a code block without its opening fence."""
    if code:
        block = block.split("\n", 1)[1] if "\n" in block else ""
    return block.rstrip("\n")


class LiveText(Widget):
    """Plain text whose height is reserved `SLACK` lines ahead of what it needs.

    An update that still fits repaints only the lines that changed (usually the last
    one: Textual's line API, `render_line`); one that does not fit reserves again, which
    lays the screen out. The reserve is blank space under the text while it streams, into
    which the next words are written.
    """

    DEFAULT_CSS = "LiveText { height: auto; }"
    SLACK = 8

    def __init__(self, *, classes: str = "") -> None:
        super().__init__(classes=f"live {classes}".strip())
        self.text = ""
        # lines reserved: from the start, so that the first words need no layout
        self.reserved = 1 + self.SLACK
        self.styles.height = self.reserved
        self.layouts = 0  # how many updates needed a layout of the screen (for tests)
        self._rows: list[Content] = []  # the text wrapped to the width, one per line
        self._strips: dict[int, Strip] = {}  # rendered lines, until they change
        self._wrapped: tuple[str, int, list[Content]] = ("", 0, [])  # text, width, rows
        self._outer_width = 0  # from the last resize: asking for a widget's size after a
        # layout makes Textual map the whole screen again, a redraw's worth of work

    def _width(self) -> int:
        return self._outer_width - self.styles.gutter.width

    def _wrap(self, text: str) -> list[Content]:
        """`text` wrapped to the width the widget was laid out with ([]: not yet)."""
        width = self._width()
        if width <= 0:
            return []
        if self._wrapped[:2] != (text, width):  # asked twice per redraw: wrap once
            self._wrapped = (text, width, Content(text).wrap(width))
        return self._wrapped[2]

    def on_resize(self, event: events.Resize) -> None:
        self._outer_width = event.size.width
        self._rows = self._wrap(self.text)
        self._strips.clear()
        self.refresh()

    def get_content_height(self, container: Size, viewport: Size, width: int) -> int:
        return len(Content(self.text).wrap(width)) if self.text and width > 0 else 0

    def fits(self, text: str) -> bool:
        """Whether `text` fits the reserved lines (showing it needs no layout)."""
        return 0 < len(self._wrap(text.rstrip("\n"))) <= self.reserved

    def show(self, text: str, *, code: bool = False) -> None:
        """Show `text` (plain; `code`: styled as a code block)."""
        if text == self.text and self.has_class("code") == code:
            return
        self.text = text
        rows = self._wrap(text)
        if self.has_class("code") == code and 0 < len(rows) <= self.reserved:
            old = self._rows
            first = next(
                (i for i, (a, b) in enumerate(zip(old, rows, strict=False)) if a.plain != b.plain),
                min(len(old), len(rows)),
            )
            self._rows = rows
            for y in range(first, max(len(old), len(rows))):
                self._strips.pop(y, None)
            changed = max(len(old), len(rows)) - first
            if changed:  # repaint those lines only: no layout
                self.refresh(Region(0, first, self._outer_width, changed))
            return
        self.set_class(code, "code")
        self._rows = rows
        self._strips.clear()
        self.reserved = max(len(rows), 1) + self.SLACK
        self.styles.height = self.reserved
        self.layouts += 1
        self.refresh(layout=True)

    def render_line(self, y: int) -> Strip:
        strip = self._strips.get(y)
        if strip is None:
            segments = (
                self._rows[y].render_segments(self.visual_style) if y < len(self._rows) else []
            )
            strip = Strip(segments).extend_cell_length(max(self._width(), 0), self.rich_style)
            self._strips[y] = strip
        return strip

    def fit(self) -> None:
        """Drop the reserve: as tall as the text (the answer has ended)."""
        self.styles.height = "auto"
        self.reserved = 0
