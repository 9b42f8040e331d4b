"""Raw HTTP: SSE framing, error shapes, body limits, disconnects, context overflow, busy."""

from __future__ import annotations

import json
import threading
import time

import httpx
import pytest

from tests.conftest import ServerProcess
from tests.hubserver import wait_for

CHAT = {"messages": [{"role": "user", "content": "Say hello."}], "temperature": 0}


def events(lines: list[str]) -> list[str]:
    return [ln.removeprefix("data: ") for ln in lines if ln.startswith("data: ")]


def assert_error(r: httpx.Response, status: int, code: str | None = None) -> dict:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert "Traceback" not in r.text
    if code is not None:
        assert err["code"] == code
    return dict(err)


def test_sse_framing(server: ServerProcess):
    with httpx.stream("POST", server.base + "/v1/chat/completions",
                      json={**CHAT, "max_tokens": 5, "stream": True}, timeout=30) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        raw = r.read().decode()
    assert raw.endswith("data: [DONE]\n\n")
    frames = [f for f in raw.split("\n\n") if f]
    assert all(f.startswith("data: ") for f in frames)
    payloads = [json.loads(f[6:]) for f in frames[:-1]]
    assert payloads[0]["choices"][0]["delta"]["role"] == "assistant"
    finishes = [p["choices"][0]["finish_reason"] for p in payloads if p["choices"]]
    assert finishes.count("length") == 1 and finishes[-1] == "length"
    assert len({p["id"] for p in payloads}) == 1
    assert all(p["object"] == "chat.completion.chunk" for p in payloads)


def test_malformed_json_is_400(server: ServerProcess):
    r = httpx.post(server.base + "/v1/chat/completions", content=b'{"messages": [',
                   headers={"content-type": "application/json"})
    err = assert_error(r, 400, "invalid_json")
    assert "not valid JSON" in err["message"]


def test_missing_and_wrong_fields_are_named(server: ServerProcess):
    err = assert_error(httpx.post(server.base + "/v1/chat/completions", json={}), 400)
    assert err["param"] == "messages" and "required" in err["message"]
    r = httpx.post(server.base + "/v1/chat/completions",
                   json={**CHAT, "messages": [{"role": "wizard", "content": "x"}]})
    assert assert_error(r, 400)["param"] == "messages.0.role"
    r = httpx.post(server.base + "/v1/completions", json={"prompt": "x", "top_p": 0})
    assert assert_error(r, 400)["param"] == "top_p"


def test_unknown_route_is_openai_shaped_404(server: ServerProcess):
    assert_error(httpx.get(server.base + "/v1/nothing"), 404)


def test_fim_suffix_without_fim_tokens_is_400(server: ServerProcess):
    r = httpx.post(server.base + "/v1/completions",
                   json={"prompt": "def add(a, b):\n    ", "suffix": "\n", "max_tokens": 4})
    err = assert_error(r, 400, "fim_not_supported")
    assert err["param"] == "suffix"


def test_client_disconnect_stops_generation(server: ServerProcess):
    before = server.health()["totals"]
    with httpx.stream("POST", server.base + "/v1/chat/completions", timeout=30,
                      json={"messages": [{"role": "user", "content": "Write a 2000 word essay."}],
                            "max_tokens": 2000, "stream": True, "temperature": 0}) as r:
        seen = 0
        for line in r.iter_lines():
            if line.startswith("data: "):
                seen += 1
            if seen >= 3:
                break  # leaving the block closes the connection
    # the next request is served, and the abandoned one did not run on to 2000 tokens
    r = httpx.post(server.base + "/v1/chat/completions", json={**CHAT, "max_tokens": 3},
                   timeout=60)
    assert r.status_code == 200
    after = server.health()["totals"]
    assert after["cancelled"] == before["cancelled"] + 1
    # ended before its limit (how soon is not a token count: test_engine_fake.py holds a
    # model mid-answer and cancels it there)
    assert after["generated_tokens"] - before["generated_tokens"] < 2000


def test_context_overflow_is_400_with_both_numbers(small_server: ServerProcess):
    long = "apple " * 400
    r = httpx.post(small_server.base + "/v1/chat/completions",
                   json={"messages": [{"role": "user", "content": long}]}, timeout=30)
    err = assert_error(r, 400, "context_length_exceeded")
    assert "256 tokens" in err["message"]
    prompt_tokens = int(err["message"].split("prompt has ")[1].split(" ")[0])
    assert prompt_tokens > 256


def test_oversized_body_is_413(small_server: ServerProcess):
    big = {"messages": [{"role": "user", "content": "x" * 70_000}]}
    err = assert_error(httpx.post(small_server.base + "/v1/chat/completions", json=big), 413)
    assert "65536" in err["message"]

    def chunked():  # no Content-Length: the limit still holds
        for _ in range(20):
            yield b"x" * 8192

    r = httpx.post(small_server.base + "/v1/chat/completions", content=chunked(),
                   headers={"content-type": "application/json"})
    assert_error(r, 413)


def test_full_queue_is_503_with_retry_after(small_server: ServerProcess):
    started = threading.Event()
    stop = threading.Event()

    def hold() -> None:
        with httpx.stream("POST", small_server.base + "/v1/completions", timeout=60,
                          json={"prompt": "Once upon a time", "max_tokens": 200,
                                "stream": True}) as r:
            for _ in r.iter_lines():
                started.set()
                if stop.is_set():
                    break

    t = threading.Thread(target=hold)
    t.start()
    try:
        assert started.wait(30)
        r = httpx.post(small_server.base + "/v1/completions", json={"prompt": "x",
                                                                   "max_tokens": 100})
        err = assert_error(r, 503, "server_busy")
        assert r.headers["retry-after"] == "1"
        assert "limit 1" in err["message"]
        # autocomplete (a raw completion of a few tokens) has places of its own
        r = httpx.post(small_server.base + "/v1/completions", json={"prompt": "x",
                                                                   "max_tokens": 1})
        assert r.status_code == 200, r.text
    finally:
        stop.set()
        t.join(30)
    for _ in range(100):
        if small_server.health()["queued"] == 0:
            break
        time.sleep(0.05)
    r = httpx.post(small_server.base + "/v1/completions", json={"prompt": "x", "max_tokens": 1})
    assert r.status_code == 200


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
def test_non_streaming_usage_shape(server: ServerProcess, path: str):
    body = {**CHAT, "max_tokens": 2} if "chat" in path else {"prompt": "Hi", "max_tokens": 2}
    usage = httpx.post(server.base + path, json=body, timeout=30).json()["usage"]
    assert usage["completion_tokens"] == 2
    assert "cached_tokens" in usage["prompt_tokens_details"]


async def test_health_is_503_until_a_model_is_loaded(settings, store):
    """In-process app over an engine that has loaded nothing yet."""
    from localllm.engine.engine import Engine
    from localllm.server.app import create_app

    engine = Engine(settings, store)
    try:
        transport = httpx.ASGITransport(app=create_app(settings, engine))
        async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as client:
            r = await client.get("/health")
            assert r.status_code == 503 and r.json()["status"] == "idle"
            engine.load("starter")
            r = await client.get("/health")
            assert r.status_code == 200 and r.json()["model"] == "starter"
    finally:
        engine.close()


def test_non_streaming_client_that_leaves_cancels_too(server: ServerProcess):
    before = server.health()["totals"]
    body = {"messages": [{"role": "user", "content": "Write a 2000 word essay."}],
            "max_tokens": 2000, "temperature": 0}
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(server.base + "/v1/chat/completions", json=body, timeout=1.0)
    for _ in range(200):  # the server notices within its poll interval
        if server.health()["queued"] == 0:
            break
        time.sleep(0.05)
    after = server.health()["totals"]
    assert after["cancelled"] == before["cancelled"] + 1
    # it ended before its limit (not a speed: test_engine_fake.py holds a model mid-answer)
    assert after["generated_tokens"] - before["generated_tokens"] < body["max_tokens"]


def test_priority_and_deterministic_fields(server: ServerProcess):
    body = {**CHAT, "max_tokens": 3, "priority": "high", "deterministic": True}
    r = httpx.post(server.base + "/v1/chat/completions", json=body, timeout=30)
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 3
    r = httpx.post(server.base + "/v1/completions",
                   json={"prompt": "Hi", "max_tokens": 2, "priority": "urgent"})
    err = assert_error(r, 400)
    assert err["param"] == "priority" and "high" in err["message"]
    r = httpx.post(server.base + "/v1/chat/completions", json={**CHAT, "deterministic": "yes!"})
    assert assert_error(r, 400)["param"] == "deterministic"


def test_health_shows_running_requests_and_their_prefill(server: ServerProcess):
    started, checked = threading.Event(), threading.Event()

    def hold() -> None:
        # a long answer, left after its first line until /health was read (on a busy
        # machine a short one could finish before /health answers), then closed
        with httpx.stream("POST", server.base + "/v1/completions", timeout=60,
                          json={"prompt": "Once upon a time", "max_tokens": 4000,
                                # the starter's end tokens (<|endoftext|>, <|im_end|>) off
                                "logit_bias": {"0": -100, "2": -100}, "stream": True}) as r:
            for _ in r.iter_lines():
                started.set()
                checked.wait(60)
                return

    t = threading.Thread(target=hold)
    t.start()
    try:
        assert started.wait(30)
        activity = server.health()["activity"]
        assert activity["active"] == 1
        (row,) = activity["requests"]
        assert row["model"] == "starter" and row["prompt_tokens"] > 0
        assert row["state"] in ("prefill", "decode")
    finally:
        checked.set()
        t.join(60)
    # the closed stream is cancelled: the server forgets it
    assert wait_for(lambda: server.health()["activity"]["active"] == 0, timeout=60)
