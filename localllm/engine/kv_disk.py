"""The prompt cache's disk tier (engine/prompt_cache.py): one folder of saved KV states
per model identity, each a `.kv` file of the backend's bytes and a `.json` sidecar (its
tokens, sizes and a SHA-256 of the bytes), which is written last and makes it count.

States are hashed and written on a writer thread of the tier's own, at the idle
scheduling class on Linux: for a 2,750-token conversation of the starter (63 MB) that
took 180 ms here, which a request waiting for the slot the conversation held would
otherwise wait for (benchmarks/bench_cache.py, part d). It writes only once the engine
has been quiet for QUIET_S (the worker says when: `quiet`), CHUNK bytes at a time: a
Python thread that the kernel leaves waiting for a core while it holds the GIL holds up
the event loop and the worker with it, and writes at the idle class beside decoding
cores took seconds for a state of a few MB, across a conversation's requests (the
figures: docs/benchmarks-log.md, "One HTTP client per run, and a disk writer that waits
for a quiet engine"). The writer touches
only files and its queues; the worker thread takes the finished writes into each
folder's index (`take_written`, before each request) and waits for all of them when a
model unloads (`flush`, which writes at once, and so at shutdown). Everything else here
runs on the worker thread.

A writer that falls behind (the engine never quiet) holds at most MAX_WAITING_BYTES of
states; past that a state stays in RAM only, as it would with the disk tier off.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import hashlib
import json
import logging
import os
import queue
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

from localllm.backends.base import KVSnapshot, LoadedModel

log = logging.getLogger(__name__)

MAX_WAITING_BYTES = 512 * 1024 * 1024  # states queued for the writer, at most
QUIET_S = 0.05  # how long the engine has been quiet before a chunk is written
CHUNK = 4 * 1024 * 1024  # bytes hashed and written between two looks at the engine


def exact_n(state: KVSnapshot | DiskEntry) -> int:
    """How many leading tokens of a saved state are exactly reusable."""
    return len(state.tokens) if state.canonical is None else state.canonical


def covers(new: KVSnapshot | DiskEntry, old: KVSnapshot | DiskEntry) -> bool:
    """Whether `new` answers every prompt `old` could (a longer state of the same prefix)."""
    return new.tokens[: len(old.tokens)] == old.tokens and exact_n(old) <= exact_n(new)


@dataclass(slots=True)
class DiskEntry:
    tokens: tuple[int, ...]
    path: Path  # the .kv file; its .json sidecar holds tokens, size and checksum
    nbytes: int
    used: float
    canonical: int | None = None  # see KVSnapshot
    tag: str = ""  # the LoRA adapters it was computed under ("": none)
    finals: tuple[tuple[int, int], ...] = ()  # see KVSnapshot
    size: int = 0  # the .kv file's bytes (summed after every step for /health: never a stat)


TMP_PREFIX = ".tmp-"  # a state on its way to disk; renamed into place when whole


def _remove_if_abandoned(path: Path) -> None:
    """Remove a temporary file no writer holds any more (its process was killed before
    the rename); one a live writer holds keeps its lock and stays."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return  # being written
    finally:
        os.close(fd)
    with contextlib.suppress(OSError):
        path.unlink()
        log.info("removed %s, left by a writer that stopped", path.name)


@dataclass(slots=True)
class Shelf:
    """One model identity's folder: the states in it, and those on their way."""

    dir: Path
    entries: dict[str, DiskEntry] = field(default_factory=dict)
    writing: set[str] = field(default_factory=set)
    pending: int = 0  # bytes of states on their way (their .tmp- files count in the budget)

    def index(self) -> None:
        try:
            sidecars = list(self.dir.glob("*.json"))
            leftovers = list(self.dir.glob(TMP_PREFIX + "*"))
        except OSError:
            return
        for tmp in leftovers:
            _remove_if_abandoned(tmp)
        for side in sidecars:
            try:
                meta = json.loads(side.read_text(encoding="utf-8"))
                tokens = tuple(int(t) for t in meta["tokens"])
                path = side.with_suffix(".kv")
                canonical = meta.get("canonical")
                st = path.stat()
                self.entries[side.stem] = DiskEntry(
                    tokens,
                    path,
                    int(meta["nbytes"]),
                    st.st_mtime,
                    None if canonical is None else int(canonical),
                    str(meta.get("tag") or ""),
                    tuple((int(a), int(b)) for a, b in meta.get("finals") or ()),
                    st.st_size,
                )
            except (OSError, ValueError, KeyError, TypeError) as exc:
                log.warning("dropping unreadable prompt-cache entry %s: %s", side.name, exc)
                self.delete(side.stem)

    def read(self, key: str, model: LoadedModel) -> KVSnapshot | None:
        """The state `key` for `model`, checked; None (and the entry deleted) if it fails."""
        entry = self.entries.get(key)
        if entry is None:
            return None
        try:
            data = entry.path.read_bytes()
            meta = json.loads(entry.path.with_suffix(".json").read_text(encoding="utf-8"))
            if len(data) != int(meta["size"]) or hashlib.sha256(data).hexdigest() != meta["sha256"]:
                raise ValueError(f"{len(data)} bytes that do not match their checksum")
            snap = dataclasses.replace(
                model.undump_kv(entry.tokens, data),
                canonical=entry.canonical,
                finals=entry.finals,
            )
        except (OSError, ValueError, KeyError, TypeError) as exc:
            log.warning("dropping corrupt prompt-cache entry %s: %s", entry.path.name, exc)
            self.delete(key)
            return None
        with contextlib.suppress(OSError):
            os.utime(entry.path)  # recently used: the disk cap evicts by age
        return snap

    def add(self, key: str, entry: DiskEntry, budget: int) -> None:
        """A state now on disk: indexed; the shorter ones it covers and, past `budget`
        bytes, the least recently used go."""
        self.entries[key] = entry
        for old_key, old in list(self.entries.items()):
            if old_key != key and old.tag == entry.tag and covers(entry, old):
                self.delete(old_key)
        self.make_room(0, budget, keep=key)

    def make_room(self, need: int, budget: int, keep: str = "") -> None:
        """The least recently used states go until `need` more bytes fit in `budget`
        beside those stored and those on their way."""
        total = self.bytes + need
        for old_key, old in sorted(self.entries.items(), key=lambda kv: kv[1].used):
            if total <= budget:
                break
            if old_key != keep:
                total -= old.size
                self.delete(old_key)

    def delete(self, key: str) -> None:
        self.entries.pop(key, None)
        for suffix in (".json", ".kv"):
            with contextlib.suppress(OSError):
                (self.dir / f"{key}{suffix}").unlink()

    @property
    def bytes(self) -> int:
        """What the folder holds: its states and those being written."""
        return sum(e.size for e in self.entries.values()) + self.pending


@dataclass(slots=True)
class _Write:
    shelf: Shelf
    key: str
    data: bytes | memoryview
    meta: dict[str, Any]
    entry: DiskEntry
    done: bool = False  # the files are in place


class DiskWriter:
    """The writer thread and its queues (started with the first write)."""

    def __init__(self, budget: int) -> None:
        self.budget = budget
        self._writes: queue.Queue[_Write] = queue.Queue()
        self._written: queue.Queue[_Write] = queue.Queue()
        self._thread: threading.Thread | None = None
        self.waiting = 0  # bytes queued and not yet taken back from the writer
        self._quiet = threading.Event()  # the engine decodes nothing (set: standalone use)
        self._quiet.set()
        self._busy_turns = 0  # times the engine turned busy: a quiet spell that was broken
        self._hurry = threading.Event()  # a flush waits: write without waiting for quiet

    def quiet(self, yes: bool) -> None:
        """The engine has nothing to decode (True) or has (False); on the worker thread."""
        if yes == self._quiet.is_set():
            return
        if yes:
            self._quiet.set()
        else:
            self._busy_turns += 1
            self._quiet.clear()

    def _settle(self) -> None:
        """Return once the engine has been quiet for QUIET_S, or at once in a flush. The
        waits have no timeout: each time a thread of the idle class wakes while the cores
        decode, it may be left holding the GIL."""
        while not self._hurry.is_set():
            self._quiet.wait()
            if self._hurry.is_set():
                return
            turns = self._busy_turns
            time.sleep(QUIET_S)
            if self._quiet.is_set() and turns == self._busy_turns:
                return

    def write(self, shelf: Shelf, model: LoadedModel, key: str, snap: KVSnapshot, tag: str) -> None:
        """Send a state to disk unless it is there or on its way (or over the budget)."""
        if key in shelf.entries or key in shelf.writing:
            return
        data = model.dump_kv(snap)  # here: a backend's arrays stay on the worker thread
        if len(data) > self.budget:
            return
        if self.waiting + len(data) > MAX_WAITING_BYTES:
            log.info(
                "%d bytes of states wait for the disk (at most %d): a %d-token state is "
                "kept in RAM only",
                self.waiting,
                MAX_WAITING_BYTES,
                len(snap.tokens),
            )
            return
        meta = {
            "tokens": list(snap.tokens),
            "nbytes": snap.nbytes,
            "size": len(data),
            "canonical": snap.canonical,
            "finals": [list(f) for f in snap.finals],
            "tag": tag,
            "created": time.time(),
        }
        shelf.make_room(len(data), self.budget)  # the budget holds while it is written too
        path = shelf.dir / f"{key}.kv"
        entry = DiskEntry(
            snap.tokens, path, snap.nbytes, time.time(), snap.canonical, tag, snap.finals, len(data)
        )
        shelf.writing.add(key)
        shelf.pending += len(data)
        self.waiting += len(data)
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._run, name="localllm-cache-writer", daemon=True
            )
            self._thread.start()
        self._writes.put(_Write(shelf, key, data, meta, entry))

    def take_written(self) -> None:
        """Index the states the writer has finished (on the worker thread)."""
        while True:
            try:
                job = self._written.get_nowait()
            except queue.Empty:
                return
            job.shelf.writing.discard(job.key)
            job.shelf.pending -= job.entry.size
            self.waiting -= job.entry.size
            if job.done:
                job.shelf.add(job.key, job.entry, self.budget)

    def flush(self) -> None:
        """Write every state on its way to disk now, wait for them, and index them."""
        self._hurry.set()
        self._quiet.set()  # wakes a waiting writer (the worker says busy again after)
        try:
            self._writes.join()
        finally:
            self._hurry.clear()
        self.take_written()

    def _run(self) -> None:
        # on Linux the writer takes only CPU time nothing else wants: on a machine whose
        # cores all decode, a write at the same priority delayed the first token of the
        # request that parked the state by 76-175 ms here (a 2,790-token state)
        with contextlib.suppress(AttributeError, OSError):
            os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))  # type: ignore[attr-defined,unused-ignore]
        while True:
            job = self._writes.get()
            try:
                job.done = _write_files(job, self._settle)
                self._written.put(job)
            finally:
                self._writes.task_done()


def _write_files(job: _Write, settle: Callable[[], None]) -> bool:
    """The state's bytes, then its sidecar, each written whole under a temporary name;
    `settle` returns when the next CHUNK of the bytes may be written."""
    folder = job.shelf.dir
    digest = hashlib.sha256()

    def state(fh: BinaryIO) -> None:
        data = memoryview(job.data).cast("B")
        for at in range(0, len(data), CHUNK):
            if at:
                settle()
            digest.update(data[at : at + CHUNK])
            fh.write(data[at : at + CHUNK])

    def sidecar(fh: BinaryIO) -> None:
        fh.write(json.dumps({**job.meta, "sha256": digest.hexdigest()}).encode())

    settle()  # nothing is made before the first chunk may be written
    try:
        folder.mkdir(parents=True, exist_ok=True)
        for suffix, write in ((".kv", state), (".json", sidecar)):
            fd, tmp = tempfile.mkstemp(prefix=TMP_PREFIX, dir=folder)
            try:
                # held while it is written: a start that can take the lock finds the
                # file of a writer that died (SIGKILL) and removes it (Shelf.index)
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                with os.fdopen(fd, "wb") as fh:
                    write(fh)
                    fh.flush()
                    os.replace(tmp, folder / f"{job.key}{suffix}")  # still locked
            except OSError:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
                raise
    except OSError as exc:
        log.warning("could not write a prompt-cache entry: %s", exc)
        return False
    return True
