"""One request's output as typed deltas: the answer's text, its reasoning, its tool calls,
its log probabilities and, last, the final stats with the finish reason and the stop
string that matched.

Every face (the OpenAI, Ollama, Anthropic and llama-server routes, the chat, the CLI)
reads these and only translates them into its wire shape: reasoning is split and tool
calls are read here, once per request. A local model's reply is text, split by the
`Started` it announced (how it may think, how it writes calls); a remote engine that
parses those itself sends them structured on its chunks, and they pass through as they
are (no round trip through think tags or call markup).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from localllm.backends.base import Chunk, TokenLogprob, ToolCall
from localllm.backends.reasoning import ReasoningSplitter
from localllm.backends.tools import ReplyReader, ToolFormat
from localllm.engine.request import Started

TOOL_FORMATS: tuple[ToolFormat, ...] = ("hermes", "llama3", "mistral", "generic")


@dataclass(frozen=True, slots=True)
class Delta:
    """A piece of one answer. `final` is set on the last one only."""

    text: str = ""
    reasoning: str = ""
    logprobs: tuple[TokenLogprob, ...] = ()
    tool_calls: tuple[ToolCall, ...] = ()  # whole calls (a call is sent once it parses)
    final: Chunk | None = None  # finish reason, stats, the stop string that matched

    @property
    def empty(self) -> bool:
        return not (self.text or self.reasoning or self.logprobs or self.tool_calls)

    @property
    def finish_reason(self) -> str | None:
        """stop | length | cancelled | tool_calls (None before the end)."""
        if self.final is None:
            return None
        if self.tool_calls and self.final.finish_reason == "stop":
            return "tool_calls"
        return self.final.finish_reason

    def __add__(self, other: Delta) -> Delta:
        return Delta(
            self.text + other.text,
            self.reasoning + other.reasoning,
            self.logprobs + other.logprobs,
            self.tool_calls + other.tool_calls,
            other.final or self.final,
        )


class OutputProcessor:
    """Turns one request's chunks into deltas (see the module's docstring)."""

    def __init__(self, started: Started) -> None:
        mode = started.reasoning
        self._splitter = ReasoningSplitter(mode) if mode else None
        fmt = started.tool_format
        self._reader: ReplyReader | None = None
        if fmt is not None and started.tool_names:
            assert fmt in TOOL_FORMATS, fmt
            self._reader = ReplyReader(fmt, started.tool_names)

    def feed(
        self, text: str, logprobs: Sequence[TokenLogprob] = (), final: Chunk | None = None
    ) -> Delta:
        """The delta for `text` (and, when `final` is given, everything held back)."""
        reasoning = ""
        calls: list[ToolCall] = []
        splitter, reader = self._splitter, self._reader
        if splitter is not None:
            reasoning, text = splitter.feed(text)
            if final is not None:
                more_reasoning, more_text = splitter.close()
                reasoning, text = reasoning + more_reasoning, text + more_text
        if reader is not None:
            text = reader.feed(text)
            if final is not None:
                rest = reader.close(cut=final.finish_reason == "length")
                text, calls = text + rest.content, list(rest.calls)
        return Delta(text, reasoning, tuple(logprobs), tuple(calls), final)

    def chunk(self, chunk: Chunk) -> Delta:
        """The delta of one chunk, its structured reasoning and calls (a remote's) kept."""
        final = chunk if chunk.finish_reason is not None else None
        delta = self.feed(chunk.text, chunk.logprobs, final)
        if chunk.reasoning or chunk.tool_calls:
            delta = Delta(
                delta.text,
                chunk.reasoning + delta.reasoning,
                delta.logprobs,
                chunk.tool_calls + delta.tool_calls,
                delta.final,
            )
        return delta
