"""A server that is safe to leave running: Host and Origin checks, content type, API keys,
quotas, /metrics, the access log, and the hostile inputs that once broke it.

Every test here runs a real `localllm serve` process on a free port (the starter model)
and talks to it over HTTP; keys are made with the real `localllm keys` command.
"""

from __future__ import annotations

import functools
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from localllm.models.starter import starter_path
from tests.conftest import ServerProcess, starts_process


class web:  # httpx's calls with a limit a busy machine meets (httpx's own is 5 s)
    get = functools.partial(httpx.get, timeout=60)
    post = functools.partial(httpx.post, timeout=60)
    options = functools.partial(httpx.options, timeout=60)
    request = functools.partial(httpx.request, timeout=60)

CHAT = {"messages": [{"role": "user", "content": "Say hi"}], "max_tokens": 4, "temperature": 0}


def _env(srv: ServerProcess) -> dict[str, str]:
    return {**os.environ, "LOCALLLM_DATA_DIR": str(srv.log.parent / "data"),
            "LOCALLLM_CONFIG": str(srv.log.parent / "none.toml")}


def localllm(srv: ServerProcess, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "localllm", *args], env=_env(srv),
                          capture_output=True, text=True, timeout=120)


def add_key(srv: ServerProcess, name: str, *extra: str) -> str:
    done = localllm(srv, "keys", "add", name, *extra)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip().splitlines()[-1]


def post_json(url: str, body: dict) -> httpx.Response:
    """POST `body` as JSON with \\u escapes (so a lone surrogate reaches the server)."""
    return web.post(url, content=json.dumps(body), headers={"Content-Type": "application/json"},
                      timeout=60)


def error_of(r: httpx.Response, status: int) -> dict:
    assert r.status_code == status, (r.status_code, r.text)
    return dict(r.json()["error"])


@pytest.fixture(scope="module")
@starts_process
def guarded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """A server with a config that allows one extra host and origin (keys come later)."""
    tmp = tmp_path_factory.mktemp("guarded")
    (tmp / "none.toml").write_text(
        'allowed_hosts = ["llm.lan"]\nallowed_origins = ["https://app.example"]\n'
    )
    srv = ServerProcess(tmp)
    yield srv
    srv.stop()


# -- Host and Origin ------------------------------------------------------------------


def test_dns_rebinding_host_is_refused_on_every_route(guarded: ServerProcess):
    for method, path in (("GET", "/v1/models"), ("POST", "/v1/chat/completions"),
                         ("GET", "/health"), ("GET", "/metrics")):
        r = web.request(method, guarded.base + path, json=CHAT,
                          headers={"Host": "attacker.example"})
        err = error_of(r, 403)
        assert err["code"] == "host_not_allowed" and "attacker.example" in err["message"]
    # a Host that is not a well-formed authority, and LAN names any host can answer for
    for host in (f"localhost:{guarded.port}@evil.example", "[::1]evil.example",
                 "localhost:99999", "[::1", "evil.local", "printer.internal"):
        err = error_of(web.get(guarded.base + "/v1/models", headers={"Host": host}), 403)
        assert err["code"] == "host_not_allowed", host
    for host in (f"localhost:{guarded.port}", f"127.0.0.1:{guarded.port}", "llm.lan",
                 "[::1]", "10.1.2.3:80", "box.localhost"):
        r = web.get(guarded.base + "/v1/models", headers={"Host": host})
        assert r.status_code == 200, (host, r.text)


def test_foreign_origin_is_refused_and_allowed_ones_get_cors(guarded: ServerProcess):
    url = guarded.base + "/v1/chat/completions"
    err = error_of(web.post(url, json=CHAT, headers={"Origin": "https://evil.example"}), 403)
    assert err["code"] == "origin_not_allowed" and "evil.example" in err["message"]
    preflight = {"Origin": "https://evil.example", "Access-Control-Request-Method": "POST",
                 "Access-Control-Request-Headers": "authorization, content-type"}
    error_of(web.options(url, headers=preflight), 403)
    # Chrome's Private Network Access preflight: yes for an allowed origin only
    pna = {**preflight, "Access-Control-Request-Private-Network": "true"}
    error_of(web.options(url, headers=pna), 403)
    r = web.options(url, headers={**pna, "Origin": "https://app.example"})
    assert r.status_code == 200, r.text
    assert r.headers["access-control-allow-private-network"] == "true"
    for origin in ("http://localhost:5173", "http://127.0.0.1:3000", "https://app.example",
                   "vscode-webview://abc123", "HTTPS://App.Example", "http://LOCALHOST:5173"):
        r = web.options(url, headers={**preflight, "Origin": origin})
        assert r.status_code == 200, (origin, r.text)
        assert r.headers["access-control-allow-origin"] == origin
        assert "POST" in r.headers["access-control-allow-methods"]
        assert "authorization" in r.headers["access-control-allow-headers"].lower()
        r = web.post(url, json=CHAT, headers={"Origin": origin})
        assert r.status_code == 200, (origin, r.text)
        assert r.headers["access-control-allow-origin"] == origin
    # no Origin (curl, SDKs, IDE plugins outside a webview): unaffected
    assert web.post(url, json=CHAT).status_code == 200


def test_simple_cross_site_posts_cannot_start_a_generation(guarded: ServerProcess):
    url = guarded.base + "/v1/completions"
    body = json.dumps({"prompt": "Hi", "max_tokens": 2})
    before = guarded.health()["totals"]["requests"]
    for kind in ("text/plain", "application/x-www-form-urlencoded", "multipart/form-data"):
        err = error_of(web.post(url, content=body, headers={"Content-Type": kind}), 415)
        assert kind in err["message"] and "application/json" in err["message"]
    # no content type at all, from a browser (which always says where it fetches from)
    for signs in ({"Sec-Fetch-Site": "cross-site"}, {"Origin": "http://localhost:3000"}):
        err = error_of(web.post(url, content=body, headers=signs), 415)
        assert "none" in err["message"]
    assert guarded.health()["totals"]["requests"] == before
    # ... from a program (litellm's Ollama provider, so aider): taken as JSON
    assert web.post(url, content=body).status_code == 200


def test_request_id_is_returned_and_echoed(guarded: ServerProcess):
    r = web.get(guarded.base + "/v1/models")
    assert len(r.headers["x-request-id"]) == 32
    r = web.get(guarded.base + "/v1/models", headers={"X-Request-Id": "trace-42"})
    assert r.headers["x-request-id"] == "trace-42"


# -- hostile input ----------------------------------------------------------------------


@pytest.mark.parametrize("keep_alive", [1e10, "3000000h", "1e400s", "nan", "Infinity"])
def test_unbounded_keep_alive_is_400_and_the_engine_lives(guarded: ServerProcess, keep_alive):
    body = {**CHAT, "model": "starter", "keep_alive": keep_alive}
    err = error_of(web.post(guarded.base + "/v1/chat/completions", json=body), 400)
    assert err["param"] == "keep_alive"
    raw = '{"messages":[{"role":"user","content":"Hi"}],"max_tokens":2,"keep_alive":Infinity}'
    r = web.post(guarded.base + "/v1/chat/completions", content=raw,
                   headers={"Content-Type": "application/json"})
    assert error_of(r, 400)["param"] == "keep_alive"
    assert web.post(guarded.base + "/v1/chat/completions", json=CHAT).status_code == 200
    assert guarded.health()["status"] == "ok"


@pytest.mark.parametrize(
    ("body", "param", "words"),
    [
        ({"prompt": []}, "prompt", "empty"),
        ({"prompt": [49152]}, "prompt", "49152"),
        ({"prompt": [1, 2, 99999]}, "prompt", "99999"),
        ({"prompt": [-1]}, "prompt", "greater than or equal to 0"),
        ({"prompt": [2**31]}, "prompt", "less than or equal to"),
        ({"prompt": [2**32 + 5]}, "prompt", "less than or equal to"),
        ({"prompt": "a\ud800b"}, "prompt", "surrogate"),
        ({"prompt": "Hi", "model": "x\udfff"}, "model", "surrogate"),
        ({"prompt": "Hi", "model": "m" * 256}, "model", "255 bytes"),
        ({"prompt": "Hi", "draft_model": "é" * 128}, "draft_model", "255 bytes"),
    ],
)
def test_bad_completion_input_is_a_400_naming_the_field(guarded, body, param, words):
    r = post_json(guarded.base + "/v1/completions", {"max_tokens": 2, **body})
    err = error_of(r, 400)
    assert err["param"] is not None and err["param"].startswith(param), err
    assert words in err["message"], err


def test_lone_surrogate_in_chat_content_is_400(guarded: ServerProcess):
    body = {"messages": [{"role": "user", "content": "hi \ud800"}], "max_tokens": 2}
    err = error_of(post_json(guarded.base + "/v1/chat/completions", body), 400)
    assert err["param"] == "messages.0.content" and "surrogate" in err["message"]


def test_model_paths_are_refused_without_revealing_the_disk(guarded: ServerProcess, tmp_path):
    real = tmp_path / "real.gguf"
    real.write_bytes(b"not a model")
    messages = set()
    for name in (str(real), "/etc/passwd", "/no/such/file.gguf", "~nosuchuser/x.gguf",
                 "../../x.gguf"):
        body = {**CHAT, "model": name}
        err = error_of(web.post(guarded.base + "/v1/chat/completions", json=body), 400)
        assert err["param"] == "model" and err["code"] == "model_path_not_allowed"
        messages.add(err["message"])
    assert len(messages) == 1  # the same words whether the path exists or not
    # every other field that names a model goes through the same rule: a real model file
    # (the starter's) is refused as a draft, an embedding model, a load or an Ollama model
    starter_file = str(starter_path())
    sides: list[tuple[str, dict[str, object], str]] = [
        ("/v1/chat/completions", {**CHAT, "draft_model": starter_file,
                                  "speculate": "draft"}, "draft_model"),
        ("/v1/chat/completions", {**CHAT, "draft_model": "some/dir/model.gguf",
                                  "speculate": "draft"}, "draft_model"),
        ("/v1/embeddings", {"model": starter_file, "input": "hi"}, "model"),
        ("/admin/load", {"model": "some/dir/model.gguf"}, "model"),
        ("/admin/load", {"model": starter_file}, "model"),
        ("/api/chat", {"model": starter_file, "stream": False,
                       "messages": [{"role": "user", "content": "hi"}]}, "model"),
        ("/v1/messages", {"model": starter_file, "max_tokens": 2,
                          "messages": [{"role": "user", "content": "hi"}]}, "model"),
        ("/v1/responses", {"model": starter_file, "input": "hi"}, "model"),
        ("/infill", {"model": starter_file, "input_prefix": "a", "input_suffix": "b"},
         "model"),
    ]
    for path, side, param in sides:
        r = web.post(guarded.base + path, json=side)
        text = r.text
        assert r.status_code == 400, (path, side, text)
        assert "Model paths are not accepted over the API" in text, (path, text)
        if path not in ("/api/chat", "/v1/messages"):  # their error shapes have no code
            assert r.json()["error"]["code"] == "model_path_not_allowed", (path, text)
            assert r.json()["error"]["param"] == param, (path, text)


def test_prompts_that_cannot_fit_are_refused_before_tokenizing(guarded: ServerProcess):
    many = {"messages": [{"role": "user", "content": "x"}] * 100_000, "max_tokens": 2}
    err = error_of(web.post(guarded.base + "/v1/chat/completions", json=many), 400)
    assert err["code"] == "context_length_exceeded" and "judged from its size" in err["message"]
    # 7 MB: more bytes than the loaded context's tokens times the longest token's
    specials = {"prompt": "<|im_end|>" * 700_000, "max_tokens": 2}
    err = error_of(web.post(guarded.base + "/v1/completions", json=specials), 400)
    assert err["code"] == "context_length_exceeded" and "judged from its size" in err["message"]
    models = web.get(guarded.base + "/v1/models").json()["data"]
    loaded = next(m["loaded_context_length"] for m in models if m["id"] == "starter")
    assert f"{loaded} tokens" in err["message"]


@pytest.mark.process
def test_a_failed_load_leaves_health_ok_and_paths_out_of_the_answer(tmp_path: Path):
    """A damaged model in the store: the request fails with a 500 that names no path,
    /health stays ok (the default model answers), and the log has the reason."""
    store = tmp_path / "data" / "models"
    store.mkdir(parents=True)
    (store / "broken.gguf").write_bytes(b"GGUF" + b"\x03\x00\x00\x00" + b"\x00" * 64)
    srv = ServerProcess(tmp_path)
    try:
        body = {**CHAT, "model": "broken"}
        r = web.post(srv.base + "/v1/chat/completions", json=body, timeout=60)
        assert r.status_code in (400, 500), r.text
        assert str(tmp_path) not in r.text
        health = srv.health()
        assert health["status"] == "ok", health
        assert web.post(srv.base + "/v1/chat/completions", json=CHAT).status_code == 200
    finally:
        srv.stop()


# -- keys, quotas, metrics, access log ---------------------------------------------------


@pytest.mark.process
def test_keys_guard_every_route_but_health(tmp_path: Path):
    srv = ServerProcess(tmp_path)
    try:
        assert web.post(srv.base + "/v1/chat/completions", json=CHAT).status_code == 200
        secret = add_key(srv, "editor")
        assert secret.startswith("sk-localllm-")
        listing = localllm(srv, "keys", "list")
        assert "editor" in listing.stdout and secret not in listing.stdout
        url = srv.base + "/v1/chat/completions"
        err = error_of(web.post(url, json=CHAT), 401)
        assert "Authorization: Bearer" in err["message"] and err["code"] == "invalid_api_key"
        error_of(web.post(url, json=CHAT, headers={"Authorization": "Bearer sk-nope"}), 401)
        error_of(web.get(srv.base + "/metrics"), 401)
        error_of(web.get(srv.base + "/v1/models"), 401)
        assert web.get(srv.base + "/health").status_code == 200
        client = openai.OpenAI(base_url=srv.base + "/v1", api_key=secret)
        reply = client.chat.completions.create(model="starter", max_tokens=4, temperature=0,
                                               messages=[{"role": "user", "content": "Hi"}])
        assert reply.usage is not None and reply.usage.completion_tokens > 0
        ok = web.post(url, json=CHAT, headers={"x-api-key": secret})  # Anthropic's header
        assert ok.status_code == 200
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=srv.base + "/v1", api_key="sk-wrong").models.list()
        other = add_key(srv, "agent")
        assert localllm(srv, "keys", "rm", "editor").returncode == 0
        error_of(web.post(url, json=CHAT, headers={"Authorization": f"Bearer {secret}"}), 401)
        ok = web.post(url, json=CHAT, headers={"Authorization": f"Bearer {other}"})
        assert ok.status_code == 200
        assert localllm(srv, "keys", "rm", "editor").returncode == 2
        # with the last key gone the endpoint is open to this machine again, as before
        assert localllm(srv, "keys", "rm", "agent").returncode == 0
        assert web.post(url, json=CHAT).status_code == 200
    finally:
        srv.stop()


@pytest.mark.process
def test_usage_is_counted_per_key_and_quotas_give_429(tmp_path: Path):
    srv = ServerProcess(tmp_path)
    try:
        fast = add_key(srv, "script", "--rpm", "2")
        small = add_key(srv, "tiny", "--tokens-per-day", "5")
        url = srv.base + "/v1/completions"
        body = {"prompt": "One two three", "max_tokens": 3, "temperature": 0}
        for _ in range(2):
            r = web.post(url, json=body, headers={"Authorization": f"Bearer {fast}"})
            assert r.status_code == 200, r.text
        r = web.post(url, json=body, headers={"Authorization": f"Bearer {fast}"})
        err = error_of(r, 429)
        assert "2 requests per minute" in err["message"]
        assert 1 <= int(r.headers["retry-after"]) <= 60
        r = web.post(url, json=body, headers={"Authorization": f"Bearer {small}"})
        assert r.status_code == 200  # under the limit; its answer is cut to what is left
        def counted() -> bool:  # the usage is written off the request path, after it ends
            rows = json.loads(localllm(srv, "usage", "--json").stdout)
            return any(row["client"] == "tiny" and row["completion_tokens"] for row in rows)

        deadline = time.monotonic() + 60
        while not counted() and time.monotonic() < deadline:
            time.sleep(0.1)
        r = web.post(url, json=body, headers={"Authorization": f"Bearer {small}"})
        err = error_of(r, 429)
        assert "of its 5 tokens for today" in err["message"]
        assert 1 <= int(r.headers["retry-after"]) <= 86400
        usage = localllm(srv, "usage", "--json")
        rows = {row["client"]: row for row in json.loads(usage.stdout)}
        assert rows["script"]["requests"] == 2 and rows["script"]["completion_tokens"] == 6
        assert rows["tiny"]["requests"] == 1 and rows["tiny"]["prompt_tokens"] > 0
        keys = {row["name"]: row for row in json.loads(localllm(srv, "keys", "list",
                                                                "--json").stdout)}
        assert keys["script"]["requests"] == 2 and keys["script"]["rpm"] == 2
    finally:
        srv.stop()


def _tokens_today(srv: ServerProcess, name: str, settled: int) -> int:
    """The key's tokens today once `settled` requests are written (off the request path)."""
    deadline = time.monotonic() + 60
    while True:
        rows = {row["name"]: row for row in json.loads(localllm(srv, "keys", "list",
                                                                "--json").stdout)}
        if rows[name]["requests"] >= settled or time.monotonic() > deadline:
            return int(rows[name]["tokens_today"])
        time.sleep(0.2)


@pytest.mark.process
def test_a_quota_cannot_be_overspent_by_parallel_or_long_requests(tmp_path: Path):
    srv = ServerProcess(tmp_path)
    try:
        url = srv.base + "/v1/completions"
        # no end token: each answer would run to its limit
        body = {"prompt": "Once upon a time", "max_tokens": 120, "temperature": 0,
                "logit_bias": {"0": -100, "2": -100}}
        key = add_key(srv, "parallel", "--tokens-per-day", "50")
        auth = {"Authorization": f"Bearer {key}"}
        replies: list[httpx.Response] = []
        threads = [threading.Thread(target=lambda: replies.append(
            web.post(url, json=body, headers=auth, timeout=300))) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        ok = [r for r in replies if r.status_code == 200]
        refused = [r for r in replies if r.status_code == 429]
        assert len(replies) == 8  # (a request that failed in its thread is missing here)
        assert ok and len(ok) + len(refused) == 8, [(r.status_code, r.text[:300]) for r in replies]
        for r in refused:
            assert r.json()["error"]["code"] == "rate_limit_exceeded"
            assert "of its 50 tokens for today" in r.json()["error"]["message"]
            assert int(r.headers["retry-after"]) >= 1
        for r in ok:  # each answer was cut to what the key had left, and says so
            assert r.json()["quota"]["max_tokens"] < 120
            assert r.json()["choices"][0]["finish_reason"] == "length"
        spent = sum(r.json()["usage"]["total_tokens"] for r in ok)
        assert spent <= 50 and _tokens_today(srv, "parallel", len(ok)) == spent
        # one request asking far more than its key's 60 tokens
        key = add_key(srv, "long", "--tokens-per-day", "60")
        r = web.post(url, json={**body, "max_tokens": 1000},
                     headers={"Authorization": f"Bearer {key}"}, timeout=300)
        assert r.status_code == 200, r.text
        usage = r.json()["usage"]
        assert r.json()["quota"]["max_tokens"] == 60 - usage["prompt_tokens"]
        assert usage["total_tokens"] == 60 == _tokens_today(srv, "long", 1)
    finally:
        srv.stop()


def test_metrics_parse_and_count_a_request(guarded: ServerProcess):
    r = web.post(guarded.base + "/v1/chat/completions", json=CHAT)
    assert r.status_code == 200
    text = web.get(guarded.base + "/metrics").text
    families = {f.name: f for f in text_string_to_metric_families(text)}
    requests = families["localllm_requests"]
    ok = [s for s in requests.samples if s.name == "localllm_requests_total"
          and s.labels == {"route": "/v1/chat/completions", "model": "starter", "status": "200"}]
    assert ok and ok[0].value >= 1
    tokens = {(s.labels["kind"]): s.value for s in families["localllm_tokens"].samples
              if s.name == "localllm_tokens_total"}
    assert tokens["prompt"] > 0 and tokens["completion"] > 0
    ttft = families["localllm_time_to_first_token_seconds"]
    count = [s for s in ttft.samples if s.name.endswith("_count")]
    assert count and count[0].value >= 1
    for name in ("localllm_queue_depth", "localllm_active_sequences", "localllm_loaded_models",
                 "localllm_model_memory_bytes", "localllm_prompt_cache_bytes",
                 "localllm_prompt_cache_hits", "localllm_time_per_output_token_seconds"):
        assert name in families, name
    loaded = families["localllm_loaded_models"].samples[0].value
    assert loaded == 1


def test_access_log_has_one_json_line_per_request(guarded: ServerProcess):
    r = web.post(guarded.base + "/v1/completions", json={"prompt": "Hi", "max_tokens": 3},
                   headers={"X-Request-Id": "log-check-1"})
    assert r.status_code == 200
    for _ in range(50):
        lines = [json.loads(line) for line in guarded.log.read_text().splitlines()
                 if line.startswith("{") and "log-check-1" in line]
        if lines:
            break
        time.sleep(0.1)
    assert len(lines) == 1
    line = lines[0]
    assert line["route"] == "/v1/completions" and line["status"] == 200
    assert line["model"] == "starter" and line["client"] == "anonymous"
    assert line["prompt_tokens"] > 0 and line["completion_tokens"] == 3
    assert line["ttft_s"] > 0 and line["duration_s"] >= line["ttft_s"]


# -- processes ---------------------------------------------------------------------------


@pytest.mark.process
def test_non_loopback_bind_needs_a_key_or_no_auth(tmp_path: Path):
    env = {**os.environ, "LOCALLLM_DATA_DIR": str(tmp_path / "data"),
           "LOCALLLM_CONFIG": str(tmp_path / "none.toml")}
    done = subprocess.run([sys.executable, "-m", "localllm", "serve", "--host", "0.0.0.0",
                           "--port", "1"], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert "localllm keys add" in done.stderr and "--no-auth" in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.process
def test_sigterm_drains_for_drain_s_then_exits_0(tmp_path: Path):
    srv = ServerProcess(tmp_path, env={"LOCALLLM_DRAIN_S": "1"})
    got: list[str] = []
    first = threading.Event()

    def read() -> None:
        body = {"prompt": "Once upon a time", "max_tokens": 3000, "stream": True,
                "temperature": 0.8, "seed": 1}
        try:
            with httpx.stream("POST", srv.base + "/v1/completions", json=body,
                              timeout=120) as r:
                for line in r.iter_lines():
                    got.append(line)
                    first.set()
        except httpx.HTTPError:
            pass

    t = threading.Thread(target=read)
    t.start()
    try:
        assert first.wait(60)
        srv.proc.send_signal(signal.SIGTERM)
        assert srv.proc.wait(timeout=60) == 0
        t.join(60)
        frames = [g for g in got if g.startswith("data: {")]
        assert 0 < len(frames) < 3000  # cut after the drain, not run to its end
    finally:
        srv.stop()


@pytest.mark.process
def test_clients_that_leave_while_queued_cost_no_prompt_evaluation(tmp_path: Path):
    import socket

    srv = ServerProcess(tmp_path, "--parallel", "1")
    first = threading.Event()

    def hold() -> None:
        body = {"prompt": "Once upon a time", "max_tokens": 300, "stream": True,
                "temperature": 0}
        with httpx.stream("POST", srv.base + "/v1/completions", json=body, timeout=120) as r:
            for _ in r.iter_lines():
                first.set()

    t = threading.Thread(target=hold)
    t.start()
    try:
        assert first.wait(60)
        long_prompt = json.dumps({"prompt": "word " * 2500, "max_tokens": 8, "stream": True})
        request = (f"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                   f"Content-Type: application/json\r\nContent-Length: {len(long_prompt)}\r\n"
                   f"\r\n{long_prompt}").encode()
        socks = []
        for _ in range(4):
            s = socket.create_connection(("127.0.0.1", srv.port))
            s.sendall(request)
            socks.append(s)
        for _ in range(100):
            if srv.health()["activity"]["queued"] >= 4:
                break
            time.sleep(0.05)
        assert srv.health()["activity"]["queued"] >= 4, srv.health()["activity"]
        for s in socks:
            s.close()  # the clients leave while they wait
        t.join(120)
        for _ in range(100):
            if srv.health()["activity"]["queued"] == 0:
                break
            time.sleep(0.05)
        totals = srv.health()["totals"]
        assert totals["requests"] == 1, totals  # only the first was ever started
        assert totals["prompt_tokens"] < 100, totals  # no 2,500-word prompt was read
    finally:
        srv.stop()


def test_openapi_describes_what_the_server_answers(guarded: ServerProcess):
    doc = web.get(guarded.base + "/openapi.json").json()
    chat = doc["paths"]["/v1/chat/completions"]["post"]
    assert "422" not in chat["responses"]
    for status in ("400", "401", "403", "404", "413", "415", "429", "503"):
        ref = chat["responses"][status]["content"]["application/json"]["schema"]["$ref"]
        assert ref == "#/components/schemas/Error"
    assert "text/event-stream" in chat["responses"]["200"]["content"]
    assert doc["components"]["securitySchemes"]["bearer"]["scheme"] == "bearer"
    assert set(doc["paths"]["/health"]["get"]["responses"]) >= {"200", "503"}
