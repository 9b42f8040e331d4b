"""Stored responses (`store: true`, the Responses API's default) in SQLite, so that
`previous_response_id` continues a conversation and `GET /v1/responses/{id}` finds it.

A row keeps the response as returned, its own input items and the id of the response it
continues; a conversation is read by walking that chain back (a linked list, so a long
conversation is stored once, not once per turn: six turns carrying a 7 MB item used to
store it six times). Continuing renders the conversation again, and the prompt cache,
which kept the answer's KV, reads only what is new. Deleting a response, or the oldest
going when the store is full (MAX_RESPONSES), moves its items into the responses that
continue it (`before`), so every conversation still stored stays whole. One file
(`responses.db` in the data folder); rows from before the chain kept their whole
conversation in `conversation` and are read as they are.

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
    conversation TEXT NOT NULL,  -- '' now; older rows: every item up to this one's output
    owner TEXT NOT NULL DEFAULT 'anonymous',  -- the client (key name) that made it
    previous TEXT,               -- the response this one continues (NULL: the first)
    before TEXT NOT NULL DEFAULT '[]'  -- items of deleted responses it continued
)
"""
_COLUMNS = {
    "owner": "TEXT NOT NULL DEFAULT 'anonymous'",
    "previous": "TEXT",
    "before": "TEXT NOT NULL DEFAULT '[]'",
}
Items = list[dict[str, Any]]


class BrokenChain(LookupError):
    """An earlier response of a conversation is missing (not reachable through the
    store's own writes; a store edited by hand)."""


class ResponseStore:
    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute(SCHEMA)
        columns = {row[1] for row in self._db.execute("PRAGMA table_info(responses)")}
        for name, kind in _COLUMNS.items():  # a store made before owners or chains
            if name not in columns:
                self._db.execute(f"ALTER TABLE responses ADD COLUMN {name} {kind}")
        self._db.execute("CREATE INDEX IF NOT EXISTS responses_previous ON responses(previous)")
        self._lock = threading.Lock()

    def put(
        self, body: dict[str, Any], input_items: Items, owner: str, previous: str | None = None
    ) -> None:
        """Keep a response: `input_items` are this request's own, `previous` the stored
        response it continued (the caller found it as `owner`'s)."""
        row = (body["id"], time.time(), json.dumps(body), json.dumps(input_items), owner, previous)
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                self._db.execute(
                    "INSERT OR REPLACE INTO responses (id, created, body, input_items, "
                    "conversation, owner, previous, before) VALUES (?, ?, ?, ?, '', ?, ?, '[]')",
                    row,
                )
                old = self._db.execute(
                    "SELECT id FROM responses ORDER BY created DESC LIMIT -1 OFFSET ?",
                    (MAX_RESPONSES,),
                ).fetchall()
                for (rid,) in old:
                    self._remove(rid)
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")

    def _row(self, response_id: str) -> tuple[Any, ...] | None:
        row: tuple[Any, ...] | None = self._db.execute(
            "SELECT body, input_items, conversation, previous, before, owner "
            "FROM responses WHERE id = ?",
            (response_id,),
        ).fetchone()
        return row

    @staticmethod
    def _own(row: tuple[Any, ...]) -> tuple[Items, bool]:
        """A row's items (what it moved in from deleted ones, its input, its output) and
        whether they are the whole conversation (a row from before the chain)."""
        body, input_items, conversation, _previous, before, _owner = row
        if conversation:
            return json.loads(conversation), True
        own: Items = json.loads(before) + json.loads(input_items)
        return own + json.loads(body).get("output", []), False

    def _remove(self, response_id: str) -> None:
        """Delete a row, its items moved into the rows that continue it (in a
        transaction the caller holds)."""
        row = self._row(response_id)
        if row is None:
            return
        items, whole = self._own(row)
        for child_id, child_before in self._db.execute(
            "SELECT id, before FROM responses WHERE previous = ?", (response_id,)
        ).fetchall():
            self._db.execute(
                "UPDATE responses SET before = ?, previous = ? WHERE id = ?",
                (json.dumps(items + json.loads(child_before)), None if whole else row[3], child_id),
            )
        self._db.execute("DELETE FROM responses WHERE id = ?", (response_id,))

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

    def input_items(self, response_id: str, owner: str) -> Items | None:
        found: Items | None = self._column(response_id, "input_items", owner)
        return found

    def conversation(self, response_id: str, owner: str) -> Items | None:
        """Every item up to and including the response's output, oldest first; None
        when `owner` has no such response."""
        parts: list[Items] = []
        with self._lock:
            row = self._row(response_id)
            if row is None or row[5] != owner:
                return None
            for _ in range(MAX_RESPONSES + 1):
                items, whole = self._own(row)
                parts.append(items)
                if whole or row[3] is None:
                    return [item for part in reversed(parts) for item in part]
                previous = row[3]
                row = self._row(previous)
                if row is None:
                    raise BrokenChain(f"{response_id} continues {previous}, which is missing")
        raise BrokenChain(f"{response_id}'s conversation loops")

    def delete(self, response_id: str, owner: str) -> bool:
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                found = self._db.execute(
                    "SELECT 1 FROM responses WHERE id = ? AND owner = ?", (response_id, owner)
                ).fetchone()
                if found is not None:
                    self._remove(response_id)
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")
        return found is not None

    def close(self) -> None:
        self._db.close()
