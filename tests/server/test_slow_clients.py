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

STALL_S = 2.0


@pytest.fixture(scope="module")
@starts_process
def slow(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """Two sequences, a 2 s stall bound, a 1 s header bound, 20 connections per client."""
    srv = ServerProcess(
        tmp_path_factory.mktemp("slow"), "--parallel", "2",
        env={"LOCALLLM_STALL_TIMEOUT_S": str(STALL_S), "LOCALLLM_HEADER_TIMEOUT_S": "1",
             "LOCALLLM_MAX_CONNECTIONS_PER_CLIENT": "20", "LOCALLLM_SPECULATE": "off",
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

        # a third request waits for a sequence: the first stalled reader gives its up
        answer = httpx.post(slow.base + "/v1/chat/completions", timeout=120, json={
            "model": "starter", "max_tokens": 8,
            "messages": [{"role": "user", "content": "Say hi"}]})
        assert answer.status_code == 200, answer.text
        assert answer.json()["choices"][0]["message"]["content"]

        body = _read_all(first).decode("utf-8", "replace")
        frames = [json.loads(line[6:]) for line in body.splitlines()
                  if line.startswith("data: {")]
        error = frames[-1]["error"]
        assert error["code"] == "client_stalled", error
        assert f"stall_timeout_s = {STALL_S:g}" in error["message"], error
        assert "1 other request(s) waited" in error["message"], error
        assert any(f.get("choices") for f in frames[:-1])  # what it had been sent came first

        # the second was paused, never cut: read now, it goes on to the end of its answer
        rest = _read_all(second).decode("utf-8", "replace")
        assert "data: [DONE]" in rest
        frames = [json.loads(line[6:]) for line in rest.splitlines()
                  if line.startswith("data: {")]
        tokens = sum(len((c.get("logprobs") or {}).get("content") or [])
                     for f in frames for c in f["choices"])
        assert tokens == LONG["max_tokens"], frames[-1]
        assert frames[-1]["choices"][0]["finish_reason"] == "length"
    finally:
        first.close()
        second.close()
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
def test_connections_from_one_address_are_capped(slow: ServerProcess):
    held = [socket.create_connection(("127.0.0.1", slow.port)) for _ in range(20)]
    try:
        extra = socket.create_connection(("127.0.0.1", slow.port))
        status, body = _response_of(extra)
        extra.close()
        assert status == 503
        assert body["error"]["code"] == "too_many_connections"
        assert "max_connections_per_client = 20" in body["error"]["message"]
    finally:
        for s in held:
            s.close()
    # the closed ones are counted out: the address may connect again
    _wait_for(lambda: httpx.get(slow.base + "/health", timeout=5).status_code == 200,
              "a request served after the held connections closed", 30)


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
