"""GitHub Copilot Chat's bring-your-own-model Ollama provider, replayed:
microsoft/vscode-copilot-chat, src/extension/byok/vscode-node/ollamaProvider.ts at commit
0ea4ed3d48bbdcb72516387094048372908297db. Before it lists anything it checks
`GET /api/version` against its minimum (0.6.4, compared part by part as numbers); then
`GET /api/tags` and, for each model's `model` name, `POST /api/show` with
`{"model": ...}` (Content-Type JSON), from which it reads `capabilities` ("tools",
"vision"), `model_info["general.basename"]`, `model_info["general.architecture"]` and
the context length under `model_info["<architecture>.context_length"]` (4096 when it is
missing, which would cap every prompt there). It chats through the OpenAI-compatible
`/v1/chat/completions` of the same server (AbstractOpenAICompatibleLMProvider).
"""

from __future__ import annotations

import json

import httpx
import openai

from tests.clients.conftest import MODEL
from tests.conftest import ServerProcess

MINIMUM = (0, 6, 4)  # MINIMUM_OLLAMA_VERSION in ollamaProvider.ts


def _version_parts(text: str) -> tuple[int, ...]:
    """As _isVersionSupported reads a version: split on dots, each part parseInt'ed."""
    parts = []
    for piece in text.split("."):
        digits = ""
        for ch in piece:  # parseInt reads the leading digits
            if not ch.isdigit():
                break
            digits += ch
        parts.append(int(digits) if digits else 0)
    return tuple(parts)


def test_discovery_as_copilot_does_it(http: httpx.Client):
    version = http.get("/api/version").json()["version"]
    assert _version_parts(version) >= MINIMUM, version
    models = http.get("/api/tags").json()["models"]
    names = [m["model"] for m in models]
    assert MODEL in names or f"{MODEL}:latest" in names, names
    name = MODEL if MODEL in names else f"{MODEL}:latest"
    shown = http.post("/api/show", content=json.dumps({"model": name}),
                      headers={"Content-Type": "application/json"})
    assert shown.status_code == 200, shown.text
    info = shown.json()
    assert isinstance(info["template"], str) and isinstance(info["capabilities"], list)
    assert "tools" in info["capabilities"]
    assert isinstance(info["details"]["family"], str)
    facts = info["model_info"]
    arch = facts["general.architecture"]
    assert isinstance(facts["general.basename"], str) and facts["general.basename"]
    assert facts[f"{arch}.context_length"] >= 4096  # the server's context, not the 4096 guess


def test_chat_through_the_openai_face(clients_server: ServerProcess):
    """The same server's /v1, as the provider's OpenAI-compatible base streams a chat
    with the editor's tools offered."""
    client = openai.OpenAI(base_url=clients_server.base + "/v1", api_key="ollama",
                           max_retries=0)
    stream = client.chat.completions.create(
        model=MODEL, stream=True, stream_options={"include_usage": True},
        messages=[{"role": "system", "content": "You are an AI programming assistant."},
                  {"role": "user", "content": "Say hello."}],
        tools=[{"type": "function", "function": {
            "name": "read_file", "description": "Read a file in the workspace",
            "parameters": {"type": "object", "properties": {"filePath": {"type": "string"}},
                           "required": ["filePath"]}}}],
        max_tokens=32, temperature=0.1, top_p=1, n=1)
    text, calls, usage = "", 0, None
    for event in stream:
        usage = event.usage or usage
        for choice in event.choices:
            text += choice.delta.content or ""
            calls += len(choice.delta.tool_calls or [])
    assert text or calls
    assert usage is not None and usage.completion_tokens >= 1
