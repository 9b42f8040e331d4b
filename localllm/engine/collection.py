"""No automatic cycle collection while a model decodes (the worker holds it)."""

from __future__ import annotations

import gc


class CollectionPause:
    """No automatic cycle collection while a model decodes.

    A full collection walks every object the process has while holding the GIL: in
    the chat app (Textual's widgets, the endpoint, the model's bindings) that was
    30-150 ms, every few answers, and decoding stops for all of it (the sampler runs
    in Python between tokens). Reference counting still frees almost everything; the
    cycles that wait are collected once no request is running, where a pause costs
    nothing. If someone else turned collection off, it stays off.
    """

    def __init__(self) -> None:
        self._held = False

    def hold(self) -> None:
        if not self._held and gc.isenabled():
            gc.disable()
            self._held = True

    def release(self) -> None:
        if self._held:
            gc.enable()
            self._held = False
