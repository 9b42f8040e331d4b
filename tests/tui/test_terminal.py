"""`localllm` in a real pseudo-terminal, as a person runs it: Textual's terminal driver,
not the headless one that `run_test` uses (some waits behave differently there)."""

from __future__ import annotations

import fcntl
import os
import pty
import struct
import subprocess
import sys
import termios
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from localllm.history import ConversationSettings, History, StoredMessage
from tests.conftest import THREADS


class Terminal:
    """A child process on a pseudo-terminal of a given size; its output is read all along
    (a terminal that is not read would stop the app when the buffer fills)."""

    def __init__(self, cmd: list[str], env: dict[str, str], cols: int, rows: int) -> None:
        master, slave = pty.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
        self.proc = subprocess.Popen(
            cmd, stdin=slave, stdout=slave, stderr=slave, env=env, start_new_session=True
        )
        os.close(slave)
        self.master = master
        self.output = bytearray()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        while True:
            try:
                data = os.read(self.master, 65536)
            except OSError:  # the child closed the terminal
                return
            if not data:
                return
            self.output += data

    def type(self, text: str) -> None:
        os.write(self.master, text.encode())

    def wait_for(self, what: str, cond: Callable[[], object], timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if cond():
                return
            if self.proc.poll() is not None:
                break
            time.sleep(0.05)
        tail = self.output[-2000:].decode(errors="replace")
        raise AssertionError(f"gave up waiting for {what} (exit code {self.proc.poll()}): {tail}")

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)
        os.close(self.master)
        self._reader.join(timeout=5)


@pytest.mark.process
def test_a_question_in_a_real_terminal_gets_its_answer_and_ctrl_q_quits(tmp_path: Path) -> None:
    data = tmp_path / "data"
    history = History(data / "history.sqlite3")
    conv = history.create("t", ConversationSettings(temperature=0.0, max_tokens=48))
    history.close()
    env = {
        **os.environ,
        "LOCALLLM_DATA_DIR": str(data),
        "LOCALLLM_N_THREADS": str(THREADS),
        "TERM": "xterm-256color",
    }
    term = Terminal([sys.executable, "-m", "localllm", "chat", "--no-serve"], env, 100, 30)
    try:
        term.wait_for("the model to load", lambda: b"llamacpp" in term.output)
        term.type("Write a story about a dragon.")
        term.wait_for("the prompt to show", lambda: b"dragon." in term.output)
        term.type("\r")

        def stored() -> list[StoredMessage]:
            h = History(data / "history.sqlite3")
            try:
                return [m for m in h.messages(conv.id) if m.role == "assistant"
                        and m.stats and not m.stats.get("interrupted")]
            finally:
                h.close()

        term.wait_for("the answer to be stored", stored)
        answer = stored()[0]
        assert answer.content and answer.stats
        assert answer.stats["generated_tokens"] == 48  # streamed to its end, not stuck
        term.wait_for("the statistics line", lambda: b"48 tokens" in term.output)
        term.type("\x11")  # Ctrl+Q
        term.wait_for("the app to quit", lambda: term.proc.poll() is not None, timeout=20)
        assert term.proc.returncode == 0
    finally:
        term.close()


@pytest.mark.process
def test_kill_9_mid_answer_keeps_the_partial_answer_marked(tmp_path: Path) -> None:
    """The chat killed while it writes an answer: the history database is intact, the
    earlier turns too, and the partial answer is kept and marked interrupted; the next
    start says so and offers to write it again."""
    import signal
    import sqlite3

    data = tmp_path / "data"
    history = History(data / "history.sqlite3")
    conv = history.create("t", ConversationSettings(temperature=0.0, max_tokens=3000))
    history.add(conv.id, "user", "Hello")
    history.add(conv.id, "assistant", "Hi there.", {"generated_tokens": 3, "prompt_tokens": 9})
    history.set_last(conv.id)
    history.close()
    env = {**os.environ, "LOCALLLM_DATA_DIR": str(data), "LOCALLLM_N_THREADS": str(THREADS),
           "TERM": "xterm-256color"}
    cmd = [sys.executable, "-m", "localllm", "chat", "--no-serve"]

    def answers() -> list[StoredMessage]:
        h = History(data / "history.sqlite3")
        try:
            return [m for m in h.messages(conv.id) if m.role == "assistant"]
        finally:
            h.close()

    term = Terminal(cmd, env, 100, 30)
    try:
        term.wait_for("the model to load", lambda: b"llamacpp" in term.output)
        term.type("Write a very long story about a dragon and a knight.")
        term.wait_for("the prompt to show", lambda: b"knight." in term.output)
        term.type("\r")
        term.wait_for("part of the answer to be saved",
                      lambda: len(answers()) == 2 and len(answers()[1].content) > 20)
        os.killpg(term.proc.pid, signal.SIGKILL)
        term.proc.wait(timeout=10)
    finally:
        term.close()
    db = sqlite3.connect(data / "history.sqlite3")
    assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    db.close()
    kept = answers()
    assert kept[0].content == "Hi there."  # the earlier turn, intact
    partial = kept[1]
    assert partial.content and partial.stats == {"interrupted": True}
    term = Terminal(cmd, env, 100, 30)
    try:
        term.wait_for("the interrupted answer to be marked",
                      lambda: b"interrupted" in term.output)
    finally:
        term.close()
