"""Work that grows with a request is bounded first and done beside the model's steps
(round 4 of the review): a tool list is capped before it is validated and checked in
linear time, and tokenizing for /tokenize and token counts runs on the caller's thread
with the model held, not on the engine's worker between steps."""

from __future__ import annotations

import dataclasses
import threading

import pytest
from pydantic import ValidationError

from localllm.backends.base import Message, SamplingParams
from localllm.backends.fake import FakeBackend, Script, write_fake_model
from localllm.backends.tools import ToolChoice
from localllm.config import Settings
from localllm.engine.engine import Engine
from localllm.engine.request import Request
from localllm.errors import InvalidRequest
from localllm.server import wire
from localllm.server.openai.schemas import ChatCompletionRequest


def _tools(n: int) -> list[dict]:
    return [{"type": "function", "function": {"name": f"f{i}"}} for i in range(n)]


def test_a_tool_list_past_the_cap_is_refused_before_it_is_validated():
    """60,000 tools in a 3 MB body held the event loop 183 s (a quadratic duplicate check
    after 0.7 s of validation); the count is checked first now."""
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    with pytest.raises(ValidationError, match="60,000 tools; at most 1,024"):
        ChatCompletionRequest.model_validate({**body, "tools": _tools(60_000)})
    ok = ChatCompletionRequest.model_validate({**body, "tools": _tools(wire.MAX_TOOLS)})
    spec = ok.tool_spec()
    assert spec is not None and len(spec.functions()) == wire.MAX_TOOLS
    twice = [{"name": f"f{i % 1000}"} for i in range(wire.MAX_TOOLS)]
    with pytest.raises(InvalidRequest, match="two tools have the name 'f0'"):
        wire.tool_spec(twice, ToolChoice())


def test_tokenizing_beside_the_worker_leaves_it_free(settings: Settings):
    """with_model(beside=True) runs on the caller's thread with the model held: a request
    completes while it runs (on the worker it would wait behind it: this would hang)."""
    write_fake_model(settings.models_dir / "scripted.gguf")
    engine = Engine(dataclasses.replace(settings, model="scripted"),
                    backends=[FakeBackend(Script(reply="ok"))])
    inside, release = threading.Event(), threading.Event()
    seen: list[str] = []

    def slow(model: object) -> int:
        seen.append(threading.current_thread().name)
        inside.set()
        assert release.wait(60)
        return 1

    try:
        worker = threading.Thread(target=lambda: engine.with_model(None, slow, beside=True))
        worker.start()
        assert inside.wait(60)
        ask = Request(SamplingParams(temperature=0, max_tokens=2),
                      messages=[Message("user", "hi")])
        assert "".join(c.text for c in engine.generate(ask))  # answered meanwhile
        assert engine.status().loaded  # held loaded
        release.set()
        worker.join(60)
        assert not worker.is_alive() and seen and seen[0] != "localllm-engine"
    finally:
        release.set()
        engine.close()
