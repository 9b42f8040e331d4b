"""API keys, per-client usage by day, and quotas, kept in SQLite under the data directory.

A key is shown once, when it is made, and stored only as its SHA-256 digest (a key is
32 random bytes, so a fast hash is enough). Lookups compare the presented key's digest
with every stored digest in constant time. The server reads the keys again whenever
another process (`localllm keys rm`) changed the database, so a revoked key stops
working with the next request.

A key is a client's (completions, embeddings, its own stored responses) unless it was
made with `admin`: loading, unloading, pulling and deleting models and setting LoRA
adapters need an admin key once keys exist (server/guard.py). The owner of the data
folder is an admin without making a key: `owner.key` beside the database holds a secret
readable by that user only, which the CLI sends to its server (`owner_secret`).

Usage is counted per client (a key's name, "anonymous" for requests without a key when
none are configured, "chat" for the terminal chat, "owner") and per UTC day: requests,
prompt, cached and completion tokens, and seconds spent. Quotas (requests per minute,
tokens per day) are checked from memory before a request runs; the database is written
by a thread of its own with a connection of its own, off the engine's path: a database
another program holds locked delays the writes (retried with backoff until they land),
never a request, and loses nothing.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import logging
import math
import os
import secrets
import sqlite3
import threading
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

from localllm.engine.usage_writer import UsageWriter
from localllm.errors import InvalidRequest, QuotaExceeded

if TYPE_CHECKING:
    from localllm.backends.base import Chunk
    from localllm.config import Settings

log = logging.getLogger(__name__)

KEY_PREFIX = "sk-localllm-"
_SCHEMA = """
CREATE TABLE IF NOT EXISTS keys (
    name TEXT PRIMARY KEY,
    digest TEXT NOT NULL UNIQUE,
    hint TEXT NOT NULL,
    created REAL NOT NULL,
    rpm INTEGER,
    tokens_per_day INTEGER,
    admin INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS usage (
    client TEXT NOT NULL,
    day TEXT NOT NULL,
    requests INTEGER NOT NULL DEFAULT 0,
    prompt_tokens INTEGER NOT NULL DEFAULT 0,
    cached_tokens INTEGER NOT NULL DEFAULT 0,
    completion_tokens INTEGER NOT NULL DEFAULT 0,
    seconds REAL NOT NULL DEFAULT 0,
    PRIMARY KEY (client, day)
);
"""
MAX_NAME = 64
OWNER = "owner"  # the client name of the owner's secret (owner.key)
OWNER_FILE = "owner.key"


@dataclass(frozen=True, slots=True)
class Key:
    name: str
    digest: str
    hint: str  # the key's first characters, to tell keys apart in a listing
    created: float
    rpm: int | None  # requests per minute; None: no limit
    tokens_per_day: int | None  # prompt + completion tokens per UTC day; None: no limit
    admin: bool = False  # may load, unload, pull and delete models and set adapters


@dataclass(frozen=True, slots=True)
class Usage:
    client: str
    day: str
    requests: int
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    seconds: float

    def as_dict(self) -> dict[str, object]:
        return {
            "client": self.client,
            "day": self.day,
            "requests": self.requests,
            "prompt_tokens": self.prompt_tokens,
            "cached_tokens": self.cached_tokens,
            "completion_tokens": self.completion_tokens,
            "seconds": round(self.seconds, 3),
        }


def today(now: float | None = None) -> str:
    return datetime.fromtimestamp(time.time() if now is None else now, timezone.utc).strftime(
        "%Y-%m-%d"
    )


def seconds_to_midnight(now: float | None = None) -> int:
    """Seconds until the next UTC day begins (when a daily quota resets)."""
    t = time.time() if now is None else now
    return max(1, math.ceil(86400 - t % 86400))


def digest(secret: str) -> str:
    return hashlib.sha256(secret.encode("utf-8", "surrogatepass")).hexdigest()


class Accounting:
    """The keys and usage database; safe to share between threads."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._db = sqlite3.connect(path, check_same_thread=False, timeout=10)
        self._lock = threading.Lock()
        with self._lock:
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=NORMAL")
            self._db.executescript(_SCHEMA)
            columns = {row[1] for row in self._db.execute("PRAGMA table_info(keys)")}
            if "admin" not in columns:  # a database made before roles: every key a client
                self._db.execute("ALTER TABLE keys ADD COLUMN admin INTEGER NOT NULL DEFAULT 0")
            self._db.commit()
        self._owner: str | None = None  # the owner's secret's digest, once read
        self._keys: list[Key] = []
        self._version = -1
        self._recent: dict[str, deque[float]] = {}  # admitted request times, per client
        self._tokens_today: dict[tuple[str, str], int] = {}
        self._reserved: dict[str, int] = {}  # tokens held by running requests, per client
        self._writer = UsageWriter(path)  # usage reaches the database off the request path

    # -- keys ----------------------------------------------------------------------
    def add_key(
        self,
        name: str,
        *,
        rpm: int | None = None,
        tokens_per_day: int | None = None,
        admin: bool = False,
    ) -> str:
        """Make a key named `name`; return its secret (the only time it is seen)."""
        check_name(name)
        if name == OWNER:
            raise InvalidRequest(
                f"'{OWNER}' names the data folder's owner (owner.key); choose another name",
                param="name",
            )
        secret = KEY_PREFIX + secrets.token_urlsafe(32)
        with self._lock:
            try:
                self._db.execute(
                    "INSERT INTO keys (name, digest, hint, created, rpm, tokens_per_day, admin)"
                    " VALUES (?, ?, ?, ?, ?, ?, ?)",
                    (
                        name,
                        digest(secret),
                        secret[: len(KEY_PREFIX) + 4],
                        time.time(),
                        rpm,
                        tokens_per_day,
                        int(admin),
                    ),
                )
                self._db.commit()
                self._version = -1  # this connection's own writes do not move data_version
            except sqlite3.IntegrityError:
                raise InvalidRequest(
                    f"a key named '{name}' exists already; remove it first "
                    f"(localllm keys rm {name}) or choose another name",
                    param="name",
                ) from None
        return secret

    def remove_key(self, name: str) -> bool:
        with self._lock:
            cur = self._db.execute("DELETE FROM keys WHERE name = ?", (name,))
            self._db.commit()
            self._version = -1
            return cur.rowcount > 0

    def list_keys(self) -> list[Key]:
        """The keys as stored now (re-read when another process changed them)."""
        with self._lock:
            version = self._db.execute("PRAGMA data_version").fetchone()[0]
            if version != self._version:
                rows = self._db.execute(
                    "SELECT name, digest, hint, created, rpm, tokens_per_day, admin FROM keys "
                    "ORDER BY created"
                ).fetchall()
                self._keys = [
                    Key(name, dig, hint, created, rpm, tpd, admin=bool(admin))
                    for name, dig, hint, created, rpm, tpd, admin in rows
                ]
                self._version = version
            return self._keys

    def lookup(self, secret: str) -> Key | None:
        """The key whose secret this is, comparing with every key in constant time; the
        owner's secret is an admin key named "owner" with no limits."""
        presented = digest(secret)
        found = None
        for key in self.list_keys():
            if hmac.compare_digest(presented, key.digest):
                found = key
        if self._owner is None:
            self._owner = digest(owner_secret(self.path.parent))
        if hmac.compare_digest(presented, self._owner):
            found = Key(OWNER, self._owner, "", 0.0, None, None, admin=True)
        return found

    # -- quotas --------------------------------------------------------------------
    def over_quota(self, key: Key, now: float | None = None) -> tuple[str, int] | None:
        """(why, seconds to wait) when `key` may not make a request now; else None, and
        the request counts toward its per-minute limit."""
        t = time.time() if now is None else now
        if key.tokens_per_day is not None:
            used = self.tokens_today(key.name, t)
            if used >= key.tokens_per_day:
                return (
                    f"the key '{key.name}' has used {used} of its {key.tokens_per_day} "
                    "tokens for today (UTC)",
                    seconds_to_midnight(t),
                )
        if key.rpm is not None:
            with self._lock:
                recent = self._recent.setdefault(key.name, deque())
                while recent and recent[0] <= t - 60:
                    recent.popleft()
                if len(recent) >= key.rpm:
                    wait = max(1, math.ceil(recent[0] + 60 - t))
                    return (
                        f"the key '{key.name}' is limited to {key.rpm} requests per minute",
                        wait,
                    )
                recent.append(t)
        return None

    def reserve(self, client: str, prompt: int, max_tokens: int | None) -> tuple[int | None, int]:
        """Admit a request of `client` against what its key has left today: (the
        max_tokens it may use, the tokens reserved for it until `settle`). The answer's
        limit is cut to what is left after the prompt; a prompt that does not fit is
        QuotaExceeded. Reservations of requests running at once count, so parallel
        requests cannot overspend."""
        key = next((k for k in self.list_keys() if k.name == client), None)
        if key is None or key.tokens_per_day is None:
            return max_tokens, 0
        t = time.time()
        used = self.tokens_today(client, t)
        with self._lock:
            held = self._reserved.get(client, 0)
            left = key.tokens_per_day - used - held
            if left <= prompt:
                wait = seconds_to_midnight(t)
                raise QuotaExceeded(
                    f"Rate limit: the key '{client}' has {max(0, left)} of its "
                    f"{key.tokens_per_day} tokens for today (UTC) left ({used} used, {held} "
                    f"held by requests running now), and this prompt is {prompt} tokens; "
                    f"try again in {wait} s.",
                    wait,
                )
            granted = left - prompt if max_tokens is None else min(max_tokens, left - prompt)
            self._reserved[client] = held + prompt + granted
        return granted, prompt + granted

    def limited(self, client: str) -> bool:
        """Whether `client`'s key has a daily token limit."""
        return any(k.name == client and k.tokens_per_day is not None for k in self.list_keys())

    def check_tokens(self, client: str, pending: int, what: str) -> None:
        """QuotaExceeded when `client`'s key has not `pending` tokens left today (the
        embeddings or rerank of a request, counted piece by piece before each is read)."""
        key = next((k for k in self.list_keys() if k.name == client), None)
        if key is None or key.tokens_per_day is None:
            return
        t = time.time()
        used = self.tokens_today(client, t)
        with self._lock:
            held = self._reserved.get(client, 0)
        if used + held + pending > key.tokens_per_day:
            wait = seconds_to_midnight(t)
            raise QuotaExceeded(
                f"Rate limit: the key '{client}' has used {used} of its {key.tokens_per_day} "
                f"tokens for today (UTC) and {held} are held by requests running now; these "
                f"{what} need {pending}; try again in {wait} s.",
                wait,
            )

    def settle(self, client: str, reserved: int) -> None:
        """A request admitted by `reserve` ended: what it used is counted by `record`."""
        if reserved:
            with self._lock:
                self._reserved[client] = max(0, self._reserved.get(client, 0) - reserved)

    def tokens_today(self, client: str, now: float | None = None) -> int:
        day = today(now)
        with self._lock:
            if (client, day) not in self._tokens_today:
                row = self._db.execute(
                    "SELECT prompt_tokens + completion_tokens FROM usage "
                    "WHERE client = ? AND day = ?",
                    (client, day),
                ).fetchone()
                self._tokens_today[(client, day)] = int(row[0]) if row else 0
            return self._tokens_today[(client, day)]

    @classmethod
    def for_settings(cls, settings: Settings) -> Accounting:
        return cls(settings.data_dir / "gateway.sqlite3")

    # -- usage ---------------------------------------------------------------------
    def observe(self, request: Any, model: str, final: Chunk, seconds: float) -> None:
        """An engine observer: count a finished request under its `client`."""
        stats = final.stats
        if stats is not None:
            self.record(
                request.client,
                stats.prompt_tokens,
                stats.cached_tokens,
                stats.generated_tokens,
                seconds,
            )

    def record(
        self, client: str, prompt: int, cached: int, completion: int, seconds: float
    ) -> None:
        """Count one finished request (any thread; written to the database off it)."""
        day = today()
        self.tokens_today(client)  # start today's count from the database first
        with self._lock:
            self._tokens_today[(client, day)] += prompt + completion
        self._writer.put((client, day, prompt, cached, completion, seconds))

    def flush(self) -> None:
        """Wait until every recorded request is in the database."""
        self._writer.flush()

    def usage(self, days: int | None = None) -> list[Usage]:
        """Usage rows, newest day first; `days`: only the last that many days."""
        self.flush()
        since = today(time.time() - (days - 1) * 86400) if days else "0000-00-00"
        with self._lock:
            rows = self._db.execute(
                "SELECT client, day, requests, prompt_tokens, cached_tokens, completion_tokens,"
                " seconds FROM usage WHERE day >= ? ORDER BY day DESC, client",
                (since,),
            ).fetchall()
        return [Usage(*row) for row in rows]

    def totals(self) -> dict[str, Usage]:
        """Each client's usage over all days."""
        self.flush()
        with self._lock:
            rows = self._db.execute(
                "SELECT client, '', SUM(requests), SUM(prompt_tokens), SUM(cached_tokens), "
                "SUM(completion_tokens), SUM(seconds) FROM usage GROUP BY client"
            ).fetchall()
        return {row[0]: Usage(*row) for row in rows}

    def close(self) -> None:
        self._writer.close()
        with self._lock:
            self._db.close()


def owner_secret(data_dir: Path) -> str:
    """The owner's secret for the servers of this data folder (`owner.key`, made once,
    readable by its user only): the CLI sends it to its own server, which takes it as an
    admin key. Made with O_EXCL, so two servers starting together agree on one."""
    path = data_dir / OWNER_FILE
    for _ in range(3):
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
        except FileNotFoundError:
            data_dir.mkdir(parents=True, exist_ok=True)
            secret = "sk-localllm-owner-" + secrets.token_urlsafe(32)
            try:
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
            except FileExistsError:
                continue  # another process made it first: read theirs
            try:
                os.write(fd, secret.encode())
                os.fsync(fd)
            finally:
                os.close(fd)
            return secret
        with os.fdopen(fd, "rb") as fh:
            text = fh.read(256).decode("ascii", "replace").strip()
        if text:
            return text
        time.sleep(0.05)  # made a moment ago and not written yet
    raise OSError(f"{path} is empty; remove it and start the server again")


def check_name(name: str) -> None:
    ok = name and len(name) <= MAX_NAME and all(c.isalnum() or c in "-_." for c in name)
    if not ok:
        raise InvalidRequest(
            f"a key name is 1 to {MAX_NAME} letters, digits, '-', '_' or '.', got {name!r}",
            param="name",
        )


@contextlib.contextmanager
def opened(path: Path) -> Iterator[Accounting]:
    accounting = Accounting(path)
    try:
        yield accounting
    finally:
        accounting.close()
