"""Log records while the chat runs. A record written to the terminal would be drawn over
the chat's screen (a speculative-decoding warning once landed inside the input box), so
while the chat is up the records go to its log file, `data_dir/logs/chat.log`, and the
warnings and errors are also shown as notifications."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import logging.handlers
from collections.abc import Callable, Iterator
from pathlib import Path

MAX_BYTES = 5 * 1024 * 1024
BACKUPS = 2


def chat_log_path(data_dir: Path) -> Path:
    return Path(data_dir) / "logs" / "chat.log"


@contextlib.contextmanager
def logging_to_file(data_dir: Path) -> Iterator[Path]:
    """The root logger's terminal handlers swapped for the chat's log file, for the
    duration (put back afterwards, so what follows the chat prints as before)."""
    root = logging.getLogger()
    terminal = [
        h
        for h in root.handlers
        if isinstance(h, logging.StreamHandler) and not isinstance(h, logging.FileHandler)
    ]
    path = chat_log_path(data_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    handler = logging.handlers.RotatingFileHandler(
        path, maxBytes=MAX_BYTES, backupCount=BACKUPS, encoding="utf-8"
    )
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    for h in terminal:
        root.removeHandler(h)
    root.addHandler(handler)
    try:
        yield path
    finally:
        root.removeHandler(handler)
        handler.close()
        for h in terminal:
            root.addHandler(h)


class Notifier(logging.Handler):
    """Warnings and errors, from any thread, handed to `show(message, severity)` on the
    event loop that made this handler (never waiting for it: the engine's worker logs
    too, and must not wait for the screen)."""

    def __init__(self, show: Callable[[str, str], None]) -> None:
        super().__init__(logging.WARNING)
        self._show = show
        self._loop = asyncio.get_running_loop()

    def emit(self, record: logging.LogRecord) -> None:
        severity = "error" if record.levelno >= logging.ERROR else "warning"
        try:
            message = record.getMessage()
            self._loop.call_soon_threadsafe(self._show, message, severity)
        except Exception:  # a closed loop, a bad format: the file still has the record
            self.handleError(record)
