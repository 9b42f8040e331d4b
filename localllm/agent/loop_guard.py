"""The loop guard of an agent's turn (agent/turn.py: the chat and `localllm run`): an
answer that repeats itself verbatim (the same line or sentence, or the same few lines,
again and again in a row) is stopped, and the user is told (the chat offers a key to let
it go on). Small models at low temperature fall into
such loops (the starter wrote one line of code nineteen times until its token limit).
The endpoint never does this: its clients decide for themselves.

What counts: complete lines, and sentences within prose lines; a unit shorter than
MIN_CHARS (a closing brace, `else:`) never counts alone, so code is not stopped for the
shape of its syntax."""

from __future__ import annotations

import re

MIN_CHARS = 12  # a repeated block shorter than this is not a loop (`}`, `end`, `---`)
REPEATS_ONE = 4  # one line or sentence this many times in a row
REPEATS_BLOCK = 3  # a block of 2 to MAX_BLOCK lines this many times in a row
MAX_BLOCK = 4

# where a unit ends: a line's end, or a sentence's (its full stop followed by more text)
_BOUNDARY = re.compile(r"\n|(?<=[.!?])[ \t]+(?=\S)")


class LoopGuard:
    def __init__(self) -> None:
        self._pending = ""  # the answer's text after the last unit's end
        self._done = 0  # characters of the answer already cut into units
        self._units: list[str] = []  # the last few units (all a repeat can span)
        self.tripped: str | None = None  # the unit that repeated, once it did
        self.cut = 0  # where the answer is cut once it tripped: after the last repeat

    def feed(self, text: str) -> bool:
        """More of the answer; True once it loops (and from then on)."""
        if self.tripped is not None:
            return True
        pending = self._pending + text
        start = 0
        for end in _BOUNDARY.finditer(pending):  # unit by unit: the cut is exact
            unit = pending[start : end.start()].strip()
            start = end.end()
            if not unit:
                continue
            self._units = [*self._units[-MAX_BLOCK * REPEATS_ONE :], unit]
            self.tripped = self._repeating()
            if self.tripped is not None:
                self.cut = self._done + start
                return True
        self._pending = pending[start:]
        self._done += start
        return False

    def _repeating(self) -> str | None:
        units = self._units
        for size in range(1, MAX_BLOCK + 1):
            times = REPEATS_ONE if size == 1 else REPEATS_BLOCK
            if len(units) < size * times:
                continue
            block = units[-size:]
            if sum(len(u) for u in block) < MIN_CHARS:
                continue
            if all(units[-size * (k + 1) : len(units) - size * k] == block for k in range(times)):
                return " / ".join(block)
        return None
