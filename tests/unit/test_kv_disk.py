"""The prompt cache's disk writer (engine/kv_disk.py) as control flow: states go to disk
off the worker thread, and a writer that falls behind holds a bounded amount of memory."""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Any

import pytest

from localllm.backends.base import KVSnapshot
from localllm.engine import kv_disk


class Bytes:
    """A stand-in model for the writer: its states' payloads are their bytes."""

    def dump_kv(self, snapshot: KVSnapshot) -> bytes:
        return bytes(snapshot.payload)

    def undump_kv(self, tokens: Any, data: bytes) -> KVSnapshot:
        return KVSnapshot(tuple(tokens), len(data), data)


def state(n: int, first: int) -> KVSnapshot:
    payload = bytes(i % 251 for i in range(first, first + n))  # no two chunks alike
    return KVSnapshot(tuple(range(first, first + n)), nbytes=n, payload=payload)


def test_a_writer_that_falls_behind_keeps_the_next_states_in_ram_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
):
    caplog.set_level(logging.INFO, logger="localllm.engine.kv_disk")
    gate, writing = threading.Event(), threading.Event()
    real = kv_disk._write_files

    def held(job: Any, settle: Any) -> bool:
        writing.set()
        gate.wait(30)
        return real(job, settle)

    monkeypatch.setattr(kv_disk, "_write_files", held)
    monkeypatch.setattr(kv_disk, "MAX_WAITING_BYTES", 100)
    writer, shelf = kv_disk.DiskWriter(budget=10_000), kv_disk.Shelf(tmp_path / "model")
    writer.write(shelf, Bytes(), "first", state(80, 0), "")  # type: ignore[arg-type]
    assert writing.wait(30)
    writer.write(shelf, Bytes(), "second", state(80, 1000), "")  # type: ignore[arg-type]
    assert shelf.writing == {"first"} and writer.waiting == 80
    assert "80 bytes of states wait for the disk" in caplog.text
    gate.set()
    writer.flush()
    assert set(shelf.entries) == {"first"} and writer.waiting == 0
    assert sorted(p.name for p in shelf.dir.iterdir()) == ["first.json", "first.kv"]
    writer.write(shelf, Bytes(), "second", state(80, 1000), "")  # type: ignore[arg-type]
    writer.flush()  # caught up: the next state goes to disk again
    assert set(shelf.entries) == {"first", "second"}


def test_states_go_to_disk_only_while_the_engine_is_quiet_and_at_once_in_a_flush(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """A write waits while the engine decodes (its thread would hold the GIL while the
    kernel leaves it waiting for a core); a quiet engine gets it written, in chunks; a
    flush (unload, shutdown) writes at once, busy or not."""
    monkeypatch.setattr(kv_disk, "QUIET_S", 0.01)
    monkeypatch.setattr(kv_disk, "CHUNK", 7)  # a state of 20 bytes: three chunks
    writer, shelf = kv_disk.DiskWriter(budget=10_000), kv_disk.Shelf(tmp_path / "model")
    writer.quiet(False)
    writer.write(shelf, Bytes(), "busy", state(20, 0), "")  # type: ignore[arg-type]
    threading.Event().wait(0.3)  # the writer had time to write, had it not waited
    writer.take_written()
    assert shelf.writing == {"busy"} and not shelf.dir.exists()
    writer.flush()  # still busy: written now all the same
    written = (shelf.dir / "busy.kv").read_bytes()
    assert set(shelf.entries) == {"busy"} and written == state(20, 0).payload

    writer.quiet(False)  # the worker's next turn: still decoding
    writer.write(shelf, Bytes(), "quiet", state(20, 100), "")  # type: ignore[arg-type]
    threading.Event().wait(0.2)
    assert not (shelf.dir / "quiet.json").exists()
    writer.quiet(True)
    for _ in range(300):
        writer.take_written()
        if "quiet" in shelf.entries:
            break
        threading.Event().wait(0.05)
    assert set(shelf.entries) == {"busy", "quiet"}
    assert (shelf.dir / "quiet.kv").read_bytes() == state(20, 100).payload
    reread = kv_disk.Shelf(tmp_path / "model")
    reread.index()
    assert set(reread.entries) == {"busy", "quiet"}
    for key, first in (("busy", 0), ("quiet", 100)):  # read checks the sidecar's SHA-256
        snap = reread.read(key, Bytes())  # type: ignore[arg-type]
        assert snap is not None and snap.payload == state(20, first).payload


def test_a_killed_writers_temporary_file_is_removed_and_a_live_ones_kept(tmp_path: Path):
    """A state on its way to disk is a `.tmp-*` file its writer holds locked; a server
    killed mid-write leaves it unlocked, and the next index of that folder removes it."""
    import fcntl
    import os

    from localllm.engine.kv_disk import TMP_PREFIX, Shelf

    dead = tmp_path / f"{TMP_PREFIX}dead"
    dead.write_bytes(b"x" * 4096)
    live = tmp_path / f"{TMP_PREFIX}live"
    live.write_bytes(b"y" * 4096)
    fd = os.open(live, os.O_RDWR)
    fcntl.flock(fd, fcntl.LOCK_EX)  # another process writing it now
    try:
        Shelf(tmp_path).index()
        assert not dead.exists() and live.exists()
    finally:
        os.close(fd)
    Shelf(tmp_path).index()  # its writer gone too
    assert not live.exists()


def test_states_on_their_way_to_disk_count_in_its_budget(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """Round 4: temporary files were outside `prompt_cache_disk_mb`. A state being
    written now counts: the oldest states go before it starts, so the folder, its
    .tmp- files included, never holds more than the budget, and /health's disk bytes
    say so while it is written."""
    gate, writing = threading.Event(), threading.Event()
    real = kv_disk._write_files

    def held(job: Any, settle: Any) -> bool:
        writing.set()
        gate.wait(30)
        return real(job, settle)

    writer, shelf = kv_disk.DiskWriter(budget=250), kv_disk.Shelf(tmp_path / "model")
    for i, key in enumerate(("a", "b")):
        writer.write(shelf, Bytes(), key, state(100, 1000 * i), "")  # type: ignore[arg-type]
        writer.flush()
    assert set(shelf.entries) == {"a", "b"} and shelf.bytes == 200
    monkeypatch.setattr(kv_disk, "_write_files", held)
    writer.write(shelf, Bytes(), "c", state(100, 5000), "")  # type: ignore[arg-type]
    assert writing.wait(30)
    on_disk = sum(p.stat().st_size for p in shelf.dir.iterdir() if p.suffix == ".kv")
    assert set(shelf.entries) == {"b"} and shelf.bytes == 200  # "a" made room first
    assert on_disk + 100 <= 250
    gate.set()
    writer.flush()
    assert set(shelf.entries) == {"b", "c"} and shelf.bytes == 200 and shelf.pending == 0
