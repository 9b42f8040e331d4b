"""Conversations on disk: SQLite in WAL mode under the user data directory.

Each write is one transaction, so a crash or a kill leaves either the old or the
new state, never a torn one. An answer is written when it ends (finished,
stopped or failed), with its statistics.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from localllm.errors import LocalLLMError

SCHEMA = """
CREATE TABLE IF NOT EXISTS conversations (
    id INTEGER PRIMARY KEY,
    title TEXT NOT NULL,
    created REAL NOT NULL,
    updated REAL NOT NULL,
    settings TEXT NOT NULL DEFAULT '{}'
);
CREATE TABLE IF NOT EXISTS messages (
    id INTEGER PRIMARY KEY,
    conversation_id INTEGER NOT NULL REFERENCES conversations(id) ON DELETE CASCADE,
    role TEXT NOT NULL,
    content TEXT NOT NULL,
    created REAL NOT NULL,
    stats TEXT,
    in_context INTEGER NOT NULL DEFAULT 1
);
CREATE INDEX IF NOT EXISTS messages_by_conversation ON messages(conversation_id, id);
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
"""

# The schema's version, kept in SQLite's `PRAGMA user_version`. A database written before
# versions existed reads 0 and has the schema above (version 1). A change to the schema
# adds its SQL here under the next number; opening a database runs what it lacks, in one
# transaction.
SCHEMA_VERSION = 2
# 2: images and audio attached to a message (the chat's @photo.png), kept as sent
ATTACHMENTS = """
CREATE TABLE IF NOT EXISTS attachments (
    id INTEGER PRIMARY KEY,
    message_id INTEGER NOT NULL REFERENCES messages(id) ON DELETE CASCADE,
    name TEXT NOT NULL,
    kind TEXT NOT NULL,
    data BLOB NOT NULL
);
CREATE INDEX IF NOT EXISTS attachments_by_message ON attachments(message_id, id);
"""
MIGRATIONS: dict[int, str] = {1: SCHEMA, 2: ATTACHMENTS}


class HistoryTooNew(LocalLLMError):
    """The history was written by a newer localllm, with a schema this one cannot read."""

    def __init__(self, path: Path, found: int) -> None:
        super().__init__(
            f"The chat history at {path} has schema version {found}; this localllm reads up "
            f"to version {SCHEMA_VERSION}. Upgrade localllm, or move the file away to start "
            "a new history."
        )


@dataclass(frozen=True, slots=True)
class ConversationSettings:
    """Per-conversation generation settings; None means the app default."""

    system_prompt: str = ""
    temperature: float | None = None
    top_p: float | None = None
    max_tokens: int | None = None
    n_ctx: int | None = None
    backend: str | None = None  # auto | llamacpp | mlx
    speculate: str | None = None  # off | lookup | draft | auto
    thinking: bool | None = None  # a thinking model's reasoning on/off; None: its template's
    # the chat's tools (agent/): built-in names and "mcp:SERVER"; None: the config default
    tools: tuple[str, ...] | None = None
    tool_folder: str | None = None  # where the file and shell tools work; None: the chat's cwd
    tool_steps: int | None = None  # tool calls an answer may make; None: the config default

    def to_json(self) -> str:
        return json.dumps({k: getattr(self, k) for k in self.__dataclass_fields__})

    @classmethod
    def from_json(cls, text: str) -> ConversationSettings:
        try:
            raw = json.loads(text or "{}")
        except json.JSONDecodeError:
            raw = {}
        if not isinstance(raw, dict):
            raw = {}
        if isinstance(raw.get("tools"), list):
            raw["tools"] = tuple(str(t) for t in raw["tools"])
        return cls(**{k: v for k, v in raw.items() if k in cls.__dataclass_fields__})


@dataclass(frozen=True, slots=True)
class Conversation:
    id: int
    title: str
    updated: float
    settings: ConversationSettings = field(default_factory=ConversationSettings)


@dataclass(frozen=True, slots=True)
class Attachment:
    """An image or audio file sent with a message: its name as the user wrote it, its kind
    ("image" or "audio") and its bytes as they were read."""

    name: str
    kind: str
    data: bytes


@dataclass(frozen=True, slots=True)
class StoredMessage:
    id: int
    role: str
    content: str
    stats: dict[str, Any] | None
    in_context: bool
    attachments: tuple[Attachment, ...] = ()


class History:
    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.execute("PRAGMA foreign_keys=ON")
        self._migrate()

    def _migrate(self) -> None:
        found = int(self._db.execute("PRAGMA user_version").fetchone()[0])
        if found > SCHEMA_VERSION:
            self._db.close()
            raise HistoryTooNew(self.path, found)
        if found == SCHEMA_VERSION:
            return
        with self._tx() as db:
            for version in range(found + 1, SCHEMA_VERSION + 1):
                for statement in MIGRATIONS[version].split(";"):
                    if statement.strip():
                        db.execute(statement)
                db.execute(f"PRAGMA user_version = {version}")

    @property
    def schema_version(self) -> int:
        return int(self._db.execute("PRAGMA user_version").fetchone()[0])

    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        self._db.execute("BEGIN IMMEDIATE")
        try:
            yield self._db
        except BaseException:
            self._db.execute("ROLLBACK")
            raise
        self._db.execute("COMMIT")

    def close(self) -> None:
        self._db.close()

    # -- conversations -------------------------------------------------------------
    def create(
        self, title: str = "New chat", settings: ConversationSettings | None = None
    ) -> Conversation:
        now = time.time()
        s = settings or ConversationSettings()
        with self._tx() as db:
            cur = db.execute(
                "INSERT INTO conversations(title, created, updated, settings) VALUES (?,?,?,?)",
                (title, now, now, s.to_json()),
            )
        cid = int(cur.lastrowid or 0)
        self.set_last(cid)
        return Conversation(cid, title, now, s)

    def conversations(self) -> list[Conversation]:
        rows = self._db.execute(
            "SELECT id, title, updated, settings FROM conversations ORDER BY updated DESC, id DESC"
        ).fetchall()
        return [Conversation(r[0], r[1], r[2], ConversationSettings.from_json(r[3])) for r in rows]

    def get(self, cid: int) -> Conversation | None:
        r = self._db.execute(
            "SELECT id, title, updated, settings FROM conversations WHERE id=?", (cid,)
        ).fetchone()
        return Conversation(r[0], r[1], r[2], ConversationSettings.from_json(r[3])) if r else None

    def rename(self, cid: int, title: str) -> None:
        with self._tx() as db:
            db.execute(
                "UPDATE conversations SET title=? WHERE id=?", (title.strip() or "Chat", cid)
            )

    def save_settings(self, cid: int, settings: ConversationSettings) -> None:
        with self._tx() as db:
            db.execute("UPDATE conversations SET settings=? WHERE id=?", (settings.to_json(), cid))

    def delete(self, cid: int) -> None:
        with self._tx() as db:
            db.execute("DELETE FROM conversations WHERE id=?", (cid,))

    def last(self) -> int | None:
        r = self._db.execute("SELECT value FROM meta WHERE key='last_conversation'").fetchone()
        if r is None:
            return None
        cid = int(r[0])
        return cid if self.get(cid) else None

    def set_last(self, cid: int) -> None:
        with self._tx() as db:
            db.execute(
                "INSERT OR REPLACE INTO meta(key, value) VALUES ('last_conversation', ?)",
                (str(cid),),
            )

    # -- messages ------------------------------------------------------------------
    def add(
        self,
        cid: int,
        role: str,
        content: str,
        stats: dict[str, Any] | None = None,
        attachments: Sequence[Attachment] = (),
    ) -> int:
        now = time.time()
        with self._tx() as db:
            cur = db.execute(
                "INSERT INTO messages(conversation_id, role, content, created, stats) "
                "VALUES (?,?,?,?,?)",
                (cid, role, content, now, json.dumps(stats) if stats else None),
            )
            mid = int(cur.lastrowid or 0)
            db.executemany(
                "INSERT INTO attachments(message_id, name, kind, data) VALUES (?,?,?,?)",
                [(mid, a.name, a.kind, a.data) for a in attachments],
            )
            db.execute("UPDATE conversations SET updated=? WHERE id=?", (now, cid))
        return mid

    def update(self, mid: int, content: str, stats: dict[str, Any] | None) -> None:
        """Replace a message's text and figures (an answer saved as it streams)."""
        with self._tx() as db:
            db.execute(
                "UPDATE messages SET content=?, stats=? WHERE id=?",
                (content, json.dumps(stats) if stats else None, mid),
            )

    def messages(self, cid: int) -> list[StoredMessage]:
        rows = self._db.execute(
            "SELECT id, role, content, stats, in_context FROM messages "
            "WHERE conversation_id=? ORDER BY id",
            (cid,),
        ).fetchall()
        held: dict[int, list[Attachment]] = {}
        for mid, name, kind, data in self._db.execute(
            "SELECT a.message_id, a.name, a.kind, a.data FROM attachments a "
            "JOIN messages m ON m.id = a.message_id WHERE m.conversation_id=? ORDER BY a.id",
            (cid,),
        ):
            held.setdefault(mid, []).append(Attachment(name, kind, bytes(data)))
        return [
            StoredMessage(
                r[0],
                r[1],
                r[2],
                json.loads(r[3]) if r[3] else None,
                bool(r[4]),
                tuple(held.get(r[0], ())),
            )
            for r in rows
        ]

    def delete_message(self, mid: int) -> None:
        with self._tx() as db:
            db.execute("DELETE FROM messages WHERE id=?", (mid,))

    def drop_from_context(self, mids: list[int]) -> None:
        """Keep messages in the history but leave them out of future prompts."""
        with self._tx() as db:
            db.executemany("UPDATE messages SET in_context=0 WHERE id=?", [(m,) for m in mids])

    def prompts(self, limit: int = 200) -> list[str]:
        """The user's earlier prompts, newest first, for recall with Up."""
        rows = self._db.execute(
            "SELECT content FROM messages WHERE role='user' ORDER BY id DESC LIMIT ?", (limit,)
        ).fetchall()
        return [r[0] for r in rows]

    def export_markdown(self, cid: int) -> str:
        conv = self.get(cid)
        title = conv.title if conv else "Conversation"
        out = [f"# {title}", ""]
        if conv and conv.settings.system_prompt:
            out += ["**System**", "", conv.settings.system_prompt, ""]
        for m in self.messages(cid):
            label = {
                "user": "You",
                "tool": "Tool result",
                "summary": "Summary of earlier turns",
            }.get(m.role, "Assistant")
            out += [f"**{label}**", "", m.content, ""]
            out += [f"*[{a.kind}: {a.name}]*\n" for a in m.attachments]
        return "\n".join(out).rstrip() + "\n"
