"""One chat turn on screen: a role label, Markdown content, and a statistics line."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import Collapsible, Markdown, Static

from localllm.agent.session import call_line
from localllm.backends import reasoning
from localllm.history import Attachment
from localllm.tui import pictures
from localllm.tui.live import LiveText, open_block, shown_text


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
    if stats.get("loop_guard"):
        parts.append("stopped: it kept repeating itself · Ctrl+G lets it go on")
    elif stats.get("finish_reason") == "cancelled":
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


def _thinking_title(thought: str) -> str:
    words = len(thought.split())
    return f"Thinking · {words} word{'s' if words != 1 else ''}"


def calls_text(calls: list[dict[str, Any]]) -> str:
    return "\n".join(f"→ {call_line(c.get('name', ''), c.get('arguments', ''))}" for c in calls)


STATUS_WORDS = {
    "ok": "",
    "error": " · failed",
    "denied": " · denied",
    "stopped": " · stopped",
    "not run": " · not run",
}


def tool_title(stats: dict[str, Any] | None) -> str:
    """'⚙ read_file(path="a.py") · denied': a tool result's folded title."""
    s = stats or {}
    status = STATUS_WORDS.get(s.get("status", "ok"), "")
    return f"⚙ {call_line(s.get('name', 'tool'), s.get('arguments', ''), 70)}{status}"


TITLE_EVERY_S = 0.5


class ChatMessage(Vertical):
    """A user prompt or an assistant answer."""

    def __init__(
        self,
        role: str,
        content: str,
        *,
        stats: dict[str, Any] | None = None,
        in_context: bool = True,
        message_id: int | None = None,
        attachments: Sequence[Attachment] = (),
    ) -> None:
        classes = f"message {role}" + ("" if in_context else " dropped")
        super().__init__(classes=classes)
        self.role = role
        self.content = content
        self.message_id = message_id
        self.attachments = tuple(attachments)
        self._stats = stats
        self._in_context = in_context
        self._thought = ""  # an answer's reasoning, when the model thinks
        self._titled = 0.0  # when the thinking section's title last changed
        self._answer_text = ""  # the answer so far, while it streams
        self._answer_done = 0

    def compose(self) -> ComposeResult:
        label = {"user": "You", "tool": "Tool"}.get(self.role, "Assistant")
        if not self._in_context:
            label += " (dropped from context)"
        if self.role == "summary":  # what /compact kept of the older turns
            n = (self._stats or {}).get("summarized", 0)
            yield Collapsible(
                Static(self.content, markup=False, classes="tool-result"),
                title=f"Summary of {n} earlier messages (the model reads this instead)",
                collapsed=True,
                classes="summary",
            )
            return
        if self.role == "tool":  # a call's result: one folded block, Enter opens it
            yield Collapsible(
                Static(self.content, markup=False, classes="tool-result"),
                title=tool_title(self._stats),
                collapsed=True,
                classes="tool",
            )
            return
        yield Static(label, classes="role")
        for item in self.attachments:
            yield from pictures.shown(item, inline=getattr(self.app, "inline_images", False))
        thought, answer = "", self.content
        if self.role == "assistant" and reasoning.OPEN in self.content:
            thought, answer = reasoning.split(self.content)
        if thought:
            yield self._thinking(thought)
        yield Markdown(answer, classes="body")
        calls = (self._stats or {}).get("tool_calls") or []
        if calls:
            yield Static(calls_text(calls), classes="calls", markup=False)
        yield Static(stats_line(self._stats), classes="stats")

    def show_calls(self, calls: list[dict[str, Any]]) -> None:
        """The tool calls an answer ended with, under its text (once it has streamed)."""
        if calls and not self.query(".calls"):
            self.mount(
                Static(calls_text(calls), classes="calls", markup=False),
                before=self.query_one(".stats"),
            )

    def _thinking(self, thought: str, *, live: bool = False) -> Collapsible:
        """The answer's reasoning: folded and dimmed, Enter or a click opens it; its title
        counts the words, so a long think shows it is moving while folded."""
        self._thought = thought
        text = (
            LiveText(classes="thought")
            if live
            else Static(thought, classes="thought", markup=False)
        )
        return Collapsible(text, title=_thinking_title(thought), collapsed=True, classes="thinking")

    async def start_answer(self) -> None:
        """Get ready to stream an answer into this turn: its live text is mounted (and laid
        out) now, before the model decodes, not with the first words."""
        self._answer_text = ""
        self._answer_done = 0  # how much of it is finished blocks, handed to the Markdown
        await self.mount(LiveText(classes="body-live"), before=self.query_one(".stats"))

    async def add_text(self, text: str) -> bool:
        """More of the answer, shown live as plain text. Finished blocks are handed to the
        Markdown when the screen is laid out anyway (the live text outgrew its reserve),
        and around code blocks (the live text shows one as code, alone). True when the
        turn's height changed (the chat may need scrolling)."""
        self._answer_text += text
        pending = self._answer_text[self._answer_done :]
        start, code = open_block(pending)
        live = self.live
        layouts = live.layouts
        handed = bool(start) and (code or live.has_class("code") or not live.fits(pending))
        if handed:
            await self.body.append(pending[:start])
            self._answer_done += start
            pending = pending[start:]
        live.show(shown_text(pending, code), code=code)
        return handed or live.layouts != layouts

    async def add_thought(self, text: str) -> None:
        """More of the reasoning while it streams (the section is made on the first). The
        folded title's word count moves on at most every `TITLE_EVERY_S`: each change of
        a title lays out the screen."""
        self._thought += text
        section = next(iter(self.query(".thinking").results(Collapsible)), None)
        if section is None:
            await self.mount(self._thinking(self._thought, live=True), before=self.body)
            section = self.query_one(".thinking", Collapsible)
            self._titled = time.monotonic()
        section.query_one(".thought", LiveText).show(self._thought.strip())
        if time.monotonic() - self._titled >= TITLE_EVERY_S:
            section.title = _thinking_title(self._thought)
            self._titled = time.monotonic()

    async def end_answer(self) -> None:
        """The answer is complete (or stopped): all of it becomes Markdown."""
        rest = self._answer_text[self._answer_done :]
        if rest:
            await self.body.append(rest)
            self._answer_done = len(self._answer_text)
        for live in self.query(LiveText).results(LiveText):
            if live.has_class("thought"):
                live.fit()
            else:
                await live.remove()
        for section in self.query(".thinking").results(Collapsible):
            section.title = _thinking_title(self._thought)

    @property
    def body(self) -> Markdown:
        return self.query_one(".body", Markdown)

    @property
    def live(self) -> LiveText:
        return self.query_one(".body-live", LiveText)

    def set_stats(self, stats: dict[str, Any] | None) -> None:
        self._stats = stats
        for line in self.query(".stats").results(Static):  # none once the view moved on
            line.update(stats_line(stats))
