"""How often a streaming answer is redrawn.

A redraw every `interval` (1/12 s): text reaches the screen at most about 100 ms after
the model wrote it, in steps of a few words, as people expect of a chat. What makes
that affordable on a machine whose cores all decode is the cost of one redraw, not
their rarity: the answer's open block is plain text repainted in place and finished
blocks are not laid out again (`tui/live.py`), so a redraw costs the UI thread about
a millisecond. (An earlier pacer spaced costly Markdown redraws up to a second apart
to spare the decode; the text arrived in lumps.)

The clock is a parameter so that tests can drive it.
"""

from __future__ import annotations

import time
from collections.abc import Callable

INTERVAL_S = 1 / 12


class RedrawPacer:
    def __init__(
        self, *, interval: float = INTERVAL_S, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.interval = interval
        self.clock = clock
        self.redraws = 0  # pieces drawn since `start` (for tests and benchmarks)
        self.start()

    def start(self) -> None:
        """A new answer: its first piece is drawn at once, then every `interval`."""
        self._last = float("-inf")
        self.redraws = 0

    def wait(self) -> float:
        """Seconds until the next redraw is due (0 when it is due now)."""
        return max(0.0, self._last + self.interval - self.clock())

    def drawn(self) -> None:
        """A piece was taken (and drawn, where the answer is on screen)."""
        self._last = self.clock()
        self.redraws += 1
