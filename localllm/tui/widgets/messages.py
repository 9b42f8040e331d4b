"""One chat turn on screen: a role label, Markdown content, and a statistics line."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from markdown_it.token import Token
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.content import Content
from textual.geometry import Region, Size
from textual.widget import AwaitMount
from textual.widgets import Collapsible, Markdown, Static
from textual.widgets.markdown import MarkdownBlock

from localllm.backends import reasoning

if TYPE_CHECKING:
    from typing_extensions import Self


def stats_line(stats: dict[str, Any] | None) -> str:
    """'12 tokens · 95.3 tok/s · first token 140 ms · 31 cached' from stored stats."""
    if not stats:
        return ""
    if stats.get("interrupted"):
        return "interrupted: the app stopped while writing this answer · Ctrl+R writes it again"
    parts = [f"{stats.get('generated_tokens', 0)} tokens"]
    if stats.get("decode_tps"):
        parts.append(f"{stats['decode_tps']:.1f} tok/s")
    if stats.get("ttft_s") is not None:
        parts.append(f"first token {stats['ttft_s'] * 1000:.0f} ms")
    parts.append(f"{stats.get('cached_tokens', 0)} cached")
    if stats.get("draft_proposed"):
        parts.append(speculation_text(stats))
    if stats.get("finish_reason") == "cancelled":
        parts.append("stopped")
    elif stats.get("finish_reason") == "length":
        parts.append("hit the token limit")
    return " · ".join(parts)


def speculation_text(stats: dict[str, Any]) -> str:
    """'drafts 41/52 (79%), 1.4x' from stored stats."""
    proposed, accepted = stats["draft_proposed"], stats.get("draft_accepted", 0)
    text = f"drafts {accepted}/{proposed} ({accepted / proposed:.0%})"
    if stats.get("speedup"):
        text += f", {stats['speedup']:.2f}x"
    return text


class _OneLayoutPass:
    """A widget whose growth costs the screen one layout pass, not two or three.

    Textual lays the screen out again whenever a widget's virtual size changes, in
    case it now needs scroll bars. A chat turn grows with every redraw of a streaming
    answer, so each redraw cost two layouts and two paints of the whole turn. A
    widget that cannot scroll (no `auto` or `scroll` overflow) has nothing to redo.

    Layout requests also reach the screen late: a widget passes its request on at
    its next idle, which can come after the screen has laid out the redraw's other
    changes (a block made during a redraw asks at its first idle after it is mounted),
    and each late request is one more layout of the whole screen. Here a request is
    passed on at once, or, when made before the mount, as soon as the widget mounts,
    so it joins the layout of the change that caused it.
    """

    def refresh(
        self, *regions: Region, repaint: bool = True, layout: bool = False, recompose: bool = False
    ) -> Self:
        super().refresh(  # type: ignore[misc]
            *regions, repaint=repaint, layout=layout, recompose=recompose
        )
        if layout and self._is_mounted:  # type: ignore[attr-defined]
            self._check_refresh()  # type: ignore[attr-defined]
        return self

    def _post_mount(self) -> None:  # after the Mount event, before mounting is awaited done
        super()._post_mount()  # type: ignore[misc]
        self._check_refresh()  # type: ignore[attr-defined]

    def _size_updated(
        self, size: Size, virtual_size: Size, container_size: Size, layout: bool = True
    ) -> bool:
        styles = self.styles  # type: ignore[attr-defined]
        scrolls = {styles.overflow_x, styles.overflow_y} & {"auto", "scroll"}
        return super()._size_updated(  # type: ignore[misc]
            size, virtual_size, container_size, layout=layout and bool(scrolls)
        )


class _RepaintInPlace:
    """A paragraph whose new text takes as many lines as its old text is only repainted.

    Textual lays the whole screen out for every update of a paragraph. While an answer
    streams, a redraw can add words without starting a line (where redraws come every
    0.1 s, each adds a few words), and the first words of an answer go into the open
    paragraph, which is one line tall while empty: then the paragraph keeps its height,
    nothing on the screen moves, and painting the paragraph again is all that is needed.
    """

    def set_content(self, content: Content) -> None:
        self._content = content
        self.update(content, layout=False)  # type: ignore[attr-defined]
        if not self._keeps_height():
            self.refresh(layout=True)  # type: ignore[attr-defined]

    def _keeps_height(self) -> bool:
        """Whether the new text takes exactly the lines the paragraph was laid out with."""
        if not self.is_attached or not self._is_mounted:  # type: ignore[attr-defined]
            return False
        width, height = self.content_size  # type: ignore[attr-defined]
        if width <= 0 or height <= 0:
            return False
        return bool(self._render().get_height(self.styles, width) == height)  # type: ignore[attr-defined]


class TurnMarkdown(_OneLayoutPass, Markdown):
    """A chat turn's Markdown: its blocks (paragraphs, lists, headings; code blocks too unless
    they scroll) take one layout pass when they grow."""

    _quiet: dict[type[MarkdownBlock], type[MarkdownBlock]] = {}

    def call_next(self, callback: Any, *args: Any, **kwargs: Any) -> None:
        # Every mount sends this widget a reminder to lay out once the blocks are
        # mounted. Markdown already awaits each of its mounts (which lays them out),
        # so the reminder only arrives after that layout and costs another.
        if isinstance(callback, AwaitMount) and callback._parent is self:
            return
        super().call_next(callback, *args, **kwargs)

    async def open_paragraph(self) -> None:
        """Mount an empty first paragraph, before an answer starts to stream.

        The answer's first words then update it instead of mounting it (a new widget's
        styles and its own layout), work that would otherwise fall while the model
        decodes. An answer that starts with another kind of block replaces it.
        """
        if not self.children:
            token = Token("paragraph_open", "p", 1, map=[0, 1], block=True)
            await self.mount(self.get_block_class("paragraph_open")(self, token))

    def get_block_class(self, block_name: str) -> type[MarkdownBlock]:
        base = super().get_block_class(block_name)
        quiet = self._quiet.get(base)
        if quiet is None:
            mixins: tuple[type, ...] = (_OneLayoutPass,)
            if block_name == "paragraph_open":
                mixins = (_RepaintInPlace, *mixins)
            quiet = type(base.__name__, (*mixins, base), {})
            self._quiet[base] = quiet
        return quiet


def _thinking_title(thought: str) -> str:
    words = len(thought.split())
    return f"Thinking · {words} word{'s' if words != 1 else ''}"


class ChatMessage(_OneLayoutPass, Vertical):
    """A user prompt or an assistant answer."""

    def __init__(
        self,
        role: str,
        content: str,
        *,
        stats: dict[str, Any] | None = None,
        in_context: bool = True,
        message_id: int | None = None,
    ) -> None:
        classes = f"message {role}" + ("" if in_context else " dropped")
        super().__init__(classes=classes)
        self.role = role
        self.content = content
        self.message_id = message_id
        self._stats = stats
        self._in_context = in_context
        self._thought = ""  # an answer's reasoning, when the model thinks

    def compose(self) -> ComposeResult:
        label = "You" if self.role == "user" else "Assistant"
        if not self._in_context:
            label += " (dropped from context)"
        yield Static(label, classes="role")
        thought, answer = "", self.content
        if self.role == "assistant" and reasoning.OPEN in self.content:
            thought, answer = reasoning.split(self.content)
        if thought:
            yield self._thinking(thought)
        yield TurnMarkdown(answer, classes="body")
        yield Static(stats_line(self._stats), classes="stats")

    def _thinking(self, thought: str) -> Collapsible:
        """The answer's reasoning: folded and dimmed, Enter or a click opens it; its title
        counts the words, so a long think shows it is moving while folded."""
        self._thought = thought
        return Collapsible(
            Static(thought, classes="thought", markup=False),
            title=_thinking_title(thought),
            collapsed=True,
            classes="thinking",
        )

    async def add_thought(self, text: str) -> None:
        """More of the reasoning while it streams (the section is made on the first)."""
        self._thought += text
        found = self.query(".thinking").results(Collapsible)
        section = next(iter(found), None)
        if section is None:
            await self.mount(self._thinking(self._thought), before=self.body)
            return
        section.title = _thinking_title(self._thought)
        section.query_one(".thought", Static).update(self._thought)

    @property
    def body(self) -> TurnMarkdown:
        return self.query_one(".body", TurnMarkdown)

    def set_stats(self, stats: dict[str, Any] | None) -> None:
        self._stats = stats
        for line in self.query(".stats").results(Static):  # none once the view moved on
            line.update(stats_line(stats))
