"""Stored responses (`store: true`, the Responses API's default) in SQLite, so that
`previous_response_id` continues a conversation and `GET /v1/responses/{id}` finds it.

A row keeps the response as returned and the conversation it closes: the items of every
response before it in the chain, its own input items and its output. Continuing from it
renders that conversation again, and the prompt cache, which kept the answer's KV, reads
only what is new. One file (`responses.db` in the data folder), bounded by
MAX_RESPONSES: the oldest go first.

Every row belongs to the client that made it (its key's name; "anonymous" without keys):
reading, continuing, listing the input of and deleting a response are answered only for
that client, and for any other as if it did not exist (404), so a key cannot learn which
ids another has.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

MAX_RESPONSES = 10_000

SCHEMA = """
CREATE TABLE IF NOT EXISTS responses (
    id TEXT PRIMARY KEY,
    created REAL NOT NULL,
    body TEXT NOT NULL,          -- the response object as returned
    input_items TEXT NOT NULL,   -- this request's input items (with ids)
    conversation TEXT NOT NULL,  -- every item up to and including this response's output
    owner TEXT NOT NULL DEFAULT 'anonymous'  -- the client (key name) that made it
)
"""


class ResponseStore:
    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute(SCHEMA)
        columns = {row[1] for row in self._db.execute("PRAGMA table_info(responses)")}
        if "owner" not in columns:  # a store made before owners: its rows are anonymous's
            self._db.execute(
                "ALTER TABLE responses ADD COLUMN owner TEXT NOT NULL DEFAULT 'anonymous'"
            )
        self._lock = threading.Lock()

    def put(
        self,
        body: dict[str, Any],
        input_items: list[dict[str, Any]],
        conversation: list[dict[str, Any]],
        owner: str,
    ) -> None:
        row = (
            body["id"],
            time.time(),
            json.dumps(body),
            json.dumps(input_items),
            json.dumps(conversation),
            owner,
        )
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                self._db.execute(
                    "INSERT OR REPLACE INTO responses "
                    "(id, created, body, input_items, conversation, owner) "
                    "VALUES (?, ?, ?, ?, ?, ?)",
                    row,
                )
                self._db.execute(
                    "DELETE FROM responses WHERE id IN (SELECT id FROM responses "
                    "ORDER BY created DESC LIMIT -1 OFFSET ?)",
                    (MAX_RESPONSES,),
                )
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")

    def _column(self, response_id: str, column: str, owner: str) -> Any:
        with self._lock:
            row = self._db.execute(
                f"SELECT {column} FROM responses WHERE id = ? AND owner = ?",
                (response_id, owner),
            ).fetchone()
        return None if row is None else json.loads(row[0])

    def body(self, response_id: str, owner: str) -> dict[str, Any] | None:
        found: dict[str, Any] | None = self._column(response_id, "body", owner)
        return found

    def input_items(self, response_id: str, owner: str) -> list[dict[str, Any]] | None:
        found: list[dict[str, Any]] | None = self._column(response_id, "input_items", owner)
        return found

    def conversation(self, response_id: str, owner: str) -> list[dict[str, Any]] | None:
        found: list[dict[str, Any]] | None = self._column(response_id, "conversation", owner)
        return found

    def delete(self, response_id: str, owner: str) -> bool:
        with self._lock:
            cursor = self._db.execute(
                "DELETE FROM responses WHERE id = ? AND owner = ?", (response_id, owner)
            )
        return cursor.rowcount > 0

    def close(self) -> None:
        self._db.close()
