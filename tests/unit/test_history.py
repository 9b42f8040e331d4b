"""Conversation storage on real SQLite files."""

from __future__ import annotations

import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from localllm.history import ConversationSettings, History


def test_conversations_and_messages_round_trip(tmp_path: Path):
    h = History(tmp_path / "h.sqlite3")
    a = h.create("A", ConversationSettings(system_prompt="sys", temperature=0.1))
    b = h.create("B")
    assert h.last() == b.id
    h.add(a.id, "user", "hi")
    mid = h.add(a.id, "assistant", "hello", {"generated_tokens": 3})
    assert h.conversations()[0].title == "A"  # most recently updated first
    msgs = h.messages(a.id)
    assert [(m.role, m.content) for m in msgs] == [("user", "hi"), ("assistant", "hello")]
    assert msgs[1].stats == {"generated_tokens": 3}
    h.drop_from_context([msgs[0].id])
    assert [m.in_context for m in h.messages(a.id)] == [False, True]
    h.rename(a.id, "Renamed")
    renamed = h.get(a.id)
    assert renamed is not None and renamed.title == "Renamed"
    assert renamed.settings.system_prompt == "sys"
    assert h.prompts() == ["hi"]
    md = h.export_markdown(a.id)
    assert md.startswith("# Renamed") and "**System**" in md and "hello" in md
    h.delete_message(mid)
    h.delete(a.id)
    assert h.get(a.id) is None
    assert h.messages(a.id) == []  # cascade
    h.close()
    assert sqlite3.connect(tmp_path / "h.sqlite3").execute("PRAGMA journal_mode").fetchone()[
        0] == "wal"


WRITER = """
import sys
from pathlib import Path
from localllm.history import History
h = History(Path(sys.argv[1]))
c = h.create("stress")
print("ready", flush=True)
i = 0
while True:
    h.add(c.id, "user", "x" * 2000 + str(i))
    i += 1
"""


@pytest.mark.process
def test_a_killed_writer_never_corrupts_the_store(tmp_path: Path):
    db = tmp_path / "h.sqlite3"
    proc = subprocess.Popen([sys.executable, "-c", WRITER, str(db)], stdout=subprocess.PIPE,
                            text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    time.sleep(0.5)  # let it write for a while, then kill it mid-transaction
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    h = History(db)
    con = sqlite3.connect(db)
    assert con.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    msgs = h.messages(h.conversations()[0].id)
    assert len(msgs) > 10
    assert all(m.content.startswith("x" * 2000) for m in msgs)  # no torn rows
    h.add(h.conversations()[0].id, "user", "still writable")
    h.close()
