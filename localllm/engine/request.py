"""The engine's plain types: what a face asks for (`Request`, `Infill`), what it hears
first (`Started`) and last (`END`), and the `Job` a request travels as through the
worker and the scheduler. Faces, the scheduler and the remote route import these, never
the worker."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from localllm.backends.base import Chunk, GenerationStats, Message, ModelRef, SamplingParams
from localllm.backends.tools import ToolSpec

END: Any = object()  # the worker's last item for a request


@dataclass(frozen=True, slots=True)
class Started:
    """Sent once a request's prompt is rendered and fits: the stream will now produce chunks."""

    model: str
    prompt_tokens: int
    dropped_messages: int = 0  # by the truncate-oldest policy
    prompt_tokens_before: int = 0  # the prompt's length before those were dropped
    tool_format: str | None = None  # how the reply writes tool calls (backends/tools.py)
    tool_names: tuple[str, ...] = ()  # the functions it may call
    backend: str | None = None  # "remote" for a remote engine's model (else not said)
    # how the reply may carry reasoning (backends/reasoning.py): "open", "tags" or None
    reasoning: str | None = None
    # a remote that could not answer, when its local fallback does instead, and why
    fallback_from: str | None = None
    note: str | None = None
    # the answer's token limit when the API key's quota for the day cut it (else None)
    quota_max_tokens: int | None = None


@dataclass(frozen=True, slots=True)
class Infill:
    """A repo-level fill-in-the-middle prompt (llama-server's /infill)."""

    prefix: str
    suffix: str
    extra: tuple[tuple[str, str], ...] = ()  # (filename, text) chunks, oldest first
    typed: str = ""  # the text typed so far on the cursor's line: after the middle marker


@dataclass(frozen=True, slots=True)
class Request:
    """What to generate. Exactly one of messages / prompt / prompt_tokens is set."""

    params: SamplingParams
    messages: Sequence[Message] | None = None
    prompt: str | None = None
    suffix: str | None = None  # with prompt: fill in the middle
    prompt_tokens: Sequence[int] | None = None
    model: str | None = None  # None: whatever is loaded
    # a chat longer than the context: "error" (ContextOverflow) or "truncate-oldest"
    context_policy: str = "error"
    # seconds an on-demand model stays loaded after this request (None: the setting's)
    keep_alive: float | None = None
    speculate: str | None = None  # off | lookup | draft | auto; None: the setting's
    draft_model: str | None = None  # None: the setting's
    priority: str | None = None  # "high": ahead of others (see scheduler.py); None: normal
    deterministic: bool | None = None  # runs alone, exact prefixes only; None: the setting's
    client: str = "local"  # who asked, for usage accounting: a key's name, "chat", ...
    request_id: str | None = None  # the endpoint's id for the request (access log, metrics)
    allow_paths: bool = True  # may `model` be a file or folder path (API: a setting)
    tools: ToolSpec | None = None  # functions the model may call, and the caller's choice
    template_vars: Mapping[str, Any] | None = None  # chat_template_kwargs (enable_thinking)
    # the context the caller wants (Ollama's num_ctx): an idle model loaded with less is
    # reloaded with more, up to its trained context, when memory allows
    min_ctx: int | None = None
    infill: Infill | None = None  # a repo-level FIM prompt instead of messages or prompt
    # the wire's response_format (with params.grammar): what a remote engine is sent
    response_format: Mapping[str, Any] | None = None
    # LoRA adapters as (id, scale), the others off (llama-server's per-request `lora`);
    # None: the model's global scales (engine/adapters.py)
    lora: tuple[tuple[int, float], ...] | None = None


@dataclass(slots=True)
class Job:
    """A request (or a load, or a call) on its way through the worker: what the scheduler
    queues and runs."""

    request: Request
    ref: ModelRef | None
    emit: Callable[[Any], None]
    cancel: threading.Event = field(default_factory=threading.Event)
    load_only: bool = False  # load (or swap to) ref, generate nothing
    call: Callable[[], Any] | None = None  # run this on the worker; its result is emitted
    progress: Callable[[float], None] | None = None
    n_ctx: int | None = None  # with load_only: the context size to load with
    backend: str | None = None  # with load_only: auto | llamacpp | mlx (None: as before)
    on_end: Callable[[], None] | None = None  # told once, when the job ends
    arrival: int = 0  # order of arrival at its model's scheduler
    submitted: float = field(default_factory=time.monotonic)
    prompt: tuple[list[int], int, int] | None = None  # fit_prompt's answer, once tokenized
    tool_format: str | None = None  # with tools: how the model writes calls
    reserved: int = 0  # tokens held for it against its API key's daily quota
    # seconds its reader has been behind, None while it keeps up (ChunkStream.behind);
    # behind, it is paused; behind for over `stall_s`, it may be ended (engine/sequence.py)
    reader: Callable[[], float | None] | None = None
    stall_s: float = 30.0

    @property
    def ready(self) -> bool:
        """Its prompt is tokenized: the scheduler may start it."""
        return self.prompt is not None

    def end(self, item: Any = END) -> None:
        """The job's last item: END, or the error it failed with (counted out first, so
        that whoever hears it ended finds it no longer outstanding)."""
        on_end, self.on_end = self.on_end, None
        try:
            if on_end is not None:
                on_end()
        finally:
            self.emit(item)


def end_unstarted(job: Job, model: str) -> None:
    """A request abandoned while it waited: it ends the usual way, with nothing generated
    (its caller then sends END)."""
    job.emit(Started(model=model, prompt_tokens=0))
    job.emit(Chunk("", (), finish_reason="cancelled", stats=GenerationStats(0, 0, 0, 0.0, 0.0)))


INTERACTIVE_MAX_TOKENS = 64  # a raw completion asking for at most this many is interactive


def interactive(request: Request) -> bool:
    """Autocomplete and requests marked high priority: admitted first, prefilled first,
    with a reserve of the queue of their own (engine/worker.py)."""
    if request.priority == "high":
        return True
    limit = request.params.max_tokens
    small = limit is not None and limit <= INTERACTIVE_MAX_TOKENS
    return request.messages is None and small
