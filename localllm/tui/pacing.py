"""How often a streaming answer is redrawn.

Every redraw of a growing Markdown answer costs the UI thread a parse, a layout
and a paint. On a machine whose cores all decode, that time comes straight out of
the model's: measured on two cores that llama.cpp keeps busy, each millisecond of
redraw delayed the next token by about a millisecond. So the pacer spaces redraws
to keep the UI thread within `budget` of one core (1%, which by that measure costs
the decode about 1% once an answer is under way; the first token's redraw comes on
top), measured with the thread's own CPU clock. Where redraws are cheap
(a fast machine, a short conversation) they come every `min_interval`; where they
are slow, every `max_interval` at most.
One pacer serves all of an app's answers: what it learned about the cost of a
redraw carries over, so a new answer does not pay again for finding it out.
"""

from __future__ import annotations

import time


class RedrawPacer:
    def __init__(
        self, *, budget: float = 0.01, min_interval: float = 0.1, max_interval: float = 0.75
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
        self._cpu = time.thread_time()  # the UI thread's CPU clock at the last redraw

    def wait(self) -> float:
        """Seconds until the next redraw is due (0 when it is due now)."""
        return max(0.0, self._last + self.interval - time.monotonic())

    def drawn(self) -> None:
        """Record a redraw; the UI thread's CPU since the last one sets the next interval."""
        now, cpu = time.monotonic(), time.thread_time()
        if self._last != float("-inf"):
            used = cpu - self._cpu
            self._cost = used if self._cost is None else 0.5 * self._cost + 0.5 * used
            wanted = self._cost / self.budget
            self.interval = min(self.max_interval, max(self.min_interval, wanted))
        self._last, self._cpu = now, cpu
