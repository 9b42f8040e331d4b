"""Clients that hold the server without using it (issue #32, items 2, 10 and 13): streams
whose readers never read, embeddings whose client left, and connections that trickle their
request head. Each against a real server on the starter."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from tests.conftest import ServerProcess, starts_process

STALL_S = 4.0
MAX_QUEUE = 4  # requests waiting or running; interactive ones get 2 places more


@pytest.fixture(scope="module")
@starts_process
def slow(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """Two sequences, a 4 s stall bound, a 1 s header bound, 20 connections per client,
    four requests in the queue."""
    srv = ServerProcess(
        tmp_path_factory.mktemp("slow"), "--parallel", "2",
        env={"LOCALLLM_STALL_TIMEOUT_S": str(STALL_S), "LOCALLLM_HEADER_TIMEOUT_S": "1",
             "LOCALLLM_MAX_CONNECTIONS_PER_CLIENT": "20", "LOCALLLM_SPECULATE": "off",
             "LOCALLLM_MAX_QUEUE": str(MAX_QUEUE), "LOCALLLM_BODY_TIMEOUT_S": "2",
             "LOCALLLM_LOG_LEVEL": "info"},
    )
    yield srv
    srv.stop()


def _raw_post(port: int, path: str, body: dict, *, rcvbuf: int | None = None) -> socket.socket:
    """A request sent on a socket that is then left unread (a tiny receive buffer makes the
    server's send block early)."""
    data = json.dumps(body).encode()
    s = socket.socket()
    if rcvbuf is not None:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    s.connect(("127.0.0.1", port))
    head = (f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(data)}\r\n\r\n").encode()
    s.sendall(head + data)
    return s


def _read_all(s: socket.socket, timeout: float = 120.0) -> bytes:
    s.settimeout(timeout)
    out: list[bytes] = []
    while True:
        piece = s.recv(65536)
        if not piece:
            return b"".join(out)
        out.append(piece)
        if b"data: [DONE]" in piece or out[-1].endswith(b"0\r\n\r\n"):
            return b"".join(out)


def _rows(srv: ServerProcess) -> list[dict]:
    return list(srv.health()["activity"]["requests"])


def _wait_for(check: Callable[[], Any], what: str, timeout: float = 120.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = check()
        if got:
            return got
        time.sleep(0.1)
    raise AssertionError(f"not seen in {timeout} s: {what}")


# a long answer with fat frames (20 alternatives per token): a client that does not read
# fills the server's send buffers within a few hundred tokens
LONG = {"model": "starter", "stream": True, "max_tokens": 600, "temperature": 1.0, "seed": 3,
        "logprobs": True, "top_logprobs": 20, "logit_bias": {"0": -100, "2": -100},
        "messages": [{"role": "user", "content": "Tell me a very long story about Rome."}]}


def _frames(raw: bytes) -> list[dict]:
    text = raw.decode("utf-8", "replace")
    return [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: {")]


@pytest.mark.process
def test_streams_that_are_not_read_pause_and_give_their_sequence_up(slow: ServerProcess):
    first = _raw_post(slow.port, "/v1/chat/completions", LONG, rcvbuf=2048)
    _wait_for(lambda: len(_rows(slow)) == 1, "the first stream running")
    second = _raw_post(slow.port, "/v1/chat/completions", LONG, rcvbuf=2048)
    try:
        # both fall behind and are paused: they keep their sequences, decode nothing
        rows = _wait_for(
            lambda: (r := _rows(slow)) and len(r) == 2 and all(x["state"] == "paused" for x in r)
            and r, "both streams paused")
        generated = sorted(r["generated"] for r in rows)
        assert generated[-1] < LONG["max_tokens"], rows
        time.sleep(0.5)
        assert sorted(r["generated"] for r in _rows(slow)) == generated  # nothing decoded

        # a paused stream read within its bound was never cut: it goes on to its end
        frames = _frames(_read_all(second))
        tokens = sum(len((c.get("logprobs") or {}).get("content") or [])
                     for f in frames for c in f["choices"])
        assert tokens == LONG["max_tokens"], frames[-1]
        assert frames[-1]["choices"][0]["finish_reason"] == "length"

        # one never read is given up after its bound, whether or not another waits
        frames = _frames(_read_all(first))
        error = frames[-1]["error"]
        assert error["code"] == "client_stalled", error
        assert f"stall_timeout_s = {STALL_S:g}" in error["message"], error
        assert any(f.get("choices") for f in frames[:-1])  # what it had been sent came first
    finally:
        first.close()
        second.close()
    _wait_for(lambda: not _rows(slow), "the server idle again", 30)


@pytest.mark.process
def test_a_local_client_that_never_reads_is_paused_within_its_bound(slow: ServerProcess):
    """Round 4: plain frames filled a never-read local socket (Linux grows its buffer) and
    the stream was never paused in 4,000 tokens; its stall clock never started, and a
    deterministic one, which holds back every request behind it, held them as long as
    its client stayed. The client's own socket is looked at now (server/unread.py): the
    stream pauses after about 64 KiB unread there, and ends after its stall bound."""
    body = {**LONG, "max_tokens": 3000, "deterministic": True}
    for key in ("logprobs", "top_logprobs"):
        body.pop(key)
    s = _raw_post(slow.port, "/v1/chat/completions", body)  # the kernel's own buffer
    try:
        rows = _wait_for(lambda: (r := _rows(slow)) and r[0]["state"] == "paused" and r,
                         "the stream paused", 180)
        assert rows[0]["generated"] < 1500, rows  # ~64 KiB of plain frames: ~700 tokens
        behind = httpx.post(slow.base + "/v1/chat/completions", timeout=120, json={
            "model": "starter", "max_tokens": 4,
            "messages": [{"role": "user", "content": "Say hi"}]})
        assert behind.status_code == 200, behind.text  # after the stall bound ended it
        frames = _frames(_read_all(s))
        assert frames[-1]["error"]["code"] == "client_stalled", frames[-1]
    finally:
        s.close()
    _wait_for(lambda: not _rows(slow), "the server idle again", 30)


@pytest.mark.process
def test_a_priority_request_gets_in_beside_a_full_queue_and_paused_streams(
    slow: ServerProcess,
):
    """Round 4: with the queue full of ordinary requests and every sequence held by
    clients that do not read, a priority request got 503 every time. It has places of
    its own in the queue now (a full queue of ordinary ones answers them 503), goes
    first, and takes the sequence of a stream whose reader has fallen behind."""
    import concurrent.futures

    held = [_raw_post(slow.port, "/v1/chat/completions", LONG, rcvbuf=2048) for _ in range(2)]
    pool = concurrent.futures.ThreadPoolExecutor(2)
    try:
        _wait_for(lambda: (r := _rows(slow)) and len(r) == 2
                  and all(x["state"] == "paused" for x in r), "both streams paused")
        ask = {"model": "starter", "max_tokens": 4,
               "messages": [{"role": "user", "content": "Say hi"}]}
        queued = [pool.submit(httpx.post, slow.base + "/v1/chat/completions", json=ask,
                              timeout=120) for _ in range(MAX_QUEUE - 2)]
        _wait_for(lambda: slow.health()["activity"]["queued"] >= MAX_QUEUE - 2,
                  "the queue full")  # two running, two waiting
        full = httpx.post(slow.base + "/v1/chat/completions", json=ask, timeout=60)
        assert full.status_code == 503 and full.json()["error"]["code"] == "server_busy"
        first = httpx.post(slow.base + "/v1/chat/completions", timeout=120,
                           json={**ask, "priority": "high"})
        assert first.status_code == 200, first.text
        ended = [_frames(_read_all(s))[-1] for s in held]
        assert any("a priority request needed its sequence" in f["error"]["message"]
                   for f in ended if "error" in f), ended
        assert all(q.result().status_code == 200 for q in queued)
    finally:
        pool.shutdown(wait=False)
        for s in held:
            s.close()
    _wait_for(lambda: not _rows(slow), "the server idle again", 30)


def _response_of(s: socket.socket) -> tuple[int, dict]:
    raw = _read_all(s, timeout=30)
    head, _, body = raw.partition(b"\r\n\r\n")
    return int(head.split()[1]), json.loads(body)


@pytest.mark.process
def test_a_request_head_that_trickles_is_answered_408_and_closed(slow: ServerProcess):
    s = socket.create_connection(("127.0.0.1", slow.port))
    head = b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: " + b"a" * 200
    sent = 0
    try:
        s.settimeout(0.2)
        while sent < len(head):  # a byte every 0.2 s: the whole head would take 40 s
            s.sendall(head[sent : sent + 1])
            sent += 1
            try:
                if s.recv(1, socket.MSG_PEEK):
                    break  # the server has answered
            except TimeoutError:
                continue
        assert sent < len(head)  # cut while it was still trickling
        status, body = _response_of(s)
        assert status == 408
        assert body["error"]["code"] == "header_timeout"
        assert "header_timeout_s" in body["error"]["message"]
        assert s.recv(1) == b""  # and closed
    finally:
        s.close()
    assert slow.health()["status"] == "ok"


@pytest.mark.process
def test_a_request_body_that_trickles_is_answered_408(slow: ServerProcess):
    """Round 4: a body trickled a byte every 4 s was never timed out; it has
    body_timeout_s (2 s here) in all now."""
    s = socket.create_connection(("127.0.0.1", slow.port))
    s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
              b"Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n")
    sent = 0
    try:
        s.settimeout(0.3)
        while sent < 1000:  # a byte every 0.3 s: the whole body would take 300 s
            s.sendall(b" ")
            sent += 1
            try:
                if s.recv(1, socket.MSG_PEEK):
                    break
            except TimeoutError:
                continue
        assert sent < 100
        status, body = _response_of(s)
        assert status == 408 and body["error"]["code"] == "body_timeout", body
        assert "body_timeout_s" in body["error"]["message"]
    finally:
        s.close()


def _closed_by_server(s: socket.socket) -> bool:
    s.settimeout(5)
    try:
        return s.recv(1) == b""
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


@pytest.mark.process
def test_a_local_process_holding_connections_cannot_lock_others_out(slow: ServerProcess):
    """Round 4: every local client shares 127.0.0.1, so one process holding 128 idle
    connections locked every other local client out (503). For loopback the bound is the
    server's total (4 x 20 here), and the connection idle longest makes room."""
    held = [socket.create_connection(("127.0.0.1", slow.port)) for _ in range(80)]
    try:
        for _ in range(3):  # others get in, again and again
            r = httpx.get(slow.base + "/health", timeout=10)
            assert r.status_code == 200, r.text
        closed = sum(_closed_by_server(s) for s in held[:10])  # the oldest made room
        assert closed >= 1
    finally:
        for s in held:
            s.close()


@pytest.mark.process
def test_embeddings_let_others_run_and_stop_when_their_client_leaves(slow: ServerProcess):
    # 400 inputs of about 1 KB: minutes of embedding work on one thread
    texts = [f"Paragraph {i}: " + "the quick brown fox jumps over the lazy dog " * 23
             for i in range(400)]
    s = _raw_post(slow.port, "/api/embed", {"model": "starter", "input": texts})
    try:
        time.sleep(1.0)  # let it begin
        answer = httpx.post(slow.base + "/v1/completions", timeout=120, json={
            "model": "starter", "prompt": "The capital of France is", "max_tokens": 4})
        assert answer.status_code == 200, answer.text
        s.setblocking(False)
        with pytest.raises(BlockingIOError):
            s.recv(1)  # answered while the embeddings still ran
    finally:
        s.close()  # the client leaves
    line = _wait_for(
        lambda: next((x for x in slow.log.read_text().splitlines()
                      if "embeddings: the client left after" in x), None),
        "the embeddings stopped", 120)
    done = int(line.split("left after ")[1].split(" of ")[0])
    assert 0 < done < len(texts), line
    # and the next request is served
    ok = httpx.post(slow.base + "/api/embed", json={"model": "starter", "input": ["a", "b"]},
                    timeout=60).json()
    assert len(ok["embeddings"]) == 2
