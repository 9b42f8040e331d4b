"""The prompt cache: saved KV states of token prefixes, matched by longest common prefix.

Each loaded model keeps one live KV cache per sequence (the scheduler's slots).
When a request comes to a slot, the prefix it can reuse is found among that
slot's live state, the other slots' live states (copied over: a system prompt
several clients share is computed once) and the saved states; the slot's own
state is parked here first when it would be lost, so several conversations stay
warm. A state holds everything its sequence saw, the model's answers included,
unless the request is deterministic: then only exact, aligned prefixes count.
States live in RAM within a byte budget (least recently used out first) and,
unless turned off, on disk under the user cache directory with a size cap, so
they survive a restart.

Every state belongs to one model identity (the file, its size and change time,
the backend, the context size and the KV element type): another model or
another context size never sees it. A state computed under LoRA adapters carries their
tag (engine/adapters.py), and only a request under the same adapters reuses it. A disk
entry carries a SHA-256 of its bytes; one that fails the check or does not load is
deleted with a log line and the request runs cold. The disk tier, and its writer thread
that keeps the writes off a request's way, are in engine/kv_disk.py.
"""

from __future__ import annotations

import hashlib
import logging
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from localllm.backends.base import KVSnapshot, LoadedModel, ModelRef
from localllm.backends.common import reusable_prefix as reusable
from localllm.engine.kv_disk import DiskWriter, Shelf, covers, exact_n

log = logging.getLogger(__name__)

FORMAT_VERSION = 1
_MIB = 1024 * 1024
# a state on disk is read back only for at least this many tokens: reading, checking and
# loading one (~25 MB for a 1,300-token conversation on the starter) took 50-70 ms here,
# more than reading a few dozen prompt tokens
DISK_MIN_REUSE = 64


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
    mmproj = info.extra.get("mmproj")
    if mmproj:  # a picture's KV is what its projector made of it
        try:
            st = Path(mmproj).stat()
            parts.append(f"{Path(mmproj).resolve()}:{st.st_size}:{st.st_mtime_ns}")
        except OSError:
            parts.append(mmproj)
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:24]


def _tokens_key(tokens: tuple[int, ...], tag: str = "") -> str:
    key = hashlib.sha256(",".join(map(str, tokens)).encode()).hexdigest()[:32]
    return f"{tag}-{key}" if tag else key


def _owner(mkey: str, tag: str) -> str:
    """Whose saved states these are: the model's, under the adapters `tag` names."""
    return f"{mkey}/{tag}" if tag else mkey


@dataclass(slots=True)
class _Slot:
    """One resident model as the cache sees it: its disk folder and the sequences whose
    live KV state is saved as it is."""

    model: LoadedModel
    shelf: Shelf | None  # None: no disk tier
    live_saved: set[int] = field(default_factory=set)
    tags: dict[int, str] = field(default_factory=dict)  # seq -> its live state's adapters


class PromptCache:
    """Owned by the engine worker thread; not thread-safe.

    Several models can be resident at once: each keeps its own live KV states, and
    the saved states of all of them share the RAM budget (least recently used out
    first), each tagged with its model identity (`key`).
    """

    def __init__(self, ram_budget: int, disk_dir: Path | None, disk_budget: int) -> None:
        self.ram_budget = ram_budget
        self.disk_root = disk_dir
        self._ram: OrderedDict[tuple[str, str], KVSnapshot] = OrderedDict()
        self._slots: dict[str, _Slot] = {}
        self.lookups = 0
        self.hits = 0
        self.restored = 0
        self.shared = 0  # prefixes copied from another sequence's live state
        self.evicted = 0
        self._writer = DiskWriter(disk_budget)

    # -- the models -------------------------------------------------------------------
    def attach(self, model: LoadedModel, key: str) -> None:
        """Serve `model` (identity `key`); its disk states are indexed the first time."""
        slot = self._slots.get(key)
        if slot is None or slot.model is not model:
            shelf = Shelf(self.disk_root / key) if self.disk_root is not None else None
            slot = self._slots[key] = _Slot(model, shelf)
            if shelf is not None:
                shelf.index()

    def release(self, key: str) -> None:
        """A model is unloading: save its live states (to RAM and disk), then forget the
        model. Its saved states stay: a reload of the same file and options can use them."""
        slot = self._slots.get(key)
        if slot is None:
            return
        try:
            self.park_live(key)
            self._writer.flush()
        finally:
            del self._slots[key]

    # -- serving a request ------------------------------------------------------------
    def prepare(
        self, key: str, prompt: Sequence[int], seq: int, *, exact: bool, tag: str = ""
    ) -> None:
        """Before a request runs in sequence `seq`: make its live KV state the best one for
        `prompt`, from its own state, another sequence's, or a saved one, among the states
        computed under the adapters `tag` names."""
        slot = self._slots.get(key)
        if slot is None:
            return
        self._writer.take_written()
        model = slot.model
        self.lookups += 1
        live = model.seq_tokens(seq)
        same = slot.tags.get(seq, "") == tag
        live_n = reusable(model.seq_tokens(seq, exact=exact), prompt, exact=exact) if same else 0
        best_n, source = live_n, ""
        for other in range(model.n_seq):
            if other != seq and slot.tags.get(other, "") == tag:
                n = reusable(model.seq_tokens(other, exact=exact), prompt, exact=exact)
                if n > best_n:
                    best_n, source = n, f"seq:{other}"
        mine = _owner(key, tag)
        for (owner, k), saved in self._ram.items():
            if owner == mine:
                n = reusable(saved.exact_tokens if exact else saved.tokens, prompt, exact=exact)
                if n > best_n:
                    best_n, source = n, f"ram:{k}"
        for k, entry in slot.shelf.entries.items() if slot.shelf is not None else ():
            if entry.tag != tag:
                continue
            usable = entry.tokens[: exact_n(entry)] if exact else entry.tokens
            n = reusable(usable, prompt, exact=exact)
            if n > best_n and n >= DISK_MIN_REUSE:
                best_n, source = n, f"disk:{k}"
        if live_n < len(live):
            self._park(key, slot, seq)  # the request keeps only part of the live state
            if not same:
                model.seq_keep(seq, 0)  # computed under other adapters: none of it is reusable
        slot.tags[seq] = tag
        if not source:
            return
        kind, _, name = source.partition(":")
        if kind == "seq":
            if model.seq_copy(int(name), seq, best_n):
                self.shared += 1
                slot.live_saved.discard(seq)
            return
        if kind == "ram":
            snap = self._ram.get((mine, name))
        else:
            assert slot.shelf is not None
            snap = slot.shelf.read(name, model)
        if snap is not None and model.load_kv(snap, seq):
            self.restored += 1
            slot.live_saved.add(seq)
            if kind == "ram":
                self._ram.move_to_end((mine, name))
            else:
                self._put_ram((mine, name), snap)
        elif snap is not None:
            log.warning("a saved KV state did not load; this request runs cold")
            self._ram.pop((mine, name), None)

    def quiet(self, yes: bool) -> None:
        """The engine has nothing to decode (True) or has: the disk writer writes only
        in a quiet spell (engine/kv_disk.py)."""
        self._writer.quiet(yes)

    def finished(self, key: str, seq: int, cached_tokens: int) -> None:
        """After a request: count the hit; the sequence's live state has changed."""
        self.hits += cached_tokens > 0
        slot = self._slots.get(key)
        if slot is not None:
            slot.live_saved.discard(seq)

    def park_live(self, key: str) -> None:
        """Save every live state of a model (at unload and shutdown: a restart finds them)."""
        slot = self._slots.get(key)
        if slot is not None:
            for seq in range(slot.model.n_seq):
                self._park(key, slot, seq)

    def _park(self, model_key: str, slot: _Slot, seq: int) -> None:
        live = slot.model.seq_tokens(seq)
        if seq in slot.live_saved or not live:
            return
        tag = slot.tags.get(seq, "")
        mkey = _owner(model_key, tag)
        key = _tokens_key(tuple(live), tag)
        if (mkey, key) in self._ram:
            self._ram.move_to_end((mkey, key))
            slot.live_saved.add(seq)
            return
        snap = slot.model.save_kv(seq, exact=False)
        if not snap.tokens:
            return
        slot.live_saved.add(seq)
        # a saved prefix of the new state is redundant: the new one answers all it could
        for (owner, old_key), old in list(self._ram.items()):
            if owner == mkey and covers(snap, old):
                del self._ram[(owner, old_key)]
        self._put_ram((mkey, key), snap)
        if slot.shelf is not None:
            self._writer.write(slot.shelf, slot.model, key, snap, tag)

    def _put_ram(self, key: tuple[str, str], snap: KVSnapshot) -> None:
        self._ram[key] = snap
        self._ram.move_to_end(key)
        while self._ram and self.ram_bytes > self.ram_budget:
            self._ram.popitem(last=False)
            self.evicted += 1

    # -- figures ----------------------------------------------------------------------
    @property
    def ram_bytes(self) -> int:
        return sum(s.ram_bytes for s in self._ram.values())

    @property
    def disk_bytes(self) -> int:
        return sum(slot.shelf.bytes for slot in self._slots.values() if slot.shelf is not None)

    def stats(self) -> dict[str, float]:
        """Figures for /health (read from another thread: retried if a dict moves under it)."""
        for _ in range(5):
            try:
                return self._stats()
            except RuntimeError:
                continue
        return {}

    def _stats(self) -> dict[str, float]:
        return {
            "ram_entries": len(self._ram),
            "ram_bytes": self.ram_bytes,
            "ram_budget_bytes": self.ram_budget,
            "disk_entries": sum(
                len(slot.shelf.entries) for slot in self._slots.values() if slot.shelf is not None
            ),
            "disk_bytes": self.disk_bytes,
            "disk_budget_bytes": self._writer.budget if self.disk_root is not None else 0,
            "requests": self.lookups,
            "hits": self.hits,
            "hit_rate": round(self.hits / self.lookups, 3) if self.lookups else 0.0,
            "restored": self.restored,
            "shared": self.shared,
            "evicted": self.evicted,
        }


def default_ram_budget() -> int:
    """A quarter of the memory available now, at most 8 GiB, at least 64 MiB."""
    import psutil

    return max(64 * _MIB, min(psutil.virtual_memory().available // 4, 8 * 1024 * _MIB))
