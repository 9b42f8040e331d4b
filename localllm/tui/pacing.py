"""How often a streaming answer is redrawn.

Every redraw of a growing Markdown answer costs the UI thread a parse, a layout
and a paint. On a machine whose cores all decode, that time comes straight out of
the model's: measured on two cores that llama.cpp keeps busy, each millisecond of
redraw delayed the next token by about a millisecond. So the pacer spaces redraws
so that they take at most `budget` of one core (1%, which by that measure costs the
decode about 1% once an answer is under way; the first token's redraw comes on top).
A redraw's cost is the UI thread's CPU time (its own clock) from taking the new text
to the screen being painted. Where redraws are cheap (a fast machine, a short
conversation) they come every `min_interval`; where they are slow, every
`max_interval` at most (1 s: the budget holds for redraws of up to 10 ms, about what
one costs on a slow two-core machine).

The cost it plans with follows the dearest recent redraws: it rises at once to a
dearer one and moves a quarter of the way down per cheaper one. An answer mixes
cheap redraws (its first words, a line that only lengthens: a repaint) with dear
ones (new lines and paragraphs: a layout of the screen), and an average of the two
would space the dear ones closer than the budget allows.
One pacer serves all of an app's answers: what it learned about the cost of a
redraw carries over, so a new answer does not pay again for finding it out.
"""

from __future__ import annotations

import time


class RedrawPacer:
    def __init__(
        self, *, budget: float = 0.01, min_interval: float = 0.1, max_interval: float = 1.0
    ) -> None:
        self.budget = budget
        self.min_interval = min_interval
        self.max_interval = max_interval
        self.interval = min_interval
        self._cost: float | None = None
        self.start()

    def start(self) -> None:
        """A new answer: its first piece is drawn at once, then at the learned interval."""
        self._last = float("-inf")

    def wait(self) -> float:
        """Seconds until the next redraw is due (0 when it is due now)."""
        return max(0.0, self._last + self.interval - time.monotonic())

    def drawn(self, cost: float | None) -> None:
        """Record a redraw that took `cost` seconds of the UI thread's CPU (None: a piece
        was taken but nothing drawn); the cost sets the interval to the next one."""
        self._last = time.monotonic()
        if cost is None:
            return
        self._cost = cost if self._cost is None else max(cost, 0.75 * self._cost + 0.25 * cost)
        wanted = self._cost / self.budget
        self.interval = min(self.max_interval, max(self.min_interval, wanted))
