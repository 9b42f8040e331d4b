"""Remote engines: localllm fronting llama-cpp-python's own server and a second localllm
serve, through the official clients; failures against a closed port and a scripted
engine that answers 429 (control flow a real engine cannot stage on demand)."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import jsonschema
import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam

from localllm.backends.base import ModelRef
from tests.conftest import ServerProcess, body_of, extra_of, free_port, loads_model, usage_of
from tests.remote_engines import LlamaCppServer
from tests.server.test_tools import TOOLS, WEATHER_PARAMS

ASK: list[ChatCompletionMessageParam] = [{"role": "user", "content": "Say hello to the team."}]


class Scripted(BaseHTTPRequestHandler):
    """An engine that says 429 (Retry-After: 1) to every other chat request, and streams
    a fixed two-piece answer to the rest."""

    calls = 0
    lock = threading.Lock()

    def log_message(self, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        self._json(200, {"object": "list", "data": [{"id": "canned", "max_model_len": 4096}]})

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("content-length", 0)))
        with Scripted.lock:
            Scripted.calls += 1
            odd = Scripted.calls % 2 == 1
        if odd:
            self.send_response(429)
            self.send_header("Retry-After", "1")
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        for piece in ("Hello", " team"):
            event = {"choices": [{"index": 0, "delta": {"content": piece}}]}
            self.wfile.write(f"data: {json.dumps(event)}\n\n".encode())
        end = {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}],
               "usage": {"prompt_tokens": 7, "completion_tokens": 2,
                         "prompt_tokens_details": {"cached_tokens": 5}}}
        self.wfile.write(f"data: {json.dumps(end)}\n\ndata: [DONE]\n\n".encode())

    def _json(self, status: int, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


class Endless(BaseHTTPRequestHandler):
    """An engine that ignores max_tokens and never ends its stream (until the reader
    goes): localllm must cut it."""

    def log_message(self, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        data = json.dumps({"object": "list", "data": [{"id": "chatty"}]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("content-length", 0)))
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        event = {"choices": [{"index": 0, "delta": {"content": " more"}}]}
        try:
            while True:
                self.wfile.write(f"data: {json.dumps(event)}\n\n".encode())
        except OSError:  # localllm closed the request
            return


class Malformed(BaseHTTPRequestHandler):
    """An engine whose streams are wrong in the way its model's name says (round 4 of
    the security review): counts that are not counts, an index that is not a number,
    and streams without end that carry no text."""

    def log_message(self, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        rows = [{"id": name} for name in MALFORMED]
        data = json.dumps({"object": "list", "data": rows}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers.get("content-length", 0))))
        if not self.path.endswith("/chat/completions"):  # no /tokenize: nothing counted
            self.send_response(404)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        try:
            self.wfile.write(MALFORMED[body["model"]]())
            self.wfile.write(b"data: [DONE]\n\n")
        except OSError:  # localllm closed the request
            return


def _events(*events: dict, finish: dict | None = None) -> bytes:
    done = {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}
    return b"".join(f"data: {json.dumps(e)}\n\n".encode() for e in [*events, finish or done])


_HI = {"choices": [{"index": 0, "delta": {"content": "hi"}}]}
MALFORMED = {
    "lots": lambda: _events(_HI, {"choices": [], "usage": {"prompt_tokens": "lots"}}),
    "negative": lambda: _events(
        _HI, {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": -5}}),
    "index-x": lambda: _events({"choices": [{"index": "x", "delta": {"content": "hi"}}]}),
    "call-x": lambda: _events({"choices": [{"index": 0, "delta": {"tool_calls": [
        {"index": "x", "function": {"name": "f", "arguments": "{}"}}]}}]}),
    # 20 MB of events with no text, of bytes with no newline, of one call's arguments
    "empty": lambda: b"".join([b'data: {"choices": [{"index": 0, "delta": {}}]}\n\n'] * 400_000),
    "noline": lambda: b"data: " + b"x" * 20_000_000,
    "args": lambda: _events(*[{"choices": [{"index": 0, "delta": {"tool_calls": [
        {"index": 0, "function": {"arguments": "[" * 10_000}}]}}]}] * 2_000),
}


@pytest.fixture(scope="module")
@loads_model
def engines(tmp_path_factory: pytest.TempPathFactory, starter_ref: ModelRef,
            server: ServerProcess) -> Iterator[dict]:
    """llama-cpp-python's server as `team`, the session's localllm server as `box`, the
    scripted engine as `flaky`, and a closed port as `gone` (with a fallback) and `dead`;
    the localllm in front of them all."""
    tmp = tmp_path_factory.mktemp("remote")
    upstream = LlamaCppServer(tmp, starter_ref.path, "smol")
    second = server
    scripted = ThreadingHTTPServer(("127.0.0.1", 0), Scripted)
    threading.Thread(target=scripted.serve_forever, daemon=True).start()
    endless = ThreadingHTTPServer(("127.0.0.1", 0), Endless)
    threading.Thread(target=endless.serve_forever, daemon=True).start()
    malformed = ThreadingHTTPServer(("127.0.0.1", 0), Malformed)
    threading.Thread(target=malformed.serve_forever, daemon=True).start()
    closed = free_port()
    doomed = free_port()  # an engine started (and killed) by a test
    remotes = [
        {"name": "doomed", "url": f"http://127.0.0.1:{doomed}/v1", "models": ["smol"]},
        {"name": "team", "url": upstream.base + "/v1"},
        {"name": "box", "url": second.base + "/v1", "models": ["starter"]},
        {"name": "flaky", "url": f"http://127.0.0.1:{scripted.server_address[1]}/v1",
         "retries": 1},
        {"name": "gone", "url": f"http://127.0.0.1:{closed}/v1", "models": ["big"],
         "fallback": "starter", "connect_timeout_s": 1},
        {"name": "endless", "url": f"http://127.0.0.1:{endless.server_address[1]}/v1",
         "models": ["chatty"]},
        {"name": "odd", "url": f"http://127.0.0.1:{malformed.server_address[1]}/v1",
         "models": list(MALFORMED)},
        {"name": "dead", "url": f"http://127.0.0.1:{closed}/v1", "models": ["big"],
         "failures_to_trip": 2, "down_for_s": 600, "connect_timeout_s": 1},
    ]
    routes = [
        {"tools": True, "model": "box/starter"},
        {"min_prompt_chars": 200, "model": "team/smol"},
        {"model": "starter"},
    ]
    (tmp / "front").mkdir()
    front = ServerProcess(tmp / "front", "--ctx", "2048", env={
        "LOCALLLM_REMOTES": json.dumps(remotes), "LOCALLLM_ROUTES": json.dumps(routes)})
    yield {"upstream": upstream, "second": second, "front": front, "doomed": doomed,
           "tmp": tmp}
    front.stop()
    scripted.shutdown()
    endless.shutdown()
    malformed.shutdown()
    upstream.stop()


def client_of(base: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0)


def test_remote_models_are_listed(engines: dict):
    front = engines["front"]
    ids = {m.id: m for m in client_of(front.base).models.list()}
    assert {"starter", "team/smol", "box/starter", "flaky/canned", "gone/big"} <= set(ids)
    assert extra_of(ids["flaky/canned"])["context_length"] == 4096  # vLLM's max_model_len
    tags = httpx.get(front.base + "/api/tags", timeout=10).json()["models"]
    assert "team/smol" in {t["name"] for t in tags}
    show = httpx.post(front.base + "/api/show", json={"model": "team/smol"}, timeout=10).json()
    assert "tools" in show["capabilities"]


def test_stream_is_the_engines_own(engines: dict):
    """Greedy text through localllm equals the engine's own answer, piece by piece."""
    direct = client_of(engines["upstream"].base)
    front = client_of(engines["front"].base)
    want = direct.chat.completions.create(model="smol", messages=ASK, max_tokens=12,
                                          temperature=0)
    pieces = []
    usage = None
    for event in front.chat.completions.create(
            model="team/smol", messages=ASK, max_tokens=12, temperature=0, stream=True,
            stream_options={"include_usage": True}):
        if event.choices and event.choices[0].delta.content:
            pieces.append(event.choices[0].delta.content)
        if event.usage is not None:
            usage = event.usage
    assert "".join(pieces) == want.choices[0].message.content
    assert len(pieces) > 1  # streamed as it came, not as one block
    # llama-cpp-python reports no usage when streaming: counted here, by its tokenizer
    assert usage is not None and usage.completion_tokens == 12 and usage.prompt_tokens > 0
    whole = front.chat.completions.create(model="team/smol", messages=ASK, max_tokens=12,
                                          temperature=0)
    assert whole.model == "team/smol"
    assert whole.choices[0].message.content == want.choices[0].message.content
    assert whole.choices[0].finish_reason == "length"


def test_engine_usage_and_retry_after(engines: dict):
    """A 429 with Retry-After is waited out and retried; the engine's usage (cached tokens
    too) is passed on, and /metrics counts it under the remote backend."""
    front = engines["front"]
    reply = client_of(front.base).chat.completions.create(model="flaky/canned", messages=ASK)
    assert reply.choices[0].message.content == "Hello team"
    usage = usage_of(reply)
    assert usage.prompt_tokens == 7 and usage.completion_tokens == 2
    assert usage.prompt_tokens_details.cached_tokens == 5
    metrics = httpx.get(front.base + "/metrics", timeout=10).text
    line = next(x for x in metrics.splitlines() if x.startswith("localllm_tokens_total{")
                and 'model="flaky/canned"' in x and 'kind="completion"' in x)
    assert 'backend="remote"' in line and line.endswith(" 2.0")


def test_engine_refusal_is_passed_on(engines: dict):
    """A request the engine refuses (a prompt over the starter's trained 8192 tokens) is a
    400 with the engine's own message; an engine that closes the stream without an
    answer (llama-cpp-python does so for the same prompt) is a 502 that says so, not an
    empty answer."""
    long: list[ChatCompletionMessageParam] = [{"role": "user", "content": "word " * 9000}]
    client = client_of(engines["front"].base)
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model="box/starter", messages=long, max_tokens=4)
    body = body_of(err.value)
    assert body["code"] == "remote_rejected"
    assert "context window is 8192 tokens" in body["message"] and "'box'" in body["message"]
    with pytest.raises(openai.APIStatusError) as failed:
        client.chat.completions.create(model="team/smol", messages=long, max_tokens=4)
    assert failed.value.status_code == 502
    assert "without finishing" in body_of(failed.value)["message"]


def test_down_engine_is_503_then_marked_down(engines: dict):
    front = engines["front"]
    client = client_of(front.base)
    for _ in range(2):
        with pytest.raises(openai.InternalServerError) as err:
            client.chat.completions.create(model="dead/big", messages=ASK)
        assert err.value.status_code == 503
        assert body_of(err.value)["code"] == "remote_unavailable"
        assert "cannot connect" in body_of(err.value)["message"]
    row = next(r for r in front.health()["remotes"] if r["name"] == "dead")
    assert row["state"] == "down" and row["failures"] == 2 and row["down_for_s"] > 500
    with pytest.raises(openai.InternalServerError) as err:  # refused here, not tried
        client.chat.completions.create(model="dead/big", messages=ASK)
    assert "marked down after 2 failures" in body_of(err.value)["message"]


def test_fallback_answers_and_says_so(engines: dict):
    reply = client_of(engines["front"].base).chat.completions.create(
        model="gone/big", messages=ASK, max_tokens=8, temperature=0)
    assert reply.model == "starter" and reply.choices[0].message.content
    assert extra_of(reply)["fallback"]["requested"] == "gone/big"
    assert "cannot connect" in extra_of(reply)["fallback"]["reason"]


def test_auto_routes_by_rule(engines: dict):
    client = client_of(engines["front"].base)
    short = client.chat.completions.create(model="auto", messages=ASK, max_tokens=4)
    assert short.model == "starter"
    long: list[ChatCompletionMessageParam] = [
        {"role": "user", "content": "Summarise this: " + "the cat sat on the mat. " * 12}
    ]
    routed = client.chat.completions.create(model="auto", messages=long, max_tokens=4)
    assert routed.model == "team/smol"


def test_tool_calls_through_a_remote(engines: dict):
    """Tools go to the engine (a second localllm here) and its calls come back as calls,
    streamed too; routed there by the tools rule."""
    client = client_of(engines["front"].base)
    reply = client.chat.completions.create(
        model="auto", messages=[{"role": "user", "content": "Weather in Paris?"}],
        tools=TOOLS, tool_choice={"type": "function", "function": {"name": "get_weather"}},
        temperature=0)
    assert reply.model == "box/starter"
    choice = reply.choices[0]
    (call,) = choice.message.tool_calls or []
    assert choice.finish_reason == "tool_calls"
    assert call.type == "function" and call.function.name == "get_weather"
    jsonschema.validate(json.loads(call.function.arguments), WEATHER_PARAMS)
    streamed = [e for e in client.chat.completions.create(
        model="box/starter", messages=[{"role": "user", "content": "Weather in Oslo?"}],
        tools=TOOLS, tool_choice="required", temperature=0, stream=True)]
    calls = [c for e in streamed if e.choices for c in e.choices[0].delta.tool_calls or ()]
    assert calls and streamed[-1].choices[0].finish_reason == "tool_calls"


def test_an_engine_that_ignores_max_tokens_is_cut_there(engines: dict):
    front = engines["front"]
    body = {"model": "endless/chatty", "messages": ASK, "max_tokens": 40}
    r = httpx.post(front.base + "/v1/chat/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    answer = r.json()
    assert answer["choices"][0]["finish_reason"] == "length"
    assert answer["choices"][0]["message"]["content"] == " more" * 40
    assert answer["usage"]["completion_tokens"] == 40
    with httpx.stream("POST", front.base + "/v1/chat/completions",
                      json={**body, "stream": True}, timeout=120) as reply:
        text = "".join(line for line in reply.iter_lines())
    assert text.count(" more") == 40 and '"finish_reason":"length"' in text
    assert text.endswith("data: [DONE]")


@pytest.mark.parametrize(("model", "says"), [
    ("lots", "usage.prompt_tokens = \"lots\""),
    ("negative", "usage.completion_tokens = -5"),
    ("index-x", "choices[].index = \"x\""),
    ("call-x", "delta.tool_calls[].index = \"x\""),
    ("noline", "bytes without a newline"),
    ("args", "whose arguments are not a JSON object"),
])
def test_an_engines_malformed_stream_is_a_502_naming_the_field(engines: dict, model: str,
                                                               says: str):
    """Round 4: usage "lots" or an index "x" was a 500, negative counts went into usage
    and quotas, and a line without a newline or a call's arguments without end were
    read without bound. Each is a 502 now, naming what the engine got wrong."""
    body = {"model": f"odd/{model}", "messages": ASK}
    r = httpx.post(engines["front"].base + "/v1/chat/completions", json=body, timeout=120)
    assert r.status_code == 502, r.text
    assert says in r.json()["error"]["message"] and "'odd'" in r.json()["error"]["message"]


def test_an_engine_that_sends_only_empty_events_is_cut(engines: dict):
    """Events with no text count too (64 characters each against the answer's 8 MiB):
    400,000 empty deltas end as a cut answer, not a read without end."""
    body = {"model": "odd/empty", "messages": ASK}
    r = httpx.post(engines["front"].base + "/v1/chat/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    assert choice["finish_reason"] == "length" and choice["message"]["content"] == ""


def test_disconnect_closes_the_upstream_request(engines: dict):
    """A client that leaves mid-answer ends the engine's request too: the second localllm
    (the engine here) shows no running request afterwards."""
    second, front = engines["second"], engines["front"]
    cancelled = second.health()["totals"]["cancelled"]
    body = {"model": "box/starter", "messages": ASK, "max_tokens": 1500, "stream": True,
            "temperature": 1.0, "seed": 1, "logit_bias": {"0": -100, "2": -100}}  # no EOS
    with httpx.stream("POST", front.base + "/v1/chat/completions", json=body,
                      timeout=30) as reply:
        lines = reply.iter_lines()
        seen = 0
        for line in lines:
            seen += line.startswith("data:")
            if seen >= 3:
                break
        assert second.health()["activity"]["active"] == 1
    for _ in range(100):  # the engine hears the disconnect within a step or two
        if second.health()["activity"]["active"] == 0:
            break
        threading.Event().wait(0.1)
    assert second.health()["activity"]["active"] == 0
    # ended by the disconnect, not by running out its 1,500 tokens meanwhile
    assert second.health()["totals"]["cancelled"] == cancelled + 1


def test_engine_killed_mid_stream_gives_an_error_frame_then_done(engines: dict,
                                                                  starter_ref: ModelRef):
    engine = LlamaCppServer(engines["tmp"], starter_ref.path, "smol", port=engines["doomed"])
    body = {"model": "doomed/smol", "messages": ASK, "max_tokens": 1500, "stream": True,
            "logit_bias": {"0": -100, "2": -100}}  # no end of text: it streams until killed
    frames: list[str] = []
    try:
        with httpx.stream("POST", engines["front"].base + "/v1/chat/completions", json=body,
                          timeout=60) as reply:
            assert reply.status_code == 200
            for line in reply.iter_lines():
                if not line.startswith("data:"):
                    continue
                frames.append(line[5:].strip())
                if len(frames) == 3:
                    engine.proc.kill()
    finally:
        engine.stop()
    assert frames[-1] == "[DONE]"
    error = json.loads(frames[-2])["error"]
    assert error["code"] == "remote_unavailable" and "doomed" in error["message"]
    assert all("choices" in json.loads(f) for f in frames[:-2])  # text until the kill


def test_localllm_only_fields_are_refused_for_a_remote(engines: dict):
    client = client_of(engines["front"].base)
    for extra, field in (({"speculate": "lookup"}, "speculate"),
                         ({"draft_model": "starter"}, "draft_model"),
                         ({"deterministic": True}, "deterministic"),
                         ({"lora": [{"id": 0, "scale": 1.0}]}, "lora")):
        with pytest.raises(openai.BadRequestError) as err:
            client.chat.completions.create(model="team/smol", messages=ASK, max_tokens=2,
                                           extra_body=extra)
        assert body_of(err.value)["param"] == field and "team/smol" in body_of(err.value)["message"]


def test_ollama_and_anthropic_routes_reach_remotes(engines: dict):
    front = engines["front"]
    chat = httpx.post(front.base + "/api/chat", timeout=60, json={
        "model": "team/smol", "messages": ASK, "stream": False,
        "options": {"num_predict": 6, "temperature": 0}}).json()
    assert chat["model"] == "team/smol" and chat["message"]["content"]
    msg = httpx.post(front.base + "/v1/messages", timeout=60, json={
        "model": "team/smol", "max_tokens": 6, "messages": ASK}).json()
    assert msg["model"] == "team/smol" and msg["content"][0]["text"]
    # what needs the model on this machine says so, not "not found"
    count = httpx.post(front.base + "/v1/messages/count_tokens", timeout=30, json={
        "model": "team/smol", "messages": ASK})
    assert count.status_code == 400 and "remote engine's model" in count.text
    load = httpx.post(front.base + "/api/show", timeout=30, json={"model": "team/smol"})
    assert load.status_code == 200


def test_remote_cli(engines: dict, tmp_path: Path):
    """remote add (the engine's models discovered), list --json, run, rm: the config file
    keeps what the user wrote."""
    import subprocess
    import sys

    config = tmp_path / "config.toml"
    config.write_text("# mine\nkeep_alive_s = 60\n")
    env = {**__import__("os").environ, "LOCALLLM_CONFIG": str(config)}

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "localllm", *args], env=env,
                              capture_output=True, text=True, timeout=120)

    up = engines["upstream"].base + "/v1"
    added = cli("remote", "add", "team", up, "--api-key-env", "TEAM_KEY")
    assert added.returncode == 0, added.stderr
    assert "team/smol" in added.stderr
    assert "# mine" in config.read_text() and "TEAM_KEY" in config.read_text()
    refused = cli("remote", "add", "nowhere", f"http://127.0.0.1:{free_port()}/v1")
    assert refused.returncode == 1 and "--model" in refused.stderr
    listed = json.loads(cli("remote", "list", "--json").stdout)
    assert listed[0]["name"] == "team" and listed[0]["reachable"] is True
    assert listed[0]["models"] == [{"name": "team/smol", "context_length": None}]
    assert "team/smol" in cli("list").stdout
    ran = cli("run", "--model", "team/smol", "Hi", "--max-tokens", "4", "--temperature", "0")
    assert ran.returncode == 0 and ran.stdout.strip(), ran.stderr
    gone = cli("remote", "rm", "team")
    assert gone.returncode == 0 and "remotes" not in config.read_text()
    assert "keep_alive_s = 60" in config.read_text()
    assert cli("remote", "rm", "team").returncode == 2


def test_keys_and_quotas_apply_to_remote_models(engines: dict):
    """Last in this module: once a key exists every request needs one. A remote model's
    tokens count against the key's daily quota and in its usage, as a local model's do."""
    import subprocess
    import sys
    import time

    front = engines["front"]
    env = {**__import__("os").environ, "LOCALLLM_DATA_DIR": str(front.log.parent / "data"),
           "LOCALLLM_CONFIG": str(front.log.parent / "none.toml")}
    made = subprocess.run([sys.executable, "-m", "localllm", "keys", "add", "ci",
                           "--tokens-per-day", "20"], env=env, capture_output=True, text=True,
                          timeout=60)
    assert made.returncode == 0, made.stderr
    key = made.stdout.strip().splitlines()[-1]
    with pytest.raises(openai.AuthenticationError):
        client_of(front.base).chat.completions.create(model="flaky/canned", messages=ASK)
    keyed = openai.OpenAI(base_url=front.base + "/v1", api_key=key, max_retries=0)
    for _ in range(2):  # 9 tokens each; each held against what is left before it is sent
        reply = keyed.chat.completions.create(model="flaky/canned", messages=ASK)
        assert reply.usage
        # no max_tokens asked: the request was cut to what the key had left, and says so
        assert 0 < (reply.model_extra or {})["quota"]["max_tokens"] < 20
    with pytest.raises(openai.RateLimitError) as err:  # 2 left: not even the prompt fits
        keyed.chat.completions.create(model="flaky/canned", messages=ASK)
    assert "of its 20 tokens for today" in body_of(err.value)["message"]
    rows: list = []
    for _ in range(50):  # the usage table is written off the request path
        usage = subprocess.run([sys.executable, "-m", "localllm", "usage", "--json"], env=env,
                               capture_output=True, text=True, timeout=60)
        rows = [r for r in json.loads(usage.stdout) if r["client"] == "ci"]
        if rows and rows[0]["requests"] == 2:
            break
        time.sleep(0.2)
    assert rows[0]["requests"] == 2 and rows[0]["completion_tokens"] == 4
    assert rows[0]["prompt_tokens"] == 14 and rows[0]["cached_tokens"] == 10
