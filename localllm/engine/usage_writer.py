"""Usage rows on their way to SQLite: a thread with a connection of its own writes them in
batches, so a database another program holds locked (an sqlite3 shell, a backup tool)
delays the writes, retried with backoff until the lock goes, and never a request or a
key check (engine/accounting.py keeps the day's counts in memory meanwhile). Nothing is
dropped unless the lock outlasts CLOSE_WAIT_S at shutdown, and then it is logged."""

from __future__ import annotations

import contextlib
import logging
import queue
import sqlite3
import threading
import time
from pathlib import Path

log = logging.getLogger(__name__)

UPSERT = """
INSERT INTO usage (client, day, requests, prompt_tokens, cached_tokens, completion_tokens, seconds)
VALUES (?, ?, 1, ?, ?, ?, ?)
ON CONFLICT (client, day) DO UPDATE SET
    requests = requests + 1,
    prompt_tokens = prompt_tokens + excluded.prompt_tokens,
    cached_tokens = cached_tokens + excluded.cached_tokens,
    completion_tokens = completion_tokens + excluded.completion_tokens,
    seconds = seconds + excluded.seconds
"""
RETRY_MAX_S = 2.0  # the longest wait between two tries of a batch
CLOSE_WAIT_S = 30.0  # at shutdown, how long the last writes wait for a locked database
BATCH = 256


class UsageWriter:
    """(client, day, prompt, cached, completion, seconds) rows, written in order."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._rows: queue.Queue[tuple | None] = queue.Queue()
        self._thread: threading.Thread | None = None
        self._closing = threading.Event()
        self._lock = threading.Lock()

    def put(self, row: tuple) -> None:
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._loop, name="localllm-usage", daemon=True
                )
                self._thread.start()
        self._rows.put(row)

    def flush(self) -> None:
        """Wait until every row put so far is in the database."""
        self._rows.join()

    def close(self) -> None:
        if self._thread is not None:
            self._closing.set()
            self._rows.put(None)
            self._thread.join(timeout=CLOSE_WAIT_S + 5)

    def _loop(self) -> None:
        db = sqlite3.connect(self.path, check_same_thread=False, timeout=1)
        try:
            while True:
                item = self._rows.get()
                if item is None:
                    return
                batch = [item]
                with contextlib.suppress(queue.Empty):
                    while len(batch) < BATCH:
                        nxt = self._rows.get_nowait()
                        if nxt is None:
                            self._write(db, batch)
                            return
                        batch.append(nxt)
                self._write(db, batch)
        finally:
            db.close()

    def _write(self, db: sqlite3.Connection, batch: list[tuple]) -> None:
        """Write a batch, retrying with backoff while the database is busy or locked."""
        wait, deadline = 0.05, None
        try:
            while True:
                try:
                    db.executemany(UPSERT, batch)
                    db.commit()
                    return
                except sqlite3.OperationalError as exc:
                    with contextlib.suppress(sqlite3.Error):
                        db.rollback()
                    if self._closing.is_set():
                        deadline = deadline or time.monotonic() + CLOSE_WAIT_S
                        if time.monotonic() > deadline:
                            log.error("usage of %d requests not written: %s", len(batch), exc)
                            return
                    log.warning("usage database busy (%s); retrying in %.2f s", exc, wait)
                    time.sleep(wait)
                    wait = min(wait * 2, RETRY_MAX_S)
                except sqlite3.Error:
                    log.exception("could not write %d usage records", len(batch))
                    return
        finally:
            for _ in batch:
                self._rows.task_done()
