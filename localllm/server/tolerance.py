"""The tolerance rule, in one place per API: the fields real clients send as their own
bookkeeping, accepted and ignored, each with the client that sends it and why ignoring it
cannot change the answer.

The rule (README, "What each API accepts"):
- a field that changes what the model produces and that localllm cannot honour is a 400
  naming it;
- a field listed here is a client's bookkeeping (timings, ids, slot and cache hints,
  metadata, client names): accepted and ignored;
- any other unknown field is a 400, as before.

A schema names its list in `IGNORED` (see `wire.Wire`); the lists are data, so the README
table and the replay tests read them from here.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Ignored:
    field: str
    sent_by: str
    why: str


def names(*lists: tuple[Ignored, ...]) -> frozenset[str]:
    return frozenset(item.field for items in lists for item in items)


# /v1/chat/completions and /v1/completions
OPENAI = (
    Ignored("user", "OpenAI SDK users, litellm", "the caller's end-user id, for its own records"),
    Ignored(
        "safety_identifier", "OpenAI SDK users", "a hashed end-user id for OpenAI's abuse checks"
    ),
    Ignored(
        "prompt_cache_key",
        "Codex CLI, OpenAI SDK users",
        "a routing hint for OpenAI's cache; localllm's prompt cache finds shared prefixes itself",
    ),
    Ignored("metadata", "OpenAI SDK users", "the caller's tags for its stored completions"),
    Ignored(
        "id_slot",
        "llama.vim (instruct), llama.vscode",
        "llama-server's slot number; localllm picks the sequence by its cached prefix",
    ),
    Ignored(
        "cache_prompt",
        "llama.vim, llama.vscode (edit mode)",
        "llama-server's cache switch; the answer is the same with or without the cache, "
        "and localllm always keeps it",
    ),
    Ignored(
        "t_max_prompt_ms",
        "llama.vim, llama.vscode",
        "llama-server parses it and does nothing with it (a TODO in its source)",
    ),
    Ignored(
        "response_fields",
        "llama.vim (instruct warm-up)",
        "llama-server applies it to /completion and /infill only, not to the OpenAI routes",
    ),
    Ignored(
        "timings_per_token",
        "llama.cpp's web UI",
        "asks llama-server for timing figures beside each chunk; the text is the same",
    ),
)

# /infill: the chunk objects of `input_extra`
INFILL_CHUNK = (
    Ignored(
        "time",
        "llama.vim (reltime() pair), llama.vscode (Date.now())",
        "when the editor picked the chunk, for its own ring buffer; llama-server ignores it",
    ),
)

# /infill
INFILL = (
    Ignored(
        "id_slot",
        "llama.vim, llama.vscode",
        "llama-server's slot number; localllm picks the sequence by its cached prefix",
    ),
    Ignored(
        "t_max_prompt_ms",
        "llama.vim, llama.vscode",
        "llama-server parses it and does nothing with it (a TODO in its source); cutting the "
        "prompt short would answer an editor's first large request with nothing",
    ),
)

# /v1/messages and /v1/messages/count_tokens
ANTHROPIC = (
    Ignored(
        "context_management",
        "Claude Code",
        "asks Anthropic's servers to clear old tool results or thinking once the context is "
        "long; the prompt as sent is what localllm answers, and a too-long one is a 400",
    ),
    Ignored(
        "container",
        "anthropic SDK users of code execution",
        "names a hosted sandbox for server tools; none is offered, so no tool can use it",
    ),
)

# /v1/responses
RESPONSES = (
    Ignored(
        "prompt_cache_key",
        "Codex CLI",
        "a routing hint for OpenAI's cache; localllm's prompt cache finds shared prefixes itself",
    ),
    Ignored(
        "client_metadata",
        "Codex CLI",
        "the client's own tags (installation, session), for its records",
    ),
    Ignored("metadata", "OpenAI SDK users", "the caller's tags, stored with the response"),
    Ignored("user", "OpenAI SDK users", "the caller's end-user id, for its own records"),
    Ignored("safety_identifier", "OpenAI SDK users", "a hashed end-user id for OpenAI's checks"),
    Ignored(
        "prompt_cache_retention",
        "OpenAI SDK users",
        "how long OpenAI keeps its cache; localllm's is bounded by its own budget",
    ),
)

# Ollama's `options`
OLLAMA_OPTIONS = (
    Ignored(
        "num_thread", "Continue, Open WebUI", "threads for the runtime; the engine's own setting"
    ),
    Ignored("num_gpu", "Continue, Open WebUI", "layers to offload; placement is the engine's"),
    Ignored("main_gpu", "Open WebUI", "which GPU to use; placement is the engine's"),
    Ignored("use_mmap", "Continue, Open WebUI", "how the weights are read from disk"),
    Ignored("use_mlock", "Open WebUI", "whether the weights are locked in RAM"),
    Ignored(
        "num_batch", "Open WebUI", "the prefill batch size; the engine chunks the prompt itself"
    ),
    Ignored("low_vram", "older Ollama clients", "a memory hint for the runtime"),
    Ignored("numa", "older Ollama clients", "a NUMA hint for the runtime"),
)

ALL = {
    "OpenAI (/v1/chat/completions, /v1/completions)": OPENAI,
    "llama-server (/infill)": INFILL,
    "llama-server (/infill, each input_extra chunk)": INFILL_CHUNK,
    "Anthropic (/v1/messages)": ANTHROPIC,
    "OpenAI Responses (/v1/responses)": RESPONSES,
    "Ollama (options)": OLLAMA_OPTIONS,
}
