"""The tolerance rule (server/tolerance.py): every field listed as a client's bookkeeping
is accepted on its route and ignored; a field that is neither honoured nor listed is still
a 400 naming it."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from localllm.server import tolerance
from tests.clients.conftest import MODEL

CHAT = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}
MESSAGES = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}
INFILL = {"input_prefix": "def f():\n", "input_suffix": "\n", "n_predict": 2}
OLLAMA = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "stream": False}
VALUE = {"time": [1764000000, 5], "metadata": {"k": "v"}}  # the shapes clients send


def ok(reply: httpx.Response) -> None:
    assert reply.status_code == 200, reply.text


@pytest.mark.parametrize("item", tolerance.OPENAI, ids=lambda i: i.field)
def test_openai_bookkeeping(http: httpx.Client, item: tolerance.Ignored):
    value = VALUE.get(item.field, 1)
    ok(http.post("/v1/chat/completions", json={**CHAT, item.field: value}))
    ok(http.post("/v1/completions", json={"prompt": "Hi", "max_tokens": 2, item.field: value}))


def test_the_others_are_accepted_where_they_are_listed(http: httpx.Client):
    for item in tolerance.ANTHROPIC:
        ok(http.post("/v1/messages", json={**MESSAGES, item.field: {"edits": []}}))
    for item in tolerance.INFILL:
        ok(http.post("/infill", json={**INFILL, item.field: 1}))
    chunk = {"text": "x = 1\n", "filename": "a.py"}
    for item in tolerance.INFILL_CHUNK:
        ok(http.post("/infill", json={**INFILL,
                                      "input_extra": [{**chunk, item.field: VALUE["time"]}]}))
    options = {item.field: 1 for item in tolerance.OLLAMA_OPTIONS}
    ok(http.post("/api/chat", json={**OLLAMA, "options": {**options, "num_predict": 2}}))


@pytest.mark.parametrize("path, body, field", [
    ("/v1/chat/completions", CHAT, "mirostat"),
    ("/v1/messages", MESSAGES, "service_tier_x"),
    ("/infill", INFILL, "dry_multiplier"),
    ("/api/chat", {**OLLAMA, "options": {"mirostat": 2}}, "mirostat"),
])
def test_what_would_change_the_answer_is_still_refused(
    http: httpx.Client, path: str, body: dict[str, Any], field: str
):
    sent = body if field in str(body) else {**body, field: 1}
    reply = http.post(path, json=sent)
    assert reply.status_code == 400, reply.text
    assert field in reply.text
