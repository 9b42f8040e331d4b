"""Reasoning ("thinking") text: `<think>…</think>` at the start of a reply, kept apart
from the answer. Thinking models (Qwen3, DeepSeek-R1, QwQ, SmolLM3) write it; some
templates open the block in the prompt (the reply starts inside it, with no opening tag).

The endpoint returns it as `reasoning_content` (Ollama: `thinking`), the chat shows it
folded, and neither sends it back in the next turn's prompt, as the templates expect.
"""

from __future__ import annotations

OPEN, CLOSE = "<think>", "</think>"


def mode_for(template: str | None, prompt_tail: str) -> str | None:
    """How a reply may carry reasoning: "open" when the prompt ends inside a think block,
    "tags" when the template knows think tags (a reply may open one), None otherwise."""
    tail = prompt_tail.rstrip()
    if tail.endswith(OPEN):
        return "open"
    if template and (OPEN in template or CLOSE in template):
        return "tags"
    return None


class ReasoningSplitter:
    """Splits a streamed reply into (reasoning, answer) pieces. A think block counts only
    at the start of the reply (a tag later in the answer is text about tags); a tag split
    across pieces is held back until it is whole."""

    def __init__(self, mode: str | None) -> None:
        self.inside = mode == "open"
        self.may_open = mode == "tags"  # until the answer's first visible character
        self.closed = False
        self._held = ""
        self._strip = False  # whitespace right after </think> is not the answer's
        self._strip_thought = True  # nor is whitespace right after <think> the reasoning's

    def feed(self, piece: str) -> tuple[str, str]:
        """The reasoning and the answer text that `piece` completes."""
        text = self._held + piece
        self._held = ""
        reasoning = answer = ""
        while text:
            if self.inside:
                if self._strip_thought:
                    text = text.lstrip()
                    if not text:
                        break
                    self._strip_thought = False
                at = text.find(CLOSE)
                if at < 0:
                    keep = _partial(text, CLOSE)
                    reasoning += text[: len(text) - keep]
                    self._held = text[len(text) - keep :]
                    break
                reasoning += text[:at]
                text = text[at + len(CLOSE) :]
                self.inside, self.closed, self._strip = False, True, True
                continue
            if self.may_open:
                stripped = text.lstrip()
                if not stripped:
                    self._held = text  # only whitespace so far: the tag may follow
                    break
                if stripped.startswith(OPEN):
                    text = stripped[len(OPEN) :]
                    self.inside, self.may_open = True, False
                    continue
                if OPEN.startswith(stripped):
                    self._held = text  # a tag in the making
                    break
                self.may_open = False
            if self._strip:
                text = text.lstrip()
                if not text:
                    break
                self._strip = False
            answer += text
            break
        return reasoning, answer

    def close(self) -> tuple[str, str]:
        """What was held back, at the end of the reply."""
        held, self._held = self._held, ""
        if self.inside:
            return held, ""
        return "", "" if self._strip else held


def split(text: str, mode: str | None = "tags") -> tuple[str, str]:
    """A whole reply's (reasoning, answer)."""
    splitter = ReasoningSplitter(mode)
    reasoning, answer = splitter.feed(text)
    more_reasoning, more_answer = splitter.close()
    return reasoning + more_reasoning, answer + more_answer


def without_reasoning(text: str) -> str:
    """An earlier answer as the next turn's prompt carries it: its think block left out."""
    return split(text, "tags")[1] if OPEN in text or CLOSE in text else text


def _partial(text: str, tag: str) -> int:
    """How many of text's last characters could start `tag`."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if tag.startswith(text[-n:]):
            return n
    return 0
