"""Between keys (#52): what a client key may not do (load, unload, pull, delete models,
set adapters, pin or unload through Ollama's keep_alive) and an admin key may; stored
responses that only their own key can read, continue, list or delete; the owner's own
commands through owner.key; embeddings counted and held against the key's quota; a
remote's credentials never shown; usage and answers kept while a database is locked.

The server tests run a real `localllm serve` (the starter) with keys made by the real
`localllm keys` command, over HTTP."""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from hypothesis import settings as hsettings
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, invariant, rule

from localllm.backends.remote import shown_url
from localllm.engine.accounting import OWNER, Accounting, owner_secret
from localllm.server.responses.store import ResponseStore
from tests.conftest import ServerProcess, starts_process
from tests.server.test_security import add_key, localllm


def bearer(secret: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {secret}"}


class Team:
    def __init__(self, srv: ServerProcess, keys: dict[str, str]) -> None:
        self.srv, self.keys = srv, keys

    def call(self, who: str, method: str, path: str, body: dict | None = None) -> httpx.Response:
        return httpx.request(method, self.srv.base + path, json=body,
                             headers=bearer(self.keys[who]), timeout=120)


@pytest.fixture(scope="module")
@starts_process
def team(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Team]:
    srv = ServerProcess(tmp_path_factory.mktemp("team"))
    try:
        keys = {
            "alice": add_key(srv, "alice"),
            "bob": add_key(srv, "bob", "--tokens-per-day", "100000"),
            "root": add_key(srv, "root", "--admin"),
        }
        yield Team(srv, keys)
    finally:
        srv.stop()


ADMIN_CALLS = [
    ("POST", "/admin/load", {"model": "starter", "keep_alive": -1}),
    ("POST", "/admin/unload", {"all": True}),
    ("POST", "/api/pull", {"model": "org/repo:Q4_K_M"}),
    ("DELETE", "/api/delete", {"model": "starter"}),
    ("POST", "/lora-adapters", [{"id": 0, "scale": 0.5}]),
    ("POST", "/api/generate", {"model": "starter", "keep_alive": 0}),
    ("POST", "/api/chat", {"model": "starter", "messages": [], "keep_alive": -1}),
]


@pytest.mark.parametrize("method, path, body", ADMIN_CALLS)
def test_a_client_key_may_not_change_the_server_for_everyone(
    team: Team, method: str, path: str, body: dict
):
    r = team.call("alice", method, path, body)
    assert r.status_code == 403, (r.status_code, r.text)
    text = r.text
    assert "admin key" in text and "'alice' is a client key" in text and "--admin" in text
    # the model is still loaded for everyone, and alice's own requests still run
    assert httpx.get(team.srv.base + "/health", timeout=30).json()["model"] == "starter"


def test_an_admin_key_may(team: Team):
    r = team.call("root", "POST", "/admin/load", {"model": "starter", "keep_alive": -1})
    assert r.status_code == 200, r.text
    r = team.call("root", "POST", "/api/generate", {"model": "starter", "keep_alive": "5m"})
    assert r.status_code == 200 and r.json()["done_reason"] == "load"
    # a client's own keep_alive (not pinning, not unloading) is a client's to give
    r = team.call("alice", "POST", "/api/generate", {"model": "starter", "keep_alive": "5m"})
    assert r.status_code == 200, r.text


def test_the_owners_own_commands_use_owner_key(team: Team):
    """`localllm load` / `stop` from the user who owns the data folder: no key to set."""
    done = localllm(team.srv, "load", "starter", "--ttl", "-1", "--port", str(team.srv.port))
    assert done.returncode == 0, done.stderr
    key = team.srv.log.parent / "data" / "owner.key"
    assert key.stat().st_mode & 0o777 == 0o600
    r = httpx.post(team.srv.base + "/admin/load", json={"model": "starter"},
                   headers=bearer(key.read_text()), timeout=120)
    assert r.status_code == 200


def _response(team: Team, who: str, **extra: object) -> httpx.Response:
    body = {"model": "starter", "input": "Say hi", "max_output_tokens": 4, "temperature": 0}
    return team.call(who, "POST", "/v1/responses", {**body, **extra})


def test_a_stored_response_is_its_own_keys_alone(team: Team):
    made = _response(team, "alice")
    assert made.status_code == 200, made.text
    rid = made.json()["id"]
    for path in (f"/v1/responses/{rid}", f"/v1/responses/{rid}/input_items"):
        assert team.call("bob", "GET", path).status_code == 404
        assert team.call("root", "GET", path).status_code == 404  # admin or not
        assert team.call("alice", "GET", path).status_code == 200
    cont = _response(team, "bob", previous_response_id=rid)
    assert cont.status_code == 404 and "previous_response_id" in cont.text
    assert team.call("bob", "DELETE", f"/v1/responses/{rid}").status_code == 404
    assert _response(team, "alice", previous_response_id=rid).status_code == 200
    assert team.call("alice", "DELETE", f"/v1/responses/{rid}").status_code == 200
    assert team.call("alice", "GET", f"/v1/responses/{rid}").status_code == 404


def test_embeddings_are_counted_in_the_keys_usage(team: Team):
    path = team.srv.log.parent / "data" / "gateway.sqlite3"
    before = _tokens(path, "bob")
    r = team.call("bob", "POST", "/v1/embeddings", {"model": "starter", "input": ["a b c"] * 3})
    assert r.status_code == 200, r.text
    used = r.json()["usage"]["prompt_tokens"]
    deadline = time.monotonic() + 60
    while _tokens(path, "bob") < before + used and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _tokens(path, "bob") == before + used


def _tokens(path: Path, client: str) -> int:
    with sqlite3.connect(path) as db:
        row = db.execute(
            "SELECT SUM(prompt_tokens + completion_tokens) FROM usage WHERE client = ?", (client,)
        ).fetchone()
    return int(row[0] or 0)


@pytest.mark.process
def test_embeddings_past_the_quota_are_429(tmp_path: Path):
    srv = ServerProcess(tmp_path)
    try:
        secret = add_key(srv, "tiny", "--tokens-per-day", "20")
        body = {"model": "starter", "input": ["one two three four five six seven"] * 8}
        r = httpx.post(srv.base + "/v1/embeddings", json=body, headers=bearer(secret),
                       timeout=120)
        assert r.status_code == 429, r.text
        assert "'tiny'" in r.text and "of its 20 tokens" in r.text and "need 56" in r.text
    finally:
        srv.stop()


@pytest.mark.parametrize("url, shown", [
    ("http://user:secret@gpu.lan:8000/v1", "http://gpu.lan:8000/v1"),
    ("https://:token@[::1]/v1", "https://[::1]/v1"),
    ("http://gpu.lan/v1", "http://gpu.lan/v1"),
])
def test_a_remotes_credentials_are_never_shown(url: str, shown: str):
    assert shown_url(url) == shown


# -- a database another program holds locked ----------------------------------------------
def test_usage_survives_a_locked_database_and_key_checks_do_not_wait(tmp_path: Path):
    accounting = Accounting(tmp_path / "gateway.sqlite3")
    try:
        accounting.add_key("k")
        holder = sqlite3.connect(tmp_path / "gateway.sqlite3", isolation_level=None)
        holder.execute("BEGIN EXCLUSIVE")  # an sqlite3 shell, a backup tool
        for _ in range(17):
            accounting.record("k", 10, 0, 5, 0.1)
        # key checks go on from memory while the writer waits for the lock
        checked = threading.Event()

        def check() -> None:
            key = accounting.list_keys()[0]
            accounting.over_quota(key)
            accounting.tokens_today("k")
            checked.set()

        threading.Thread(target=check, daemon=True).start()
        assert checked.wait(30), "a key check waited for the locked database"
        assert accounting.tokens_today("k") == 17 * 15
        time.sleep(1.5)  # the writer has tried and failed meanwhile
        holder.execute("COMMIT")
        holder.close()
        accounting.flush()
        assert accounting.totals()["k"].requests == 17  # none dropped
    finally:
        accounting.close()


def test_owner_secret_is_made_once_and_shared(tmp_path: Path):
    secrets_seen: list[str] = []
    threads = [
        threading.Thread(target=lambda: secrets_seen.append(owner_secret(tmp_path)))
        for _ in range(8)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(secrets_seen)) == 1 and (tmp_path / "owner.key").stat().st_mode & 0o077 == 0
    accounting = Accounting(tmp_path / "gateway.sqlite3")
    try:
        key = accounting.lookup(secrets_seen[0])
        assert key is not None and key.name == OWNER and key.admin
        with pytest.raises(Exception, match="owner"):
            accounting.add_key(OWNER)
    finally:
        accounting.close()


class Ownership(RuleBasedStateMachine):
    """Stored responses under any sequence of puts, continuations, reads and deletes by
    several keys: a key sees exactly the responses it stored and has not deleted, and
    each one's conversation stays whole whatever was deleted before it."""

    def __init__(self) -> None:
        super().__init__()
        import tempfile

        self.dir = tempfile.TemporaryDirectory()
        self.store = ResponseStore(Path(self.dir.name) / "responses.db")
        self.model: dict[str, str] = {}  # id -> owner, while stored
        self.chains: dict[str, list[dict]] = {}  # id -> its conversation as put
        self.made = 0

    ids = Bundle("ids")

    def _put(self, owner: str, previous: str | None) -> str:
        self.made += 1
        rid = f"resp_{self.made}"
        own = [{"id": f"in_{self.made}"}]
        out = [{"id": f"out_{self.made}"}]
        self.store.put({"id": rid, "output": out}, own, owner, previous)
        self.model[rid] = owner
        self.chains[rid] = (self.chains[previous] if previous else []) + own + out
        return rid

    @rule(target=ids, owner=st.sampled_from(["alice", "bob", "root", "anonymous"]))
    def put(self, owner: str) -> str:
        return self._put(owner, None)

    @rule(target=ids, rid=ids, who=st.sampled_from(["alice", "bob", "root", "anonymous"]))
    def continue_(self, rid: str, who: str) -> str:
        """What the route does: the previous response is looked up as the caller's, and
        continued only when found."""
        found = self.store.conversation(rid, who)
        assert (found is not None) == (self.model.get(rid) == who)
        return self._put(who, rid if found is not None else None)

    @rule(rid=ids, who=st.sampled_from(["alice", "bob", "root", "anonymous"]))
    def read(self, rid: str, who: str) -> None:
        mine = self.model.get(rid) == who
        assert (self.store.body(rid, who) is not None) == mine
        assert (self.store.input_items(rid, who) is not None) == mine
        assert self.store.conversation(rid, who) == (self.chains[rid] if mine else None)

    @rule(rid=ids, who=st.sampled_from(["alice", "bob", "root", "anonymous"]))
    def delete(self, rid: str, who: str) -> None:
        mine = self.model.get(rid) == who
        assert self.store.delete(rid, who) == mine
        if mine:
            del self.model[rid]

    @invariant()
    def nothing_else_seen_and_every_chain_whole(self) -> None:
        for rid, owner in self.model.items():
            assert self.store.conversation(rid, owner) == self.chains[rid]
            for other in ("alice", "bob", "root", "anonymous"):
                if other != owner:
                    assert self.store.body(rid, other) is None

    def teardown(self) -> None:
        self.store.close()
        self.dir.cleanup()


Ownership.TestCase.settings = hsettings(max_examples=40, stateful_step_count=30, deadline=None)
test_stored_responses_belong_to_their_key = Ownership.TestCase


def test_two_host_headers_are_a_400(team: Team):
    """`evil.example` then `localhost`: whichever a check reads, the request is refused."""
    import socket

    with socket.create_connection(("127.0.0.1", team.srv.port), timeout=30) as sock:
        sock.sendall(
            b"GET /health HTTP/1.1\r\nHost: evil.example\r\nHost: localhost\r\n"
            b"Connection: close\r\n\r\n"
        )
        reply = b""
        while chunk := sock.recv(65536):
            reply += chunk
    assert reply.startswith(b"HTTP/1.1 400"), reply[:200]
    assert b"2 Host headers" in reply


MARK = "<__localllm_media__>"
MARKED = [  # the fields where client text reaches the prompt unchecked one by one (#52)
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}], "tools": [
        {"type": "function", "function": {"name": "f", "description": f"x {MARK} y"}}]}),
    ("/v1/chat/completions", {"messages": [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "type": "function",
         "function": {"name": "f", "arguments": f'{{"a": "{MARK}"}}'}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "ok"}]}),
    ("/v1/messages", {"max_tokens": 4, "messages": [{"role": "user", "content": "Hi"}],
                      "tools": [{"name": "f", "description": MARK,
                                 "input_schema": {"type": "object"}}]}),
    ("/v1/messages", {"max_tokens": 4, "messages": [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "f",
                                           "input": {"a": MARK}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1",
                                      "content": "ok"}]}]}),
    ("/v1/responses", {"input": "Hi", "instructions": f"be {MARK} brief"}),
    ("/api/generate", {"prompt": "Hi", "system": f"x {MARK}", "stream": False}),
]


@pytest.mark.parametrize("route, body", MARKED)
def test_the_reserved_picture_marker_in_any_field_is_a_400(team: Team, route: str, body: dict):
    body = {"model": "starter", "max_tokens": 4, **body} if route != "/api/generate" else {
        "model": "starter", **body}
    if route == "/v1/responses":
        body.pop("max_tokens")
    r = team.call("alice", "POST", route, body)
    assert r.status_code == 400, (r.status_code, r.text[:300])
    assert "localllm reserves" in r.text


@pytest.mark.parametrize("tools", [
    [{"type": "function", "name": "bad name!"}],
    [{"type": "function"}],
    [{"type": "function", "name": "f", "parameters": [1, 2]}],
    [{"type": "namespace", "name": "ns", "tools": [{"type": "function", "name": "bad name!"}]}],
])
def test_a_malformed_responses_tool_is_a_400_naming_tools(team: Team, tools: list):
    r = _response(team, "alice", tools=tools)
    assert r.status_code == 400, (r.status_code, r.text[:300])
    assert r.json()["error"]["param"] is not None and "tools" in r.json()["error"]["param"]


def test_a_long_conversation_is_stored_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """Round 4: six continuations carrying a 7 MB item made responses.db 250 MB (each row
    copied the chain before it). Each row holds its own items now: seven turns after a
    1 MB item store about 1 MB, and the oldest going (or being deleted) keeps the rest
    whole."""
    store = ResponseStore(tmp_path / "responses.db")
    big = {"type": "reasoning", "encrypted_content": "x" * 1_000_000}
    previous = None
    for turn in range(7):
        rid = f"resp_{turn}"
        store.put({"id": rid, "output": [{"t": turn}]}, [big] if turn == 0 else [], "a", previous)
        previous = rid
    with store._lock:
        stored = store._db.execute(
            "SELECT sum(length(body) + length(input_items) + length(conversation) "
            "+ length(before)) FROM responses"
        ).fetchone()[0]
    assert 1_000_000 < stored < 1_100_000
    whole = [big] + [{"t": t} for t in range(7)]
    assert store.conversation("resp_6", "a") == whole
    assert store.delete("resp_0", "a") and store.delete("resp_3", "a")
    assert store.conversation("resp_6", "a") == whole
    monkeypatch.setattr("localllm.server.responses.store.MAX_RESPONSES", 2)
    store.put({"id": "resp_7", "output": [{"t": 7}]}, [], "a", "resp_6")  # the oldest go
    assert store.body("resp_1", "a") is None and store.body("resp_6", "a") is not None
    assert store.conversation("resp_7", "a") == [*whole, {"t": 7}]
    store.close()


def test_rows_from_before_the_chain_are_read_and_continued(tmp_path: Path):
    """A store written by the previous version (the whole conversation in each row) is
    read as it is, and a continuation of one of its rows adds only its own items."""
    import sqlite3

    path = tmp_path / "responses.db"
    db = sqlite3.connect(path)
    db.execute(
        "CREATE TABLE responses (id TEXT PRIMARY KEY, created REAL NOT NULL, body TEXT NOT "
        "NULL, input_items TEXT NOT NULL, conversation TEXT NOT NULL, owner TEXT NOT NULL "
        "DEFAULT 'anonymous')"
    )
    db.execute(
        "INSERT INTO responses VALUES ('resp_old', 1.0, ?, '[]', ?, 'a')",
        ('{"id": "resp_old", "output": [{"o": 2}]}', '[{"i": 1}, {"o": 2}]'),
    )
    db.commit()
    db.close()
    store = ResponseStore(path)
    assert store.conversation("resp_old", "a") == [{"i": 1}, {"o": 2}]
    store.put({"id": "resp_new", "output": [{"o": 4}]}, [{"i": 3}], "a", "resp_old")
    assert store.conversation("resp_new", "a") == [{"i": 1}, {"o": 2}, {"i": 3}, {"o": 4}]
    assert store.delete("resp_old", "a")
    assert store.conversation("resp_new", "a") == [{"i": 1}, {"o": 2}, {"i": 3}, {"o": 4}]
    store.close()
