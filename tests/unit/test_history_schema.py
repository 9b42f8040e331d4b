"""The history's schema version: a database of the current schema written before versions
existed opens with its rows, a new one gets the version, a newer one is refused clearly."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from localllm.history import SCHEMA, SCHEMA_VERSION, History, HistoryTooNew


def test_an_unversioned_database_of_the_current_schema_opens(tmp_path: Path):
    path = tmp_path / "history.sqlite3"
    db = sqlite3.connect(path)
    db.executescript(SCHEMA)  # as localllm wrote it before the version was kept
    db.execute("INSERT INTO conversations(title, created, updated) VALUES ('Old chat', 1, 1)")
    db.execute("INSERT INTO messages(conversation_id, role, content, created) "
               "VALUES (1, 'user', 'hello', 1)")
    db.commit()
    db.close()
    history = History(path)
    assert history.schema_version == SCHEMA_VERSION
    (conv,) = history.conversations()
    assert conv.title == "Old chat"
    assert [m.content for m in history.messages(conv.id)] == ["hello"]
    history.close()
    again = History(path)  # a second open changes nothing
    assert again.schema_version == SCHEMA_VERSION and len(again.conversations()) == 1
    again.close()


def test_a_new_database_gets_the_version(tmp_path: Path):
    history = History(tmp_path / "new.sqlite3")
    assert history.schema_version == SCHEMA_VERSION
    history.create("x")
    history.close()


def test_a_newer_schema_is_refused_with_the_numbers(tmp_path: Path):
    path = tmp_path / "future.sqlite3"
    db = sqlite3.connect(path)
    db.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 5}")
    db.commit()
    db.close()
    with pytest.raises(HistoryTooNew) as err:
        History(path)
    message = err.value.message
    assert str(path) in message and str(SCHEMA_VERSION + 5) in message
    assert f"up to version {SCHEMA_VERSION}" in message


def test_a_version_1_database_gains_attachments_and_keeps_its_rows(tmp_path: Path):
    from localllm.history import Attachment

    path = tmp_path / "v1.sqlite3"
    db = sqlite3.connect(path)
    db.executescript(SCHEMA)
    db.execute("PRAGMA user_version = 1")
    db.execute("INSERT INTO conversations(title, created, updated) VALUES ('Old chat', 1, 1)")
    db.execute("INSERT INTO messages(conversation_id, role, content, created) "
               "VALUES (1, 'user', 'hello', 1)")
    db.commit()
    db.close()
    history = History(path)
    assert history.schema_version == 2
    (conv,) = history.conversations()
    picture = Attachment("cat.png", "image", b"\x89PNG...")
    history.add(conv.id, "user", "what is this?", attachments=[picture])
    stored = history.messages(conv.id)
    assert [(m.content, m.attachments) for m in stored] == [
        ("hello", ()), ("what is this?", (picture,))]
    history.delete(conv.id)  # the attachments go with their messages
    assert history._db.execute("SELECT COUNT(*) FROM attachments").fetchone()[0] == 0
    history.close()
