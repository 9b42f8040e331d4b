"""One chat turn on screen: a role label, Markdown content, and a statistics line."""

from __future__ import annotations

from typing import Any

from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import Markdown, Static


def stats_line(stats: dict[str, Any] | None) -> str:
    """'12 tokens · 95.3 tok/s · first token 140 ms · 31 cached' from stored stats."""
    if not stats:
        return ""
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
    ) -> None:
        classes = f"message {role}" + ("" if in_context else " dropped")
        super().__init__(classes=classes)
        self.role = role
        self.content = content
        self.message_id = message_id
        self._stats = stats
        self._in_context = in_context

    def compose(self) -> ComposeResult:
        label = "You" if self.role == "user" else "Assistant"
        if not self._in_context:
            label += " (dropped from context)"
        yield Static(label, classes="role")
        yield Markdown(self.content, classes="body")
        yield Static(stats_line(self._stats), classes="stats")

    @property
    def body(self) -> Markdown:
        return self.query_one(".body", Markdown)

    def set_stats(self, stats: dict[str, Any] | None) -> None:
        self._stats = stats
        for line in self.query(".stats").results(Static):  # none once the view moved on
            line.update(stats_line(stats))
