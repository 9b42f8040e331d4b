"""The llama.cpp backend, over llama-cpp-python's low-level API.

One context per loaded model with `n_seq` sequences, each in its own KV stream of
n_ctx tokens (not llama.cpp's unified buffer: a sequence's numerics then never depend
on what the others hold, which deterministic requests need). The engine's scheduler
decodes all of them in one `llama_decode` per step (`step`), each sampled by its own
native sampler chain (one request alone: engine/single.py). The tokens in each
sequence's KV are remembered, so a prompt that extends them (the next turn of a
chat) is prefilled only past the shared prefix, and a prefix another sequence holds
is copied (`seq_copy`) instead of computed again. Drafting for another model and
scoring text are in llamacpp_draft.py.
"""

from __future__ import annotations

import ctypes
import dataclasses
import hashlib
import importlib.util
import logging
import math
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import numpy as np

from localllm.backends import lazy_pages
from localllm.backends.base import (
    DEFAULT_MAX_CTX,
    KV_SCALE,
    FimTokens,
    KVSnapshot,
    LoadOptions,
    MemoryProfile,
    Message,
    ModelInfo,
    ModelRef,
    SamplingParams,
    Scales,
    SeqWork,
    default_n_ctx,
)
from localllm.backends.common import (
    BATCH,
    KVLedger,
    chat_tokens,
)
from localllm.backends.llamacpp_draft import DraftAndScoring
from localllm.backends.llamacpp_embed import Embedder, rank_layout, rank_row
from localllm.backends.llamacpp_lora import Loras
from localllm.backends.llamacpp_media import Projector
from localllm.backends.llamacpp_native import (
    device_name,
    gpu_offload,
    has_amx,
    kv_cells,
    load_failure,
    load_quietly,
    native,
)
from localllm.backends.llamacpp_sampling import sample_row, sampler_chain
from localllm.errors import InvalidRequest, LocalLLMError, ModelLoadError
from localllm.hardware import physical_cores

log = logging.getLogger(__name__)
_GGML_TYPES = {"f16": 1, "q8_0": 8, "q4_0": 2}  # ggml.h's GGML_TYPE_* of each KV type


class LlamaCppBackend:
    name: ClassVar[str] = "llamacpp"

    def available(self) -> bool:
        return importlib.util.find_spec("llama_cpp") is not None

    def can_load(self, ref: ModelRef) -> bool:
        return ref.format == "gguf"

    def memory_profile(self, ref: ModelRef, n_ctx: int | None) -> MemoryProfile:
        return MemoryProfile("f16", gpu_offload())

    def load(self, ref: ModelRef, options: LoadOptions) -> LlamaCppModel:
        return LlamaCppModel(ref, options)


class LlamaCppModel(DraftAndScoring):
    """A GGUF model and its context. Not thread-safe: the engine worker is its only user."""

    def __init__(self, ref: ModelRef, options: LoadOptions) -> None:
        ll = self._ll = native()
        mparams = ll.llama_model_default_params()
        offload = ll.llama_supports_gpu_offload()
        n_gpu = 0 if not offload else (999 if options.n_gpu_layers < 0 else options.n_gpu_layers)
        mparams.n_gpu_layers = n_gpu
        if has_amx():
            # ggml's AMX matrix kernels crash (SIGSEGV in ggml_backend_amx_mul_mat) on the
            # first batch of more than one token for the starter's Q4_1 weights on such CPUs:
            # keep the weights in plain CPU buffers there.
            mparams.use_extra_bufts = False
        self._progress_cb = None
        if options.progress is not None:
            report = options.progress

            def on_progress(fraction: float, _user: Any) -> bool:
                report(float(fraction))
                return True

            self._progress_cb = ll.llama_progress_callback(on_progress)
            mparams.progress_callback = self._progress_cb
        model, said = load_quietly(ll, ref.path, mparams)
        if not model:
            raise load_failure(ref.path, said)
        self._model = model
        try:
            self._loras = Loras(ll, model, options.loras)
        except BaseException:
            ll.llama_model_free(model)
            raise
        self.adapters = self._loras.adapters
        self._vocab = ll.llama_model_get_vocab(model)
        n_ctx_train = int(ll.llama_model_n_ctx_train(model)) or DEFAULT_MAX_CTX
        n_ctx = options.n_ctx or default_n_ctx(n_ctx_train)
        threads = options.n_threads or physical_cores()
        self.n_seq = n_seq = max(1, options.n_seq)
        total = kv_cells(n_ctx, n_seq)
        cparams = ll.llama_context_default_params()
        cparams.n_ctx = total
        cparams.n_batch = min(total, BATCH)
        cparams.n_ubatch = min(total, BATCH)
        cparams.n_seq_max = n_seq
        cparams.kv_unified = False
        cparams.n_outputs_max_per_seq = 0  # as many as a step asks for (drafts, scoring)
        cparams.n_threads = threads
        cparams.n_threads_batch = threads
        cparams.no_perf = True
        # a quantized V needs flash attention, which llama.cpp then turns on by itself
        cparams.type_k = cparams.type_v = _GGML_TYPES[options.kv_type]
        ctx, self.kv_released = lazy_pages.allocate_lazily(
            lambda: ll.llama_init_from_model(model, cparams),
            self._kv_bytes(model, total, options.kv_type) if n_gpu == 0 else 0,
        )
        if not ctx:
            self._loras.close()
            ll.llama_model_free(model)
            kv = f" with a {options.kv_type} KV cache" if options.kv_type != "f16" else ""
            raise ModelLoadError(str(ref.path), f"could not create a context of {n_ctx} tokens{kv}")
        self._ctx = ctx
        self._mem = ll.llama_get_memory(ctx)
        self._kvs = [KVLedger() for _ in range(n_seq)]
        self._kv = self._kvs[0]  # the draft-model calls use sequence 0
        self._batch = ll.llama_batch_init(BATCH, 0, 1)
        self._rows: dict[int, list[int]] = {}  # seq -> its logits rows in the last step
        self._resumed: dict[int, Any] = {}  # seq -> the kept logits it samples from (resume)
        self._exact: bool | None = None  # exact_batches(), probed once when first asked
        self._piece_cache: dict[int, bytes] = {}
        self._threads = threads
        self._embedder = Embedder(ll, model, threads)
        self._piece_buf = ctypes.create_string_buffer(256)
        self._one = (ll.llama_token * 1)()
        self.info = self._describe(ref, n_ctx, n_ctx_train, device_name(ll, n_gpu), threads)
        self.info.extra["kv_type"] = options.kv_type
        self._projector: Projector | None = None
        if options.mmproj:
            try:
                self._projector = Projector(ll, model, options.mmproj, threads)
            except BaseException:
                self.close()
                raise
            self.info = dataclasses.replace(self.info, media=self._projector.kinds)
            self.info.extra["mmproj"] = options.mmproj
        self._warm_up()
        if options.progress is not None:
            options.progress(1.0)

    def _warm_up(self) -> None:
        """A token read alone and two read as one batch, then forgotten, as llama-server
        warms a model up at load: the weights' pages are read in and the compute buffers
        and threads made (on a GPU: its kernels set up), so the first request does not pay
        for them. For a model that generates, the two steps are `exact_batches`' probe,
        whose answer speculative decoding asks for at its first draft: asked here, no
        request waits for it (an embedding model or reranker just reads the two)."""
        ll = self._ll
        try:
            if ll.llama_pooling_type(self._ctx) == ll.LLAMA_POOLING_TYPE_NONE:
                self.exact_batches()
            else:
                pair = [ll.llama_vocab_bos(self._vocab), ll.llama_vocab_eos(self._vocab)]
                self._decode([t for t in pair if t >= 0] or [0], lambda: False)
        except Exception:  # the first request meets whatever is wrong, with its own error
            log.warning("%s: the warm-up step failed", self.info.id, exc_info=True)
        finally:
            self._reset_kv(0)  # not llama_memory_clear: that writes the whole KV buffer

    def _kv_bytes(self, model: Any, n_ctx: int, kv_type: str) -> int:
        """The KV cache llama.cpp allocates for n_ctx tokens (0: a cache of another kind)."""
        ll = self._ll
        if ll.llama_model_is_recurrent(model) or ll.llama_model_is_hybrid(model):
            return 0
        n_head = int(ll.llama_model_n_head(model))
        if n_head <= 0 or int(ll.llama_model_n_swa(model)) > 0:
            return 0
        head_dim = int(ll.llama_model_n_embd(model)) // n_head
        per_token = int(ll.llama_model_n_layer(model)) * 2 * int(ll.llama_model_n_head_kv(model))
        return math.ceil(n_ctx * per_token * head_dim * 2 * KV_SCALE[kv_type])

    # -- metadata ------------------------------------------------------------------
    def _describe(
        self, ref: ModelRef, n_ctx: int, n_ctx_train: int, device: str, threads: int
    ) -> ModelInfo:
        ll, vocab = self._ll, self._vocab
        n_vocab = int(ll.llama_vocab_n_tokens(vocab))
        eog = set()
        digest = hashlib.sha256()
        longest = 1
        for tok in range(n_vocab):
            if ll.llama_vocab_is_eog(vocab, tok):
                eog.add(tok)
            text = ll.llama_vocab_get_text(vocab, tok) or b""
            longest = max(longest, len(text))
            digest.update((b"\x00" if tok else b"") + text)
        raw_template = ll.llama_model_chat_template(self._model, None)
        fim_ids = (
            ll.llama_vocab_fim_pre(vocab),
            ll.llama_vocab_fim_suf(vocab),
            ll.llama_vocab_fim_mid(vocab),
        )
        fim = FimTokens(*fim_ids) if all(i >= 0 for i in fim_ids) else None
        if fim is not None:
            sep, rep = int(ll.llama_vocab_fim_sep(vocab)), int(ll.llama_vocab_fim_rep(vocab))
            fim = dataclasses.replace(
                fim, sep=sep if sep >= 0 else None, rep=rep if rep >= 0 else None
            )
        bos = int(ll.llama_vocab_bos(vocab))
        buf = ctypes.create_string_buffer(128)
        ll.llama_model_desc(self._model, buf, len(buf))
        desc = buf.value.decode("utf-8", "replace")
        return ModelInfo(
            id=ref.name,
            format="gguf",
            backend="llamacpp",
            device=device if device != "cpu" else f"cpu ({threads} threads)",
            n_ctx=n_ctx,
            n_ctx_train=n_ctx_train,
            chat_template=raw_template.decode("utf-8") if raw_template else None,
            eog_ids=frozenset(eog),
            bos_id=bos if bos >= 0 else None,
            add_bos=bool(ll.llama_vocab_get_add_bos(vocab)),
            quant=desc.rsplit(" ", 1)[-1] if desc else "unknown",
            vocab_fingerprint=digest.hexdigest()[:16],
            fim=fim,
            extra={"description": desc},
            n_vocab=n_vocab,
            max_token_bytes=longest,
        )

    # -- text ----------------------------------------------------------------------
    def tokenize(self, text: str, *, special: bool = False) -> list[int]:
        """Token ids for `text`, without BOS; `special` parses control tokens like <|im_end|>."""
        return self._tokenize(text.encode("utf-8"), add_special=False, parse_special=special)

    def _tokenize(self, data: bytes, *, add_special: bool, parse_special: bool) -> list[int]:
        ll = self._ll
        cap = len(data) + 8
        buf = (ll.llama_token * cap)()
        n = ll.llama_tokenize(self._vocab, data, len(data), buf, cap, add_special, parse_special)
        if n < 0:
            cap = -n
            buf = (ll.llama_token * cap)()
            n = ll.llama_tokenize(
                self._vocab, data, len(data), buf, cap, add_special, parse_special
            )
        return list(buf[:n])

    def piece(self, token: int) -> bytes:
        """The bytes of one generated token (control tokens render as nothing)."""
        piece = self._piece_cache.get(token)
        if piece is None:
            piece = self._piece_cache[token] = self._token_bytes(token, special=False)
        return piece

    def _token_bytes(self, token: int, *, special: bool) -> bytes:
        ll, buf = self._ll, self._piece_buf
        if token < 0:  # a picture's stand-in (backends/media.py): no text
            return b""
        n = ll.llama_token_to_piece(self._vocab, token, buf, len(buf), 0, special)
        if n < 0:
            buf = ctypes.create_string_buffer(-n)
            n = ll.llama_token_to_piece(self._vocab, token, buf, len(buf), 0, special)
        return bytes(buf.raw[:n])

    def detokenize(self, tokens: Sequence[int]) -> str:
        """Text for tokens, control tokens included: the inverse of tokenize(special=True)."""
        data = b"".join(self._token_bytes(t, special=True) for t in tokens)
        return data.decode("utf-8", "replace")

    def render_chat(
        self, messages: Sequence[Message], variables: Mapping[str, Any] | None = None
    ) -> list[int]:
        ll, vocab = self._ll, self._vocab
        bos_text = ll.llama_vocab_get_text(vocab, ll.llama_vocab_bos(vocab)) or b""
        eos_text = ll.llama_vocab_get_text(vocab, ll.llama_vocab_eos(vocab)) or b""
        return chat_tokens(
            self.info.chat_template,
            messages,
            bos_text=bos_text.decode("utf-8", "replace"),
            eos_text=eos_text.decode("utf-8", "replace"),
            tokenize_special=lambda text: self.tokenize(text, special=True),
            media_tokenize=self._projector.tokenize if self._projector is not None else None,
            add_bos=self.info.add_bos,
            bos_id=self.info.bos_id,
            variables=variables,
        )

    # -- the KV cache of each sequence ----------------------------------------------
    def _reset_kv(self, seq: int = 0) -> None:
        self._ll.llama_memory_seq_rm(self._mem, seq, -1, -1)
        self._kvs[seq].clear()

    def _clear_all(self) -> None:
        self._ll.llama_memory_clear(self._mem, True)
        for kv in self._kvs:
            kv.clear()

    def _truncate(self, n: int, seq: int = 0) -> bool:
        """Keep the first n KV positions; False (and an empty cache) if llama.cpp cannot."""
        kv = self._kvs[seq]
        if n < len(kv.tokens):
            if not self._ll.llama_memory_seq_rm(self._mem, seq, n, -1):
                self._reset_kv(seq)
                return n == 0
            kv.cut(n)
        return True

    # -- KV states -------------------------------------------------------------------
    def kv_prefix(self, seq: int = 0) -> list[int]:
        return self._kvs[seq].prefix()

    def save_kv(self, seq: int = 0, *, exact: bool = True) -> KVSnapshot:
        ll, kv = self._ll, self._kvs[seq]
        if exact:
            self._truncate(kv.canonical, seq)
        size = int(ll.llama_state_seq_get_size(self._ctx, seq))
        data = bytearray(size)
        n = int(ll.llama_state_seq_get_data(self._ctx, _u8(data), size, seq))
        return kv.saved(n, data if n == size else data[:n])

    def load_kv(self, snapshot: KVSnapshot, seq: int = 0) -> bool:
        ll = self._ll
        self._reset_kv(seq)
        data = snapshot.payload  # read in place, not copied
        if not ll.llama_state_seq_set_data(self._ctx, _u8(data), len(data), seq):
            self._reset_kv(seq)
            return False
        self._kvs[seq].restored(snapshot)
        return True

    # -- batched steps -------------------------------------------------------------------
    def seq_tokens(self, seq: int, *, exact: bool = False) -> list[int]:
        return self._kvs[seq].view(exact=exact)

    def seq_reread(self, seq: int, prompt: Sequence[int]) -> int:
        return self._kvs[seq].reread(prompt)

    def seq_resume(self, seq: int, prompt: Sequence[int]) -> bool:
        row = self._kvs[seq].resume(prompt)
        if row is None or not self._truncate(len(prompt), seq):
            return False
        self._resumed[seq] = row
        return True

    def seq_keep(self, seq: int, n: int) -> bool:
        return self._truncate(n, seq)

    def seq_copy(self, src: int, dst: int, n: int) -> bool:
        """`dst` starts with the first n tokens of `src`'s state. Each sequence is a KV
        stream of its own, and llama.cpp's seq_cp between streams copies all n_ctx cells
        of one (at the starter's 8,192 about as long as reading 40 prompt tokens here);
        the state calls copy only the cells `src` holds."""
        ll = self._ll
        self._reset_kv(dst)
        if n <= 0 or src == dst:
            return n <= 0
        size = int(ll.llama_state_seq_get_size(self._ctx, src))
        buf = _u8(bytearray(size))
        got = int(ll.llama_state_seq_get_data(self._ctx, buf, size, src))
        if not got or not ll.llama_state_seq_set_data(self._ctx, buf, got, dst):
            self._reset_kv(dst)
            return False
        self._kvs[dst].copied(self._kvs[src], len(self._kvs[src].tokens))
        return self._truncate(n, dst)

    def use_adapters(self, scales: Scales) -> None:
        self._loras.use(self._ctx, scales)

    def step(self, work: Sequence[SeqWork]) -> None:
        ll, batch = self._ll, self._batch
        self._resumed = {}
        if self._projector is not None and any(w.tokens and min(w.tokens) < 0 for w in work):
            try:
                work = self._projector.read_pictures(self._ctx, self._batch, self._kvs, work)
            except LocalLLMError:
                for w in work:
                    self._reset_kv(w.seq)
                raise
            if not work:  # every part was pictures (and text before them)
                self._rows = {}
                return
        i = 0
        self._rows = {}
        # in the order of the sequence ids: llama.cpp splits a batch of several sequences
        # (each its own KV stream) wherever the next sequence is not the id after the last
        for w in sorted(work, key=lambda w: w.seq):
            base = len(self._kvs[w.seq].tokens)
            first_row = len(w.tokens) - w.logits
            rows = []
            for j, tok in enumerate(w.tokens):
                batch.token[i], batch.pos[i] = tok, base + j
                batch.n_seq_id[i], batch.seq_id[i][0] = 1, w.seq
                wanted = j >= first_row
                batch.logits[i] = wanted
                if wanted:
                    rows.append(i)
                i += 1
            self._rows[w.seq] = rows
        batch.n_tokens = i
        rc = ll.llama_decode(self._ctx, batch)
        if rc != 0:
            for w in work:
                self._reset_kv(w.seq)
            raise LocalLLMError(f"llama_decode failed with code {rc} in a batch of {i} tokens")
        for w in work:
            out = self._rows.get(w.seq)
            # a copy: sampling within a grammar rules tokens out of the context's row in place
            row = self._logits_view(out[-1]).copy() if w.last and out else None
            self._kvs[w.seq].append(w.tokens, exact=w.exact, final=w.final, row=row)

    def new_sampler(self, params: SamplingParams, history: Sequence[int]) -> Any:
        history = [t for t in history if t >= 0]  # no penalty reads a picture's stand-ins
        return sampler_chain(self._ll, self._vocab, params, history)

    def sample(self, sampler: Any, seq: int, row: int, allowed: Any = None) -> int:
        kept = self._resumed.get(seq)
        if kept is not None:
            return sample_row(self._ll, sampler, kept, allowed)
        i = self._rows[seq][row]
        if allowed is not None:  # the sampler chain reads these logits in place
            self._logits_view(i)[~allowed] = -np.inf
        return int(self._ll.llama_sampler_sample(sampler, self._ctx, i))

    def _logits_view(self, i: int) -> Any:
        ptr = self._ll.llama_get_logits_ith(self._ctx, i)
        return np.ctypeslib.as_array(ptr, shape=(self.info.n_vocab,))

    def logits(self, seq: int, row: int) -> Any:
        kept = self._resumed.get(seq)
        if kept is not None:
            return kept.copy()
        return self._logits_view(self._rows[seq][row]).copy()

    def vocab_bytes(self) -> tuple[list[bytes], list[int]]:
        ll, vocab = self._ll, self._vocab
        tokens = [self._token_bytes(t, special=True) for t in range(self.info.n_vocab)]
        control = ll.LLAMA_TOKEN_ATTR_CONTROL
        special = [
            t for t in range(self.info.n_vocab) if ll.llama_vocab_get_attr(vocab, t) & control
        ]
        return tokens, special

    def free_sampler(self, sampler: Any) -> None:
        self._ll.llama_sampler_free(sampler)

    def dump_kv(self, snapshot: KVSnapshot) -> bytes | memoryview:
        return memoryview(snapshot.payload)  # the bytes as they are: the state is never changed

    def undump_kv(self, tokens: Sequence[int], data: bytes) -> KVSnapshot:
        return KVSnapshot(tuple(tokens), len(data), data)

    # -- embeddings ----------------------------------------------------------------
    def embed(
        self,
        inputs: Sequence[str | Sequence[int]],
        *,
        pooling: str | None = None,
        first: int = 0,
    ) -> tuple[list[list[float]], int]:
        rows = [
            self._tokenize(x.encode("utf-8"), add_special=True, parse_special=False)
            if isinstance(x, str)
            else list(x)
            for x in inputs
        ]
        return self._embedder.embed(rows, self.info, pooling, first)

    def rerank(
        self, query: str, documents: Sequence[str], *, first: int = 0, cut: str | None = None
    ) -> tuple[list[float], int]:
        ll = self._ll
        if ll.llama_pooling_type(self._ctx) != ll.LLAMA_POOLING_TYPE_RANK:
            raise InvalidRequest(
                f"{self.info.id} is not a reranking model (its GGUF does not pool by rank); "
                "load a reranker GGUF, such as bge-reranker-v2-m3 or jina-reranker-v2, and "
                "name it in `model`",
                param="model",
                code="not_a_reranker",
            )
        layout = rank_layout(ll, self._model, self.info)

        def tokenize(text: str, special: bool) -> list[int]:
            return self._tokenize(text.encode("utf-8"), add_special=False, parse_special=special)

        limit = self._embedder.rank_limit(self.info)
        rows = [rank_row(tokenize, layout, query, d, limit=limit, cut=cut) for d in documents]
        return self._embedder.rank(rows, self.info, first), sum(len(r) for r in rows)

    def close(self) -> None:
        projector = getattr(self, "_projector", None)
        if projector is not None:
            projector.close()
            self._projector = None
        if getattr(self, "_embedder", None) is not None:
            self._embedder.close()
        ll = self._ll
        if getattr(self, "_batch", None) is not None:
            ll.llama_batch_free(self._batch)
            self._batch = None
        if getattr(self, "_ctx", None):
            ll.llama_free(self._ctx)
            self._ctx = None
        if getattr(self, "_loras", None) is not None:
            self._loras.close()
        if getattr(self, "_model", None):
            ll.llama_model_free(self._model)
            self._model = None


def _u8(data: bytes | bytearray) -> Any:
    """Bytes as the pointer llama.cpp's state calls take, not copied (the pointer keeps
    them alive). A state is saved into a bytearray: for a 59 MB state here, a zeroed ctypes
    buffer then a copy out of it took 35 and 31 ms around llama.cpp's own 7 ms, and a
    numpy array, which asks for huge pages, 130 ms (the kernel compacting memory)."""
    return np.frombuffer(data, np.uint8).ctypes.data_as(ctypes.POINTER(ctypes.c_uint8))
