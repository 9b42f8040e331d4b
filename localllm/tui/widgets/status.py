"""The status bar: model, backend and device, endpoint, context used, requests, memory."""

from __future__ import annotations

from textual.reactive import reactive
from textual.widgets import Static

from localllm.backends.base import ModelInfo


def context_text(used: int, info: ModelInfo) -> str:
    """Tokens in the context against its size, and the KV type when it is quantized."""
    kv = info.extra.get("kv_type", "f16")
    return f"ctx {used}/{info.n_ctx}" + (f" (KV {kv})" if kv != "f16" else "")


class StatusBar(Static):
    model: reactive[str] = reactive("no model")
    device: reactive[str] = reactive("")
    endpoint: reactive[str] = reactive("")
    context: reactive[str] = reactive("")
    memory: reactive[str] = reactive("")
    state: reactive[str] = reactive("")
    speculation: reactive[str] = reactive("")  # the last answer's drafts and speed-up
    activity: reactive[str] = reactive("")  # requests running and waiting, prefill progress
    pulling: reactive[str] = reactive("")  # a model being pulled from the hub
    tools: reactive[str] = reactive("")  # MCP servers starting, failed or stopped

    def render(self) -> str:
        fields = (
            self.state,
            self.model,
            self.device,
            self.endpoint,
            self.context,
            self.speculation,
            self.activity,
            self.pulling,
            self.tools,
            self.memory,
        )
        parts = [p for p in fields if p]
        return "  ·  ".join(parts)
