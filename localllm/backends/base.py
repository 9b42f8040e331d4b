"""The backend contract: plain dataclasses and the two protocols every backend implements.

Nothing here imports an inference library; the rest of the app talks to models
only through `Backend` and `LoadedModel`.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, ClassVar, Literal, Protocol

Role = Literal["system", "user", "assistant", "tool"]
DEFAULT_MAX_CTX = 4096  # the context a model gets unless told otherwise, if it was trained longer


def default_n_ctx(n_ctx_train: int) -> int:
    """The default context size: the trained context, at most DEFAULT_MAX_CTX."""
    return min(n_ctx_train or DEFAULT_MAX_CTX, DEFAULT_MAX_CTX)


FinishReason = Literal["stop", "length", "cancelled"]


@dataclass(frozen=True, slots=True)
class ToolCall:
    """A function call an assistant made: `arguments` is JSON text, as OpenAI sends it."""

    id: str
    name: str
    arguments: str


MediaKind = Literal["image", "audio"]
# where each of a message's images or audio clips sits in its text (a model's own marker,
# such as mtmd's "<__media__>", could be typed by a user; this one is ours)
MEDIA_MARKER = "<__localllm_media__>"


@dataclass(frozen=True, slots=True, eq=False)
class Media:
    """An image or audio clip in a prompt, checked and decoded (backends/media.py): an
    image as RGB pixels, row by row; audio as its file (wav, mp3 or flac). `digest` is the
    SHA-256 of the bytes it came as: the prompt cache knows a picture by it."""

    kind: MediaKind
    data: bytes
    digest: str
    width: int = 0
    height: int = 0
    # the file it came as and its type (image/png, audio/wav): what a remote engine is sent
    source: bytes = b""
    mime: str = ""


@dataclass(frozen=True, slots=True)
class Message:
    role: Role
    content: str
    tool_calls: tuple[ToolCall, ...] = ()  # an assistant's calls
    tool_call_id: str | None = None  # a tool result: the call it answers
    name: str | None = None  # a tool result: the function's name
    # images and audio, in the order their MEDIA_MARKERs appear in `content`
    media: tuple[Media, ...] = ()


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """How to pick tokens. temperature 0 means greedy; max_tokens None means up to the context."""

    temperature: float = 0.8
    top_p: float = 0.95
    top_k: int = 40
    min_p: float = 0.05
    repeat_penalty: float = 1.0
    seed: int | None = None
    max_tokens: int | None = None
    stop: tuple[str, ...] = ()
    frequency_penalty: float = 0.0  # OpenAI's: minus this times a token's count so far
    presence_penalty: float = 0.0  # minus this once a token has appeared
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, bias added to its logit)
    # decoding constrained to a grammar (llguidance's serialized form: engine/grammar.py)
    grammar: str | None = None
    # report each token's log probability and this many alternatives (None: none)
    logprobs: int | None = None
    # llama-server's t_max_predict_ms: once this many seconds have passed since the first
    # token, the answer ends at the next piece with a newline ("length"); None: no bound
    newline_deadline_s: float | None = None
    # a chat template's own turn markers, written out as text by a model that runs on into
    # an invented next turn: they end the answer like stop strings, reported as a plain stop
    end_markers: tuple[str, ...] = ()
    # the answer may not end (an end-of-generation token) before this many tokens: a reply
    # that may call tools or answer in text says something (engine/prompt.py)
    min_tokens: int = 0
    # whether the repeat, frequency and presence penalties count the prompt's tokens (as
    # llama.cpp and OpenAI do) or only the answer's own: a short question's words are
    # then free to be used in its answer (the starter's default, docs/benchmarks.md)
    penalize_prompt: bool = True
    # the fields the caller set; the others take the model's recommended values (None:
    # every field is the caller's, as for params built directly)
    given: frozenset[str] | None = None

    @classmethod
    def asked(cls, **values: object) -> SamplingParams:
        """A request's params: the fields it set (a value of None is not set), the rest
        the defaults above until the model's recommendations replace them."""
        return cls(given=frozenset()).with_overrides(**values)

    def with_overrides(self, **values: object) -> SamplingParams:
        """A copy with the given fields replaced (and counted as the caller's); a value
        of None keeps the current one."""
        chosen = {k: v for k, v in values.items() if v is not None}
        given = None if self.given is None else self.given | frozenset(chosen)
        return replace(self, **chosen, given=given)  # type: ignore[arg-type]

    def with_defaults(self, recommended: Mapping[str, float]) -> SamplingParams:
        """A copy where each field the caller did not set takes the recommended value
        (a model's own: GGUF general.sampling.*, generation_config.json)."""
        if self.given is None:
            return self
        fill = {k: v for k, v in recommended.items() if k not in self.given}
        if not fill:
            return self
        typed = {k: _typed(k, v) for k, v in fill.items()}
        return replace(self, **typed)  # type: ignore[arg-type]


def _typed(key: str, value: float) -> int | float | bool:
    """A recommended value (a number in GGUF metadata or JSON) as the field's type."""
    if key == "top_k":
        return int(value)
    if key == "penalize_prompt":
        return bool(value)
    return float(value)


@dataclass(frozen=True, slots=True)
class GenerationStats:
    prompt_tokens: int
    cached_tokens: int
    generated_tokens: int
    ttft_s: float  # request start to first generated token
    decode_tps: float  # generated tokens per second after the first
    draft_accepted: int = 0
    draft_proposed: int = 0
    speedup: float = 0.0  # decode speed with drafts / measured plain speed; 0: not measured
    # why speculation was off for this request though it was on for the model (a sampler
    # it cannot keep exact); "" when it ran or was not asked for
    draft_off: str = ""


@dataclass(frozen=True, slots=True)
class TokenLogprob:
    """A generated token's log probability under the model, and the most likely tokens
    at its place (id, log probability), best first."""

    token: int
    logprob: float
    piece: bytes = b""  # the token's bytes
    top: tuple[tuple[int, float, bytes], ...] = ()  # (id, log probability, bytes)


@dataclass(frozen=True, slots=True)
class Chunk:
    """One streamed piece: complete UTF-8 text and the token ids it came from."""

    text: str
    tokens: tuple[int, ...]
    from_draft: int = 0
    finish_reason: FinishReason | None = None  # exactly one chunk of a stream carries it
    stats: GenerationStats | None = None  # on the final chunk
    logprobs: tuple[TokenLogprob, ...] = ()  # one per token, when the request asked
    stop_sequence: str | None = None  # on the final chunk: the stop string that ended it
    # a remote engine's structured output (engine/output.py passes these on as they are)
    reasoning: str = ""
    tool_calls: tuple[ToolCall, ...] = ()


@dataclass(frozen=True, slots=True)
class FimTokens:
    prefix: int
    suffix: int
    middle: int
    sep: int | None = None  # starts a file of the extra context (repo-level FIM)
    rep: int | None = None  # starts the repository's name


@dataclass(frozen=True, slots=True)
class ModelRef:
    """A resolved, local model: where it is and what it is, before anything is loaded."""

    name: str
    path: Path
    format: Literal["gguf", "mlx", "remote"]  # remote: a model a remote engine serves
    source: str  # "starter" | "store" | "path" | "hf-cache"
    size_bytes: int = 0


@dataclass(frozen=True, slots=True)
class ModelInfo:
    id: str
    format: str
    backend: str
    device: str
    n_ctx: int
    n_ctx_train: int
    chat_template: str | None
    eog_ids: frozenset[int]
    bos_id: int | None
    add_bos: bool
    quant: str
    vocab_fingerprint: str
    fim: FimTokens | None = None
    extra: dict[str, str] = field(default_factory=dict)
    n_vocab: int = 0  # token ids run from 0 to n_vocab - 1; 0: not known
    # the longest token's text in bytes: a text of B bytes is at least B / this many
    # tokens, which bounds a prompt before it is tokenized; 0: not known
    max_token_bytes: int = 0
    # what it reads beside text: "image", "audio" (through its projector); empty: text only
    media: frozenset[str] = frozenset()


@dataclass(frozen=True, slots=True)
class LoadOptions:
    n_ctx: int | None = None  # None: min(trained context, 4096)
    n_threads: int | None = None  # None: physical cores
    n_gpu_layers: int = -1  # -1: all layers when the build can offload
    progress: Callable[[float], None] | None = None  # 0.0 .. 1.0 while loading
    n_seq: int = 1  # sequences decoded together, each with a KV share of n_ctx tokens
    kv_type: str = "f16"  # f16 | q8_0 | q4_0: what the KV cache stores (config KV_CACHE_TYPES)
    # LoRA adapters loaded with the model (ids 0, 1, ... in this order): each file and the
    # scale a request that names no adapters gets
    loras: tuple[tuple[str, float], ...] = ()
    mmproj: str | None = None  # the projector (mmproj GGUF) that lets it read images, audio


@dataclass(frozen=True, slots=True)
class Adapter:
    """A LoRA adapter loaded with a model: its file (or folder, on MLX) and the scale a
    request gets that names no adapters (llama-server's global scale, which
    POST /lora-adapters sets)."""

    path: str
    scale: float
    stamp: str = ""  # the file as it was loaded (size and change time): the cache keys on it

    @classmethod
    def loaded(cls, path: str, scale: float) -> Adapter:
        """An adapter just loaded from `path`, its file's stamp read once, here."""
        try:
            st = os.stat(path)
            stamp = f"{st.st_size}:{st.st_mtime_ns}"
        except OSError:
            stamp = "?"
        return cls(os.path.abspath(path), float(scale), stamp)


# the adapters a step applies: (adapter id, scale) for each one that is on, by id; (): none
Scales = tuple[tuple[int, float], ...]


def global_scales(adapters: Sequence[Adapter]) -> Scales:
    """The adapters a request that names none runs with (perplexity runs with them too)."""
    return tuple((i, a.scale) for i, a in enumerate(adapters) if a.scale)


@dataclass(frozen=True, slots=True, eq=False)
class KVSnapshot:
    """The KV cache of a token prefix, saved from a loaded model.

    `tokens` is everything the sequence had seen (its answers included); its first
    `canonical` tokens are whole common.ALIGN blocks, each evaluated the way a cold run
    evaluates it, so restoring just those gives exactly a cold run's output. `finals`:
    the batches that read a prompt's last token alone; `kept`: that prompt's end and the
    logits its last token gave (common.KVLedger), in RAM only (a state on disk has none).
    """

    tokens: tuple[int, ...]
    nbytes: int
    payload: Any  # backend-specific: bytes (llama.cpp), arrays (MLX)
    canonical: int | None = None  # None: all of `tokens`
    finals: tuple[tuple[int, int], ...] = ()
    kept: tuple[int, Any] | None = None

    @property
    def ram_bytes(self) -> int:
        """What it holds in memory: its KV and the kept logits."""
        return self.nbytes + (int(self.kept[1].nbytes) if self.kept is not None else 0)

    @property
    def exact_tokens(self) -> tuple[int, ...]:
        """The leading tokens a deterministic request may reuse."""
        return self.tokens if self.canonical is None else self.tokens[: self.canonical]


@dataclass(frozen=True, slots=True)
class SeqWork:
    """One sequence's part of a batched step: tokens to evaluate after those its KV holds,
    and for how many of the last of them logits are wanted (1: the next token; 1 + k:
    verifying k drafted tokens; 0: a prompt chunk that is not the last)."""

    seq: int
    tokens: Sequence[int]
    logits: int = 1
    exact: bool = False  # aligned prompt blocks that extend the exact prefix (deterministic)
    final: bool = False  # a prompt's last part, alone in its step (a rerun reads it again)
    last: bool = False  # a prompt's last part: its logits are kept with the KV (seq_resume)


class Drafter(Protocol):
    """Proposes tokens for speculative decoding (see engine/speculative.py)."""

    def propose(self, context: Sequence[int], limit: int) -> list[int]:
        """Up to `limit` tokens that may follow `context` (the prompt and the answer so far)."""
        ...

    def observe(self, proposed: int, accepted: int, seconds: float) -> None:
        """How one decode step went: drafts proposed and kept, and its time."""
        ...


class CoreModel(Protocol):
    """What every backend's model does: tokens in and out, chat prompts. Generation is
    the scheduler's batched step (`Batched`), for one request (engine/single.py) or many."""

    info: ModelInfo

    def tokenize(self, text: str, *, special: bool = False) -> list[int]: ...

    def detokenize(self, tokens: Sequence[int]) -> str: ...

    def render_chat(
        self, messages: Sequence[Message], variables: Mapping[str, Any] | None = None
    ) -> list[int]:
        """The prompt for a chat; `variables` go to the template too (`tools`, and the
        caller's chat_template_kwargs such as `enable_thinking`)."""
        ...

    def close(self) -> None: ...


class Drafting(Protocol):
    """Speculative decoding: as a target (exact batches) and as a draft model."""

    def exact_batches(self) -> bool:
        """Whether a token's logits come out bit for bit the same evaluated in a batch as
        alone, which speculative decoding needs to leave the output unchanged."""
        ...

    def draft_greedy(self, context: Sequence[int], n: int) -> list[int]:
        """The greedy continuation of `context`, n tokens (as a draft model); reuses its KV."""
        ...


class KVStateful(Protocol):
    """KV cache states saved and restored (the engine's prompt cache)."""

    def kv_prefix(self, seq: int = 0) -> list[int]:
        """The tokens at the start of a sequence's KV cache that a later prompt may reuse
        exactly (see common.ALIGN)."""
        ...

    def save_kv(self, seq: int = 0, *, exact: bool = True) -> KVSnapshot:
        """Snapshot a sequence's KV cache: its exact prefix (dropping the rest), or all of it."""
        ...

    def load_kv(self, snapshot: KVSnapshot, seq: int = 0) -> bool:
        """Make a snapshot a sequence's KV cache; False (and an empty sequence) when it
        does not fit."""
        ...

    def dump_kv(self, snapshot: KVSnapshot) -> bytes | memoryview:
        """A snapshot's payload as bytes, for the disk tier (a view where the payload is
        bytes already: the writer thread hashes and writes it as it is)."""
        ...

    def undump_kv(self, tokens: Sequence[int], data: bytes) -> KVSnapshot:
        """The inverse of dump_kv; ValueError when the data cannot be this model's state."""
        ...


class Scorer(Protocol):
    """Reading text rather than writing it: perplexity, embeddings and reranking."""

    def logprobs(self, tokens: Sequence[int], *, start: int = 1) -> list[float]:
        """ln P(tokens[i] | tokens[:i]) for i from `start` on, from a fresh context (perplexity).

        At most n_ctx tokens; the live KV cache is dropped.
        """
        ...

    def embed(
        self,
        inputs: Sequence[str | Sequence[int]],
        *,
        pooling: str | None = None,
        first: int = 0,
    ) -> tuple[list[list[float]], int]:
        """One L2-normalised vector per input (text, or token ids), and the tokens read.
        Pooling: the model's own (its GGUF metadata), mean for a model that has none, or
        `pooling` ("mean", "cls", "last"). InvalidRequest where the backend cannot embed;
        an error about one input names it by its index in the request (`first` is that of
        inputs[0], when the request's inputs come in pieces)."""
        ...

    def rerank(
        self, query: str, documents: Sequence[str], *, first: int = 0, cut: str | None = None
    ) -> tuple[list[float], int]:
        """Each document's relevance to the query (a reranker's classifier output, in the
        documents' order), and the tokens read. A pair longer than the reranker takes has
        its document cut from the end (cut "right") or the start ("left"), or is refused
        (None). InvalidRequest (`not_a_reranker`) for a model without a ranking head."""
        ...


class Batched(Protocol):
    """Batched steps (the engine's scheduler). A model holds `n_seq` sequences (ids
    0..n_seq-1), each with its own KV share of info.n_ctx tokens. The scheduler evaluates
    the work of several sequences in one `step`, then samples each from its rows of that
    step's logits."""

    info: ModelInfo
    n_seq: int
    adapters: list[Adapter]  # its LoRA adapters by id (their scales change between steps)

    def use_adapters(self, scales: Scales) -> None:
        """The adapters the following steps apply, as `scales` says (the scheduler batches
        only sequences that want the same ones). A sequence's KV holds what was computed
        under the adapters of its steps, so the engine keys reuse on them."""
        ...

    def seq_tokens(self, seq: int, *, exact: bool = False) -> list[int]:
        """The tokens sequence `seq` holds in the KV cache (exact: only its exact prefix)."""
        ...

    def seq_reread(self, seq: int, prompt: Sequence[int]) -> int:
        """How much of `prompt` a rerun keeps so that it gets the logits the first run got
        (the first run's last batch is read again: common.KVLedger); len(prompt): all."""
        ...

    def seq_resume(self, seq: int, prompt: Sequence[int]) -> bool:
        """When `seq` holds all of `prompt` and kept the logits its last token gave (the
        run that read it), keep just the prompt and make those logits row 0 of `seq` for
        `sample` and `logits` until the next step: a rerun samples its first token from
        the numbers the first run sampled from, reading nothing. False: it cannot."""
        ...

    def seq_keep(self, seq: int, n: int) -> bool:
        """Keep the first n KV positions of `seq`; False (and an empty sequence) if it cannot."""
        ...

    def seq_copy(self, src: int, dst: int, n: int) -> bool:
        """Make `dst` hold the first n tokens of `src` (a shared prefix); False if it cannot."""
        ...

    def step(self, work: Sequence[SeqWork]) -> None:
        """Evaluate every sequence's tokens in one batch (LocalLLMError when it fails: the
        sequences in it are then empty)."""
        ...

    def new_sampler(self, params: SamplingParams, history: Sequence[int]) -> Any:
        """A sampler chain for one sequence (its own temperature, seed, penalties)."""
        ...

    def sample(self, sampler: Any, seq: int, row: int, allowed: Any = None) -> int:
        """Sample from the row-th logits `seq` asked for in the last step (and accept it);
        `allowed`, a numpy bool array over the vocabulary, rules out the tokens it marks
        False (constrained decoding)."""
        ...

    def logits(self, seq: int, row: int) -> Any:
        """The raw row-th logits of `seq` from the last step, as a numpy float32 array of
        n_vocab values (a copy: for log probabilities)."""
        ...

    def vocab_bytes(self) -> tuple[list[bytes], list[int]]:
        """Every token's bytes (control tokens as their text), and the control tokens'
        ids: the vocabulary as the grammar engine reads it."""
        ...

    def free_sampler(self, sampler: Any) -> None: ...

    def piece(self, token: int) -> bytes:
        """The bytes of one generated token (control tokens render as nothing)."""
        ...


class Decoding(CoreModel, Batched, Protocol):
    """What the scheduler drives (engine/scheduler.py, engine/single.py, a grammar):
    tokens in and out, and the batched step."""


class LoadedModel(Decoding, KVStateful, Drafting, Scorer, Protocol):
    """A model the engine hosts: the core and every capability. The engine's parts ask
    for the capability they use (the scheduler `Decoding`, the prompt cache `KVStateful`,
    speculation `Drafting`, perplexity and embeddings `Scorer`)."""


@dataclass(frozen=True, slots=True)
class MemoryProfile:
    """How a backend holds a model in memory, for the estimate made before it loads."""

    kv_dtype: str  # what one KV element is stored as: f32, f16, q8_0 or q4_0
    gpu_offload: bool  # whether its layers go to a GPU's memory (then VRAM is what counts)
    quantized_kv: bool = True  # whether it stores the KV as kv_cache_type says (else its own)
    kv_block: int = 32  # values per block of its quantized KV (ggml's 32; mlx-lm's group, 64)

    @property
    def kv_scale(self) -> float:
        """The KV cache's size against an f16 one."""
        return KV_SCALE[self.kv_dtype]

    def with_kv_type(self, kv_type: str) -> MemoryProfile:
        """The profile with the KV cache stored as `kv_type` (f16: as the backend keeps it)."""
        if kv_type == "f16" or not self.quantized_kv:
            return self
        return replace(self, kv_dtype=kv_type)


# bytes per KV element against f16: ggml's q8_0 keeps 32 values in 34 bytes, q4_0 in 18
KV_SCALE = {"f32": 2.0, "f16": 1.0, "q8_0": 34 / 64, "q4_0": 18 / 64}


CPU_F16 = MemoryProfile("f16", gpu_offload=False)  # llama.cpp's KV on a CPU; the fallback


class Backend(Protocol):
    name: ClassVar[str]

    def available(self) -> bool: ...

    def can_load(self, ref: ModelRef) -> bool: ...

    def memory_profile(self, ref: ModelRef, n_ctx: int | None) -> MemoryProfile:
        """How `ref` would sit in memory on this backend (cheap: loads nothing)."""
        ...

    def load(self, ref: ModelRef, options: LoadOptions) -> LoadedModel: ...
