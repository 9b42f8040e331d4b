"""A scripted model for tests about control flow: queues, ordering, cancellation, errors.

It answers every prompt with a script's text, one byte per token, after a per-token
delay, and can fail at a given token or wait at a gate a test opens. Its KV cache is
bookkeeping only (each sequence's token list), so the engine's scheduler, prompt cache
and speculation drive it exactly as they drive a real model. Nothing here is a
number a real model would give: tests that are about tokens, text or speed use the
starter model.

    engine = Engine(settings, backends=[FakeBackend(Script(reply="hi"))])
    engine.load(write_fake_model(tmp_path / "fake.gguf"))

The model file is a real GGUF header (gguf-py writes it) with no weights to speak of,
so the engine's memory estimate and the model store read it as they read any model.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from localllm.backends.base import (
    CPU_F16,
    Adapter,
    KVSnapshot,
    LoadOptions,
    MemoryProfile,
    Message,
    ModelInfo,
    ModelRef,
    SamplingParams,
    Scales,
    SeqWork,
)
from localllm.errors import InvalidRequest, LocalLLMError

EOG = 256  # the end-of-answer token; 0..255 are the bytes
BOS = 257
N_VOCAB = 258
N_CTX_TRAIN = 4096


class Gate:
    """Holds a scripted model's steps: each waits for a permit (`allow`) or for `open()`,
    so a test moves the model a step at a time and looks at the engine between steps
    (no sleeps, no timing)."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._permits = 0
        self._open = False
        self.waiting = 0  # steps waiting at the gate now
        self.passed = 0  # steps that went through

    def allow(self, n: int = 1) -> None:
        with self._cond:
            self._permits += n
            self._cond.notify_all()

    def open(self) -> None:
        """Let every step through from now on."""
        with self._cond:
            self._open = True
            self._cond.notify_all()

    def held(self, after: int = 0, timeout: float = 60.0) -> bool:
        """Wait until `after` steps have gone through and the next one waits at the gate
        (the engine has published what those steps did); False on timeout."""
        with self._cond:
            return self._cond.wait_for(lambda: self.passed >= after and self.waiting > 0, timeout)

    def pass_through(self) -> None:
        """On the worker, at the start of a step."""
        with self._cond:
            self.waiting += 1
            self._cond.notify_all()
            self._cond.wait_for(lambda: self._open or self._permits > 0)
            if not self._open:
                self._permits -= 1
            self.waiting -= 1
            self.passed += 1
            self._cond.notify_all()


@dataclass(frozen=True, slots=True)
class Script:
    """What the fake model does. `reply`: the answer's text, or a function of the prompt's
    text; `delay_s`: the time each step takes; `fail_at`: the step fails when a sequence
    is about to generate this token (1: the first), as a decode failure does; `gate`: each
    step passes it first (a test holds the model mid-answer, then lets it go)."""

    reply: str | Callable[[str], str] = "Hello from the scripted model."
    delay_s: float = 0.0
    fail_at: int | None = None
    gate: Gate | None = None


@dataclass(slots=True)
class _Sampler:
    reply: bytes
    at: int = 0  # the reply's bytes sampled so far
    seq: int | None = None  # the sequence it samples for (known from its first sample)


class FakeModel:
    """A `LoadedModel` whose answers come from a `Script` (see the module's note)."""

    def __init__(self, ref: ModelRef, options: LoadOptions, script: Script) -> None:
        self.script = script
        self.n_seq = max(1, options.n_seq)
        n_ctx = options.n_ctx or N_CTX_TRAIN
        self.info = ModelInfo(
            id=ref.name,
            format=ref.format,
            backend="fake",
            device="cpu",
            n_ctx=n_ctx,
            n_ctx_train=N_CTX_TRAIN,
            chat_template=None,
            eog_ids=frozenset({EOG}),
            bos_id=BOS,
            add_bos=False,
            quant="none",
            vocab_fingerprint="fake-bytes",
            n_vocab=N_VOCAB,
            max_token_bytes=1,
        )
        self._kv: list[list[int]] = [[] for _ in range(self.n_seq)]
        self._generated: dict[int, int] = {}  # per sequence, the tokens sampled this answer
        # LoRA adapters are bookkeeping here: each step's set and sequences are recorded
        self.adapters = [Adapter.loaded(path, scale) for path, scale in options.loras]
        self.applying: Scales = ()
        self.steps: list[tuple[Scales, tuple[int, ...]]] = []
        if options.progress is not None:
            options.progress(1.0)

    # -- text ------------------------------------------------------------------------
    def tokenize(self, text: str, *, special: bool = False) -> list[int]:
        return list(text.encode())

    def detokenize(self, tokens: Sequence[int]) -> str:
        return bytes(t for t in tokens if t < EOG).decode(errors="replace")

    def piece(self, token: int) -> bytes:
        return bytes([token]) if token < EOG else b""

    def render_chat(
        self, messages: Sequence[Message], variables: Mapping[str, Any] | None = None
    ) -> list[int]:
        text = "".join(f"<{m.role}>{m.content}\n" for m in messages) + "<assistant>"
        return self.tokenize(text)

    def vocab_bytes(self) -> tuple[list[bytes], list[int]]:
        return [bytes([t]) for t in range(EOG)] + [b"", b""], [EOG, BOS]

    # -- the batched interface the scheduler drives ----------------------------------------
    def seq_tokens(self, seq: int, *, exact: bool = False) -> list[int]:
        return list(self._kv[seq])

    def seq_reread(self, seq: int, prompt: Sequence[int]) -> int:
        return len(prompt)  # every batch gives the same numbers here

    def seq_resume(self, seq: int, prompt: Sequence[int]) -> bool:
        return False  # no logits are kept: a request always reads its prompt's last token

    def seq_keep(self, seq: int, n: int) -> bool:
        del self._kv[seq][n:]
        return True

    def seq_copy(self, src: int, dst: int, n: int) -> bool:
        self._kv[dst] = self._kv[src][:n]
        return True

    def use_adapters(self, scales: Scales) -> None:
        self.applying = scales

    def step(self, work: Sequence[SeqWork]) -> None:
        self.steps.append((self.applying, tuple(w.seq for w in work)))
        script = self.script
        if script.gate is not None:
            script.gate.pass_through()
        if script.delay_s:
            time.sleep(script.delay_s)
        fail_at = script.fail_at
        for w in work:
            if w.logits and fail_at is not None and self._generated.get(w.seq, 0) + 1 >= fail_at:
                raise LocalLLMError(f"scripted failure at token {fail_at}")
            if len(self._kv[w.seq]) + len(w.tokens) > self.info.n_ctx:
                raise LocalLLMError("the scripted model's context is full")
            self._kv[w.seq] += list(w.tokens)

    def new_sampler(self, params: SamplingParams, history: Sequence[int]) -> _Sampler:
        reply = self.script.reply
        text = reply(self.detokenize(history)) if callable(reply) else reply
        return _Sampler(text.encode())

    def sample(self, sampler: Any, seq: int, row: int, allowed: Any = None) -> int:
        assert isinstance(sampler, _Sampler)
        sampler.seq = seq
        if sampler.at >= len(sampler.reply):
            return EOG
        token = sampler.reply[sampler.at]
        sampler.at += 1
        self._generated[seq] = sampler.at
        return token

    def logits(self, seq: int, row: int) -> Any:
        import numpy as np

        return np.zeros(N_VOCAB, dtype=np.float32)  # every token alike: not a model's numbers

    def free_sampler(self, sampler: Any) -> None:
        if isinstance(sampler, _Sampler) and sampler.seq is not None:
            self._generated.pop(sampler.seq, None)

    def exact_batches(self) -> bool:
        return True

    def draft_greedy(self, context: Sequence[int], n: int) -> list[int]:
        return []

    # -- KV states -----------------------------------------------------------------------
    def kv_prefix(self, seq: int = 0) -> list[int]:
        return list(self._kv[seq])

    def save_kv(self, seq: int = 0, *, exact: bool = True) -> KVSnapshot:
        tokens = tuple(self._kv[seq])
        return KVSnapshot(tokens, nbytes=8 * len(tokens), payload=tokens)

    def load_kv(self, snapshot: KVSnapshot, seq: int = 0) -> bool:
        if len(snapshot.tokens) > self.info.n_ctx:
            self._kv[seq] = []
            return False
        self._kv[seq] = list(snapshot.tokens)
        return True

    def dump_kv(self, snapshot: KVSnapshot) -> bytes:
        return json.dumps(list(snapshot.tokens)).encode()

    def undump_kv(self, tokens: Sequence[int], data: bytes) -> KVSnapshot:
        saved = json.loads(data)
        if saved != list(tokens):
            raise ValueError("not this state's tokens")
        return KVSnapshot(tuple(tokens), nbytes=8 * len(tokens), payload=tuple(tokens))

    def logprobs(self, tokens: Sequence[int], *, start: int = 1) -> list[float]:
        raise InvalidRequest("the scripted model does not score text")

    def embed(
        self,
        inputs: Sequence[str | Sequence[int]],
        *,
        pooling: str | None = None,
        first: int = 0,
    ) -> tuple[list[list[float]], int]:
        raise InvalidRequest("the scripted model does not embed")

    def rerank(
        self, query: str, documents: Sequence[str], *, first: int = 0, cut: str | None = None
    ) -> tuple[list[float], int]:
        raise InvalidRequest("the scripted model does not rerank", code="not_a_reranker")

    def close(self) -> None:
        pass  # nothing is held


class FakeBackend:
    """Loads every model as a `FakeModel` following `script`; keeps what it loaded."""

    name: ClassVar[str] = "fake"

    def __init__(self, script: Script | None = None) -> None:
        self.script = script or Script()
        self.loaded: list[FakeModel] = []

    def available(self) -> bool:
        return True

    def can_load(self, ref: ModelRef) -> bool:
        return ref.format == "gguf"

    def memory_profile(self, ref: ModelRef, n_ctx: int | None) -> MemoryProfile:
        return CPU_F16

    def load(self, ref: ModelRef, options: LoadOptions) -> FakeModel:
        model = FakeModel(ref, options, self.script)
        self.loaded.append(model)
        return model


def write_fake_model(path: Path, *, n_ctx_train: int = N_CTX_TRAIN) -> ModelRef:
    """A GGUF file with a small llama header and one tiny tensor, for a FakeBackend to
    'load' (the engine reads its header for the memory estimate, as it does any model's)."""
    import gguf
    import numpy as np

    path.parent.mkdir(parents=True, exist_ok=True)
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name(path.stem)
    writer.add_context_length(n_ctx_train)
    writer.add_block_count(1)
    writer.add_embedding_length(64)
    writer.add_feed_forward_length(128)
    writer.add_head_count(4)
    writer.add_head_count_kv(4)
    writer.add_tensor("token_embd.weight", np.zeros((N_VOCAB, 64), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return ModelRef(path.stem, path, "gguf", "path", path.stat().st_size)
