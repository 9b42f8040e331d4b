"""The prompt cache: saved KV states of token prefixes, matched by longest common prefix.

Each loaded model keeps one live KV cache. When a request comes for another
conversation, the live state is parked here first, and the saved state that
shares the longest prefix with the request is restored, so several
conversations stay warm. States live in RAM within a byte budget (least
recently used out first) and, unless turned off, on disk under the user cache
directory with a size cap, so they survive a restart.

Every state belongs to one model identity (the file, its size and change time,
the backend, the context size and the KV element type): another model or
another context size never sees it. A disk entry carries a SHA-256 of its bytes;
one that fails the check or does not load is deleted with a log line and the
request runs cold.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import tempfile
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path

from localllm.backends.base import KVSnapshot, LoadedModel, ModelRef
from localllm.backends.common import reusable_prefix

log = logging.getLogger(__name__)

FORMAT_VERSION = 1
_MIB = 1024 * 1024


def model_key(ref: ModelRef, model: LoadedModel, kv_type: str) -> str:
    """What a KV state is valid for: the model file and every load option that shapes the KV."""
    try:
        st = ref.path.stat()
        stamp = f"{st.st_size}:{st.st_mtime_ns}"
    except OSError:
        stamp = "?"
    info = model.info
    parts = [
        str(FORMAT_VERSION),
        str(ref.path.resolve()),
        stamp,
        info.backend,
        str(info.n_ctx),
        kv_type,
    ]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:24]


def _tokens_key(tokens: tuple[int, ...]) -> str:
    return hashlib.sha256(",".join(map(str, tokens)).encode()).hexdigest()[:32]


@dataclass(slots=True)
class _DiskEntry:
    tokens: tuple[int, ...]
    path: Path  # the .kv file; its .json sidecar holds tokens, size and checksum
    nbytes: int
    used: float


@dataclass(slots=True)
class _Slot:
    """One resident model as the cache sees it: its disk folder and whether its live
    KV state is saved as it is."""

    model: LoadedModel
    dir: Path | None
    disk: dict[str, _DiskEntry] = field(default_factory=dict)
    live_saved: bool = False


class PromptCache:
    """Owned by the engine worker thread; not thread-safe.

    Several models can be resident at once: each keeps its own live KV state, and
    the saved states of all of them share the RAM budget (least recently used out
    first), each tagged with its model identity.
    """

    def __init__(self, ram_budget: int, disk_dir: Path | None, disk_budget: int) -> None:
        self.ram_budget = ram_budget
        self.disk_root = disk_dir
        self.disk_budget = disk_budget
        self._ram: OrderedDict[tuple[str, str], KVSnapshot] = OrderedDict()
        self._slots: dict[str, _Slot] = {}
        self._key: str | None = None  # the model requests go to now
        self.lookups = 0
        self.hits = 0
        self.restored = 0
        self.evicted = 0

    # -- the models -------------------------------------------------------------------
    @property
    def _slot(self) -> _Slot | None:
        return self._slots.get(self._key) if self._key is not None else None

    @property
    def _model(self) -> LoadedModel | None:
        slot = self._slot
        return slot.model if slot is not None else None

    def attach(self, model: LoadedModel | None, key: str | None) -> None:
        """Serve `model` (identity `key`) from now on; its disk states are indexed the first
        time. Other resident models keep their live states and their saved ones."""
        if model is None or key is None:
            self._key = None
            return
        slot = self._slots.get(key)
        if slot is None or slot.model is not model:
            folder = self.disk_root / key if self.disk_root is not None else None
            slot = self._slots[key] = _Slot(model, folder)
            if folder is not None:
                self._index_disk(slot)
        self._key = key

    def release(self, key: str) -> None:
        """A model is unloading: save its live state (to RAM and disk), then forget the model.
        Its saved states stay: a reload of the same file and options can use them."""
        if key not in self._slots:
            return
        current = self._key
        self._key = key
        try:
            self.park_live()
        finally:
            del self._slots[key]
            self._key = current if current != key else None

    # -- serving a request ------------------------------------------------------------
    def prepare(self, prompt: list[int]) -> None:
        """Before a request: make the live KV state the best one for `prompt`."""
        slot = self._slot
        if slot is None or self._key is None:
            return
        model, mkey = slot.model, self._key
        self.lookups += 1
        live = model.kv_prefix()
        live_n = reusable_prefix(live, prompt)
        best_n, best_key, in_ram = live_n, "", False
        for (owner, key), saved in self._ram.items():
            if owner != mkey:
                continue
            n = reusable_prefix(saved.tokens, prompt)
            if n > best_n:
                best_n, best_key, in_ram = n, key, True
        for key, entry in slot.disk.items():
            n = reusable_prefix(entry.tokens, prompt)
            if n > best_n:
                best_n, best_key, in_ram = n, key, False
        if best_key:
            snap = self._ram[(mkey, best_key)] if in_ram else self._read_disk(slot, best_key)
            self._park(live)
            if snap is not None and model.load_kv(snap):
                self.restored += 1
                slot.live_saved = True
                if in_ram:
                    self._ram.move_to_end((mkey, best_key))
                else:
                    self._put_ram((mkey, best_key), snap)
            elif snap is not None:
                log.warning("a saved KV state did not load; this request runs cold")
                self._ram.pop((mkey, best_key), None)
        elif live_n < len(live):
            self._park(live)  # the request keeps only part of the live state: save it first

    def finished(self, cached_tokens: int) -> None:
        """After a request: count the hit; the live state has changed."""
        self.hits += cached_tokens > 0
        if self._slot is not None:
            self._slot.live_saved = False

    def park_live(self) -> None:
        """Save the live state (at shutdown, so a restart finds it on disk)."""
        if self._model is not None:
            self._park(self._model.kv_prefix())

    def _park(self, live: list[int]) -> None:
        slot, mkey = self._slot, self._key
        if slot is None or mkey is None or slot.live_saved or not live:
            return
        key = _tokens_key(tuple(live))
        if (mkey, key) in self._ram:
            self._ram.move_to_end((mkey, key))
            slot.live_saved = True
            return
        snap = slot.model.save_kv()
        if not snap.tokens:
            return
        slot.live_saved = True
        # a saved prefix of the new state is redundant: the new one answers all it could
        for (owner, old_key), old in list(self._ram.items()):
            if owner == mkey and snap.tokens[: len(old.tokens)] == old.tokens:
                del self._ram[(owner, old_key)]
        self._put_ram((mkey, key), snap)
        self._write_disk(slot, key, snap)

    def _put_ram(self, key: tuple[str, str], snap: KVSnapshot) -> None:
        self._ram[key] = snap
        self._ram.move_to_end(key)
        while self._ram and self.ram_bytes > self.ram_budget:
            self._ram.popitem(last=False)
            self.evicted += 1

    # -- disk -------------------------------------------------------------------------
    def _index_disk(self, slot: _Slot) -> None:
        assert slot.dir is not None
        try:
            sidecars = list(slot.dir.glob("*.json"))
        except OSError:
            return
        for side in sidecars:
            try:
                meta = json.loads(side.read_text(encoding="utf-8"))
                tokens = tuple(int(t) for t in meta["tokens"])
                path = side.with_suffix(".kv")
                slot.disk[side.stem] = _DiskEntry(
                    tokens, path, int(meta["nbytes"]), path.stat().st_mtime
                )
            except (OSError, ValueError, KeyError, TypeError) as exc:
                log.warning("dropping unreadable prompt-cache entry %s: %s", side.name, exc)
                self._delete(slot, side.stem)

    def _read_disk(self, slot: _Slot, key: str) -> KVSnapshot | None:
        entry = slot.disk.get(key)
        if entry is None or slot.dir is None:
            return None
        try:
            data = entry.path.read_bytes()
            meta = json.loads(entry.path.with_suffix(".json").read_text(encoding="utf-8"))
            if len(data) != int(meta["size"]) or hashlib.sha256(data).hexdigest() != meta["sha256"]:
                raise ValueError(f"{len(data)} bytes that do not match their checksum")
            snap = slot.model.undump_kv(entry.tokens, data)
        except (OSError, ValueError, KeyError, TypeError) as exc:
            log.warning("dropping corrupt prompt-cache entry %s: %s", entry.path.name, exc)
            self._delete(slot, key)
            return None
        with contextlib.suppress(OSError):
            os.utime(entry.path)  # recently used: the disk cap evicts by age
        return snap

    def _write_disk(self, slot: _Slot, key: str, snap: KVSnapshot) -> None:
        folder = slot.dir
        if folder is None or key in slot.disk:
            return
        try:
            data = slot.model.dump_kv(snap)
            if len(data) > self.disk_budget:
                return
            folder.mkdir(parents=True, exist_ok=True)
            meta = {
                "tokens": list(snap.tokens),
                "nbytes": snap.nbytes,
                "size": len(data),
                "sha256": hashlib.sha256(data).hexdigest(),
                "created": time.time(),
            }
            for suffix, blob in ((".kv", data), (".json", json.dumps(meta).encode())):
                fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=folder)
                with os.fdopen(fd, "wb") as fh:
                    fh.write(blob)
                os.replace(tmp, folder / f"{key}{suffix}")  # the sidecar last: it makes it count
        except OSError as exc:
            log.warning("could not write a prompt-cache entry: %s", exc)
            return
        slot.disk[key] = _DiskEntry(snap.tokens, folder / f"{key}.kv", snap.nbytes, time.time())
        for old_key, old in list(slot.disk.items()):
            if old_key != key and snap.tokens[: len(old.tokens)] == old.tokens:
                self._delete(slot, old_key)  # superseded by the longer state
        self._trim_disk(slot)

    def _trim_disk(self, slot: _Slot) -> None:
        by_age = sorted(slot.disk.items(), key=lambda kv: kv[1].used)
        total = sum(self._size(e) for e in slot.disk.values())
        for key, entry in by_age:
            if total <= self.disk_budget:
                break
            total -= self._size(entry)
            self._delete(slot, key)

    @staticmethod
    def _size(entry: _DiskEntry) -> int:
        try:
            return entry.path.stat().st_size
        except OSError:
            return 0

    def _delete(self, slot: _Slot, key: str) -> None:
        slot.disk.pop(key, None)
        if slot.dir is None:
            return
        for suffix in (".json", ".kv"):
            with contextlib.suppress(OSError):
                (slot.dir / f"{key}{suffix}").unlink()

    # -- figures ----------------------------------------------------------------------
    @property
    def ram_bytes(self) -> int:
        return sum(s.nbytes for s in self._ram.values())

    @property
    def disk_bytes(self) -> int:
        return sum(self._size(e) for slot in self._slots.values() for e in slot.disk.values())

    def stats(self) -> dict[str, object]:
        """Figures for /health (read from another thread: retried if a dict moves under it)."""
        for _ in range(5):
            try:
                return self._stats()
            except RuntimeError:
                continue
        return {}

    def _stats(self) -> dict[str, object]:
        return {
            "ram_entries": len(self._ram),
            "ram_bytes": self.ram_bytes,
            "ram_budget_bytes": self.ram_budget,
            "disk_entries": sum(len(slot.disk) for slot in self._slots.values()),
            "disk_bytes": self.disk_bytes,
            "disk_budget_bytes": self.disk_budget if self.disk_root is not None else 0,
            "requests": self.lookups,
            "hits": self.hits,
            "hit_rate": round(self.hits / self.lookups, 3) if self.lookups else 0.0,
            "restored": self.restored,
            "evicted": self.evicted,
        }


def default_ram_budget() -> int:
    """A quarter of the memory available now, at most 8 GiB, at least 64 MiB."""
    import psutil

    return max(64 * _MIB, min(psutil.virtual_memory().available // 4, 8 * 1024 * _MIB))
