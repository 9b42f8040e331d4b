"""Remote engines without a network: the config tables, model "auto" rules, the request
sent to an engine, Retry-After and the circuit breaker."""

from __future__ import annotations

import email.utils
import time

import pytest

from localllm.backends.base import Message, SamplingParams, ToolCall
from localllm.backends.remote import Breaker, RemoteModel, _model_of, _retry_after
from localllm.backends.tools import ToolChoice, ToolSpec
from localllm.config import RouteRule, load_settings
from localllm.engine.remote_route import Remotes, body_of
from localllm.engine.request import Request
from localllm.engine.routing import route
from localllm.errors import ConfigError, InvalidRequest


def settings_with(tmp_path, text: str):
    path = tmp_path / "config.toml"
    path.write_text(text)
    return load_settings(env={"LOCALLLM_CONFIG": str(path)})


def test_tables_in_the_config_file(tmp_path):
    s = settings_with(tmp_path, """
[[remotes]]
name = "team"
url = "http://gpu:8000/v1"
api_key_env = "TEAM_KEY"
models = ["llama-70b"]
fallback = "starter"

[[routes]]
tools = true
model = "team/llama-70b"

[[routes]]
model = "starter"
""")
    assert s.remotes[0].models == ("llama-70b",) and s.remotes[0].retries == 2
    assert s.routes == (RouteRule("team/llama-70b", tools=True), RouteRule("starter"))
    remotes = Remotes(s, env={"TEAM_KEY": "k"})
    found = remotes.find("team/llama-70b")
    assert found is not None
    up, model = found
    assert model == "llama-70b" and up.headers()["Authorization"] == "Bearer k"
    assert remotes.find("starter") is None and remotes.find("other/x") is None
    assert (remotes.find("team/org/model") or (None, ""))[1] == "org/model"  # ids may hold a '/'


@pytest.mark.parametrize(("text", "said", "names_file"), [
    ('remotes = "http://gpu:8000/v1"', "remotes must be a list of tables", True),
    ('[[remotes]]\nname = "a"\nurl = "http://x/v1"\nmodels = "m"', "remotes[0].models", True),
    ('[[remotes]]\nname = "a"\nurl = "http://x/v1"\nkey = "s"', "unknown key(s) key", True),
    ('[[remotes]]\nname = "a/b"\nurl = "http://x/v1"', "without '/'", False),
    ('[[remotes]]\nname = "a"\nurl = "gpu:8000"', "http:// or https://", False),
    ('[[routes]]\nmodel = "auto"', "cannot be auto", False),
    ('[[routes]]\nmodel = "m"\npriority = "urgent"', "high or normal", False),
])
def test_bad_tables_are_one_line_naming_the_key(tmp_path, text: str, said: str,
                                                names_file: bool):
    """Shape errors name the file too; value errors (checked once the layers are merged)
    name the key and the value."""
    with pytest.raises(ConfigError) as err:
        settings_with(tmp_path, text)
    assert said in err.value.message and "\n" not in err.value.message
    assert ("config.toml" in err.value.message) == names_file


def test_environment_takes_json_and_wins_over_the_file(tmp_path):
    path = tmp_path / "config.toml"
    path.write_text('[[remotes]]\nname = "file"\nurl = "http://a/v1"\n')
    s = load_settings(env={"LOCALLLM_CONFIG": str(path),
                           "LOCALLLM_REMOTES": '[{"name": "env", "url": "http://b/v1"}]'})
    assert [r.name for r in s.remotes] == ["env"]


def ask(content: str, **kw) -> Request:
    return Request(SamplingParams(), messages=[Message("user", content)], model="auto", **kw)


def test_auto_takes_the_first_rule_that_matches():
    rules = (RouteRule("big", min_prompt_chars=100), RouteRule("tools", tools=True),
             RouteRule("vip", client="alice", priority="high"), RouteRule("small"))
    assert route(rules, ask("x" * 100)).model == "big"
    spec = ToolSpec(({"type": "function", "function": {"name": "f"}},), ToolChoice("auto"))
    assert route(rules, ask("hi", tools=spec)).model == "tools"
    assert route(rules, ask("hi", client="alice", priority="high")).model == "vip"
    assert route(rules, ask("hi", client="alice")).model == "small"
    assert route(rules, Request(SamplingParams(), prompt="p", model="m")).model == "m"
    with pytest.raises(InvalidRequest, match="no routing rule matches"):
        route(rules[:1], ask("hi"))
    with pytest.raises(InvalidRequest, match=r"\[\[routes\]\]"):
        route((), ask("hi"))


def test_the_request_an_engine_is_sent():
    call = ToolCall("call_1", "f", '{"a": 1}')
    req = Request(
        SamplingParams(temperature=0.0, max_tokens=9, stop=("x",), seed=4, repeat_penalty=1.1),
        messages=[Message("user", "q"), Message("assistant", "", tool_calls=(call,)),
                  Message("tool", "42", tool_call_id="call_1", name="f")],
        model="team/m",
        tools=ToolSpec(({"type": "function", "function": {"name": "f"}},),
                       ToolChoice("function", "f", False)),
        template_vars={"enable_thinking": False},
    )
    path, body = body_of(req, "m")
    assert path == "/chat/completions" and body["model"] == "m" and body["stream"] is True
    assert body["stream_options"] == {"include_usage": True}
    assert (body["temperature"], body["max_tokens"], body["stop"], body["seed"]) == (
        0.0, 9, ["x"], 4)
    assert body["repetition_penalty"] == 1.1
    sent_call = body["messages"][1]["tool_calls"][0]
    assert sent_call["function"] == {"name": "f", "arguments": '{"a": 1}'}
    assert body["messages"][2] == {"role": "tool", "content": "42", "tool_call_id": "call_1",
                                   "name": "f"}
    assert body["tool_choice"] == {"type": "function", "function": {"name": "f"}}
    assert body["parallel_tool_calls"] is False
    assert body["chat_template_kwargs"] == {"enable_thinking": False}
    # what a client left unset is the engine's own default (vLLM's: generation_config.json)
    _, body = body_of(Request(SamplingParams.asked(top_k=5), messages=[Message("user", "q")],
                              model="t/m"), "m")
    assert body["top_k"] == 5 and not {"temperature", "top_p", "min_p"} & set(body)
    path, body = body_of(Request(SamplingParams(), prompt="def f(", suffix=")", model="t/m"), "m")
    assert path == "/completions" and body["prompt"] == "def f(" and body["suffix"] == ")"


@pytest.mark.parametrize("field", ["prompt_tokens", "logprobs", "format"])
def test_what_a_remote_cannot_take_is_a_400_naming_it(field: str):
    kw: dict = {"messages": [Message("user", "q")]}
    params = SamplingParams()
    if field == "prompt_tokens":
        kw = {"prompt_tokens": [1, 2]}
    elif field == "logprobs":
        params = SamplingParams(logprobs=2)
    else:
        params = SamplingParams(grammar="start: x")  # a grammar without a response_format
    with pytest.raises(InvalidRequest) as err:
        body_of(Request(params, model="t/m", **kw), "m")
    assert err.value.param == field and "t/m" in err.value.message


def test_retry_after_and_backoff():
    assert _retry_after("3", 0) == 3.0
    when = email.utils.formatdate(time.time() + 5, usegmt=True)
    assert 3.0 < _retry_after(when, 0) <= 5.0
    assert [_retry_after(None, i) for i in range(3)] == [0.5, 1.0, 2.0]


def test_breaker_trips_after_consecutive_failures_and_resets_on_success():
    b = Breaker(trip=2, down_for=60)
    b.failed("refused")
    assert b.down_for_s() == 0
    b.succeeded()
    b.failed("refused")
    assert b.down_for_s() == 0  # the success reset the count
    b.failed("refused again")
    assert 59 < b.down_for_s() <= 60 and b.last_error == "refused again"
    b.down_until = time.monotonic() - 1  # its time is up: one request may try again
    assert b.down_for_s() == 0


def test_context_length_as_each_engine_reports_it():
    assert _model_of("r", {"id": "a", "max_model_len": 32768}) == RemoteModel("r", "a", 32768)
    assert _model_of("r", {"id": "b", "meta": {"n_ctx_train": 8192}}).n_ctx == 8192
    assert _model_of("r", {"id": "c"}).n_ctx is None
