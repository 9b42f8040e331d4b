"""Streaming text assembly shared by the backends.

Token pieces arrive as bytes. `TextAssembler` turns them into text that never
ends in the middle of a UTF-8 character, and holds back any tail that could be
the start of a stop string, so a stop string never reaches the caller even when
it spans several tokens.
"""

from __future__ import annotations

import codecs
from collections.abc import Sequence


class TextAssembler:
    def __init__(self, stop: Sequence[str] = ()) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._stops = tuple(s for s in stop if s)
        self._pending = ""
        self.stopped = False
        self.matched: str | None = None  # the stop string that was seen

    def push(self, data: bytes) -> str:
        """Add one token's bytes; return the text that is now safe to emit.

        After a stop string is seen, `stopped` is True and the text before it is returned.
        """
        text = self._decoder.decode(data)
        if not self._stops:
            return text
        return self._scan(self._pending + text)

    def flush(self) -> str:
        """Return whatever is held back at the end of generation."""
        text = self._pending + self._decoder.decode(b"", final=True)
        self._pending = ""
        if self._stops and not self.stopped:
            cut = self._first_stop(text)
            if cut >= 0:
                self.stopped = True
                return text[:cut]
        return text

    def _first_stop(self, text: str) -> int:
        best = -1
        for s in self._stops:
            i = text.find(s)
            if i >= 0 and (best < 0 or i < best):
                best = i
                self.matched = s
        return best

    def _scan(self, text: str) -> str:
        cut = self._first_stop(text)
        if cut >= 0:
            self.stopped = True
            self._pending = ""
            return text[:cut]
        keep = 0
        for s in self._stops:
            # the longest tail of `text` that is a proper prefix of `s`
            for k in range(min(len(s) - 1, len(text)), keep, -1):
                if text.endswith(s[:k]):
                    keep = k
                    break
        if keep:
            self._pending = text[-keep:]
            return text[:-keep]
        self._pending = ""
        return text
