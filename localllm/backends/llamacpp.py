"""The llama.cpp backend, over llama-cpp-python's low-level API.

One context per loaded model with `n_seq` sequences, each in its own KV stream of
n_ctx tokens (not llama.cpp's unified buffer: a sequence's numerics then never depend
on what the others hold, which deterministic requests need). The engine's scheduler
decodes all of them in one `llama_decode` per step (`step`), each sampled by its own
native sampler chain; `stream()` drives sequence 0 alone. The tokens in each
sequence's KV are remembered, so a prompt that extends them (the next turn of a
chat) is prefilled only past the shared prefix, and a prefix another sequence holds
is copied (`seq_copy`) instead of computed again.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import hashlib
import importlib.util
import itertools
import logging
import random
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from localllm.backends import lazy_pages, llama_api
from localllm.backends.base import (
    DEFAULT_MAX_CTX,
    Chunk,
    Drafter,
    FimTokens,
    KVSnapshot,
    LoadOptions,
    MemoryProfile,
    Message,
    ModelInfo,
    ModelRef,
    SamplingParams,
    SeqWork,
    default_n_ctx,
)
from localllm.backends.common import (
    BATCH,
    DraftCounts,
    KVLedger,
    batch_bounds,
    chat_tokens,
    check_request,
    check_scoring,
    drafted_tokens,
    emit_chunks,
    final_chunk,
    keep_matching,
    penalties,
    pick_logprobs,
    reusable_prefix,
)
from localllm.backends.llama_api import LlamaApi
from localllm.errors import InvalidRequest, LocalLLMError, ModelLoadError
from localllm.hardware import physical_cores

log = logging.getLogger(__name__)
_native_log = logging.getLogger("localllm.llama_cpp")

PENALTY_LAST_N = 64
# ggml's levels: 1 debug, 2 info, 3 warn, 4 error, 5 continuation of the previous line
_LEVELS = {1: logging.DEBUG, 2: logging.INFO, 3: logging.WARNING, 4: logging.ERROR}
_state: dict[str, Any] = {}  # keeps the native log callback alive; filled on first load


def _ll() -> LlamaApi:
    """Import llama_cpp once (checked against the declared API), route its native logging
    into `logging`, init the backend."""
    ll = llama_api.load()

    if "log_cb" not in _state:

        def on_log(level: int, text: bytes, _user: Any) -> None:
            py_level = _LEVELS.get(level, logging.DEBUG)
            held = _state.get("held")
            if held is not None and py_level >= logging.WARNING:
                held.append((py_level, text.decode("utf-8", "replace").rstrip()))
            elif _native_log.isEnabledFor(py_level):
                _native_log.log(py_level, text.decode("utf-8", "replace").rstrip())

        _state["log_cb"] = ll.llama_log_callback(on_log)
        ll.llama_log_set(_state["log_cb"], ctypes.c_void_p(0))
        ll.llama_backend_init()
    return ll


def _load_quietly(ll: LlamaApi, path: Path, mparams: Any) -> tuple[Any, str]:
    """Load a model holding back llama.cpp's warnings and errors meanwhile: on success they
    are logged as usual; on failure the first error becomes the reason (one line to the
    user, not llama.cpp's lines first)."""
    held: list[tuple[int, str]] = []
    _state["held"] = held
    try:
        model = ll.llama_model_load_from_file(str(path).encode(), mparams)
    finally:
        _state.pop("held", None)
    if model:
        for level, line in held:
            _native_log.log(level, line)
        return model, ""
    for _level, line in held:
        _native_log.debug("%s", line)
    errors = [line for level, line in held if level >= logging.ERROR]
    return model, errors[0] if errors else ""


def _device(ll: Any, n_gpu_layers: int) -> str:
    if n_gpu_layers == 0:
        return "cpu"
    info = ll.llama_print_system_info().decode("utf-8", "replace").upper()
    for name in ("CUDA", "METAL", "VULKAN", "HIP", "SYCL"):
        if name in info:
            return name.lower()
    return "gpu"


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


def has_amx() -> bool:
    """Whether this CPU has Intel AMX, which a native llama.cpp build then uses."""
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as fh:
            return any(line.startswith("flags") and " amx_int8" in line for line in fh)
    except OSError:
        return False


@contextlib.contextmanager
def plain_cpu_buffers() -> Iterator[None]:
    """While open, llama-cpp-python's own `Llama` class loads weights as this backend does
    on a CPU with AMX (see `has_amx`): benchmarks and tests compare against that class."""
    import llama_cpp.llama_cpp as native

    if not has_amx():
        yield
        return
    default = native.llama_model_default_params

    def params() -> Any:
        p = default()
        p.use_extra_bufts = False
        return p

    native.llama_model_default_params = params
    try:
        yield
    finally:
        native.llama_model_default_params = default


def kv_cells(n_ctx: int, n_seq: int) -> int:
    """The KV cells a context of n_seq sequences of n_ctx tokens each allocates (llama.cpp
    rounds each sequence's share up to a multiple of 256 when there are several)."""
    if n_seq <= 1:
        return n_ctx
    return -(-n_ctx // 256) * 256 * n_seq


def gpu_offload() -> bool:
    """Whether this llama.cpp build can put layers on a GPU."""
    try:
        return bool(_ll().llama_supports_gpu_offload())
    except ImportError:
        return False


EMBED_CTX = 4096  # tokens an embedding context holds (at most the trained context)
EMBED_SEQS = 8  # inputs embedded in one call


_POOLING = {"mean": 1, "cls": 2, "last": 3}  # llama.h's LLAMA_POOLING_TYPE_*


class LlamaCppModel:
    """A GGUF model and its context. Not thread-safe: the engine worker is its only user."""

    def __init__(self, ref: ModelRef, options: LoadOptions) -> None:
        ll = self._ll = _ll()
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
        model, said = _load_quietly(ll, ref.path, mparams)
        if not model:
            raise ModelLoadError(
                str(ref.path), f"llama.cpp could not read it: {said or 'no reason given'}"
            )
        self._model = model
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
        ctx, self.kv_released = lazy_pages.allocate_lazily(
            lambda: ll.llama_init_from_model(model, cparams),
            self._kv_bytes(model, total) if n_gpu == 0 else 0,
        )
        if not ctx:
            ll.llama_model_free(model)
            raise ModelLoadError(str(ref.path), f"could not create a context of {n_ctx} tokens")
        self._ctx = ctx
        self._mem = ll.llama_get_memory(ctx)
        self._kvs = [KVLedger() for _ in range(n_seq)]
        self._kv = self._kvs[0]  # stream() and the draft-model calls use sequence 0
        self._batch = ll.llama_batch_init(BATCH, 0, 1)
        self._rows: dict[int, list[int]] = {}  # seq -> its logits rows in the last step
        self._exact: bool | None = None  # exact_batches(), probed once when first asked
        self._piece_cache: dict[int, bytes] = {}
        self._embed_ctxs: dict[str | None, tuple[Any, int]] = {}  # pooling -> context
        self._threads = threads
        self._piece_buf = ctypes.create_string_buffer(256)
        self._one = (ll.llama_token * 1)()
        self.info = self._describe(ref, n_ctx, n_ctx_train, _device(ll, n_gpu), threads)
        if options.progress is not None:
            options.progress(1.0)

    def _kv_bytes(self, model: Any, n_ctx: int) -> int:
        """The f16 KV cache llama.cpp allocates for n_ctx tokens (0: a cache of another kind)."""
        ll = self._ll
        if ll.llama_model_is_recurrent(model) or ll.llama_model_is_hybrid(model):
            return 0
        n_head = int(ll.llama_model_n_head(model))
        if n_head <= 0 or int(ll.llama_model_n_swa(model)) > 0:
            return 0
        head_dim = int(ll.llama_model_n_embd(model)) // n_head
        per_token = int(ll.llama_model_n_layer(model)) * 2 * int(ll.llama_model_n_head_kv(model))
        return n_ctx * per_token * head_dim * 2

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
            add_bos=self.info.add_bos,
            bos_id=self.info.bos_id,
            variables=variables,
        )

    # -- generation ----------------------------------------------------------------
    def _decode(self, tokens: Sequence[int], should_stop: Callable[[], bool]) -> bool:
        """Evaluate tokens after the cached ones (see common.ALIGN); False when cancelled."""
        ll = self._ll
        start = len(self._kv.tokens)
        for lo, hi in itertools.pairwise(batch_bounds(start, len(tokens))):
            if lo and should_stop():
                return False
            part = tokens[lo:hi]
            arr = (ll.llama_token * len(part))(*part)
            rc = ll.llama_decode(self._ctx, ll.llama_batch_get_one(arr, len(part)))
            if rc != 0:
                self._reset_kv()
                raise LocalLLMError(f"llama_decode failed with code {rc} at prompt token {lo}")
            self._kv.evaluated(part, start, lo, hi)
        return True

    def _reset_kv(self, seq: int = 0) -> None:
        self._ll.llama_memory_seq_rm(self._mem, seq, -1, -1)
        self._kvs[seq].clear()

    def _clear_all(self) -> None:
        self._ll.llama_memory_clear(self._mem, True)
        for kv in self._kvs:
            kv.clear()

    def _reuse_prefix(self, prompt: Sequence[int]) -> int:
        """Drop the cached tokens past the reusable prefix; return how many stay."""
        n = self._kv.reusable(prompt)
        return n if self._truncate(n) else 0

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
        buf = (ctypes.c_uint8 * size)()
        n = int(ll.llama_state_seq_get_data(self._ctx, buf, size, seq))
        data = ctypes.string_at(buf, n)
        return KVSnapshot(tuple(kv.tokens), len(data), data, canonical=kv.canonical)

    def load_kv(self, snapshot: KVSnapshot, seq: int = 0) -> bool:
        ll = self._ll
        self._reset_kv(seq)
        data: bytes = snapshot.payload
        buf = (ctypes.c_uint8 * len(data)).from_buffer_copy(data)
        if not ll.llama_state_seq_set_data(self._ctx, buf, len(data), seq):
            self._reset_kv(seq)
            return False
        self._kvs[seq].restored(snapshot.tokens, canonical=len(snapshot.exact_tokens))
        return True

    # -- batched steps -------------------------------------------------------------------
    def seq_tokens(self, seq: int, *, exact: bool = False) -> list[int]:
        return self._kvs[seq].view(exact=exact)

    def seq_keep(self, seq: int, n: int) -> bool:
        return self._truncate(n, seq)

    def seq_copy(self, src: int, dst: int, n: int) -> bool:
        ll, mem = self._ll, self._mem
        self._reset_kv(dst)
        if n <= 0 or src == dst:
            return n <= 0
        ll.llama_memory_seq_cp(mem, src, dst, -1, -1)  # another stream: the whole of it
        self._kvs[dst].copied(self._kvs[src], len(self._kvs[src].tokens))
        return self._truncate(n, dst)

    def step(self, work: Sequence[SeqWork]) -> None:
        ll, batch = self._ll, self._batch
        i = 0
        self._rows = {}
        for w in work:
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
            self._kvs[w.seq].append(w.tokens, exact=w.exact)

    def new_sampler(self, params: SamplingParams, history: Sequence[int]) -> Any:
        return self._sampler(params, history)

    def sample(self, sampler: Any, seq: int, row: int, allowed: Any = None) -> int:
        i = self._rows[seq][row]
        if allowed is not None:  # the sampler chain reads these logits in place
            self._logits_view(i)[~allowed] = -np.inf
        return int(self._ll.llama_sampler_sample(sampler, self._ctx, i))

    def _logits_view(self, i: int) -> Any:
        ptr = self._ll.llama_get_logits_ith(self._ctx, i)
        return np.ctypeslib.as_array(ptr, shape=(self.info.n_vocab,))

    def logits(self, seq: int, row: int) -> Any:
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

    def dump_kv(self, snapshot: KVSnapshot) -> bytes:
        return bytes(snapshot.payload)

    def undump_kv(self, tokens: Sequence[int], data: bytes) -> KVSnapshot:
        return KVSnapshot(tuple(tokens), len(data), data)

    def _sampler(self, params: SamplingParams, history: Sequence[int]) -> Any:
        ll = self._ll
        chain = ll.llama_sampler_chain_init(ll.llama_sampler_chain_default_params())
        add = ll.llama_sampler_chain_add
        n_vocab = ll.llama_vocab_n_tokens(self._vocab)
        if params.logit_bias:
            biases = (ll.llama_logit_bias * len(params.logit_bias))()
            for i, (tok, bias) in enumerate(params.logit_bias):
                biases[i].token, biases[i].bias = tok, bias
            add(chain, ll.llama_sampler_init_logit_bias(n_vocab, len(biases), biases))
        penalized = penalties(params)
        if penalized:
            add(
                chain,
                ll.llama_sampler_init_penalties(
                    n_vocab,
                    PENALTY_LAST_N,
                    params.repeat_penalty,
                    params.frequency_penalty,
                    params.presence_penalty,
                ),
            )
        if params.temperature <= 0:
            add(chain, ll.llama_sampler_init_greedy())
        else:
            if params.top_k > 0:
                add(chain, ll.llama_sampler_init_top_k(params.top_k))
            if params.top_p < 1.0:
                add(chain, ll.llama_sampler_init_top_p(params.top_p, 1))
            if params.min_p > 0.0:
                add(chain, ll.llama_sampler_init_min_p(params.min_p, 1))
            add(chain, ll.llama_sampler_init_temp(params.temperature))
            seed = params.seed if params.seed is not None else random.getrandbits(32)
            add(chain, ll.llama_sampler_init_dist(seed & 0xFFFFFFFF))
        if penalized:
            for tok in history[-PENALTY_LAST_N:]:
                ll.llama_sampler_accept(chain, tok)
        return chain

    def stream(
        self,
        prompt: Sequence[int],
        params: SamplingParams,
        *,
        should_stop: Callable[[], bool],
        drafter: Drafter | None = None,
    ) -> Iterator[Chunk]:
        check_request(len(prompt), self.info.n_ctx, params, self.info.n_vocab)
        return self._generate(prompt, params, should_stop, drafter)

    def _generate(
        self,
        prompt: Sequence[int],
        params: SamplingParams,
        should_stop: Callable[[], bool],
        drafter: Drafter | None,
    ) -> Iterator[Chunk]:
        ll, ctx = self._ll, self._ctx
        t0 = time.perf_counter()
        cached = self._reuse_prefix(prompt)
        sampler = self._sampler(params, prompt)
        try:
            if not self._decode(prompt[cached:], should_stop):
                yield final_chunk("", "cancelled", len(prompt), cached, 0, t0, t0, t0)
                return
            limit = self.info.n_ctx - len(prompt)
            if params.max_tokens is not None:
                limit = min(params.max_tokens, limit)
            counts = DraftCounts()
            first = int(ll.llama_sampler_sample(sampler, ctx, -1)) if limit > 0 else -1
            if drafter is None:
                source = self._plain_tokens(first, sampler, limit)
            else:

                def step(tok: int, draft: list[int]) -> tuple[int, int]:
                    if draft:
                        return self._verify(tok, draft, sampler)
                    self._decode_one(tok)
                    return int(ll.llama_sampler_sample(sampler, ctx, -1)), 0

                source = drafted_tokens(
                    first,
                    step,
                    limit=limit,
                    kv=self._kv.tokens,
                    n_ctx=self.info.n_ctx,
                    drafter=drafter,
                    counts=counts,
                )
            yield from emit_chunks(
                source if limit > 0 else iter(()),
                piece=self.piece,
                params=params,
                eog=self.info.eog_ids,
                should_stop=should_stop,
                n_prompt=len(prompt),
                cached=cached,
                t0=t0,
                counts=counts,
            )
        finally:
            ll.llama_sampler_free(sampler)

    def _plain_tokens(self, first: int, sampler: Any, limit: int) -> Iterator[tuple[int, int]]:
        """One token per decode step. Each goes out before it is evaluated: the reader
        gets it one step sooner, and works on it while the next logits are computed."""
        ll, ctx, one, kv = self._ll, self._ctx, self._one, self._kv.tokens
        tok = first
        for n in range(1, limit + 1):
            yield tok, 0
            if n == limit:
                return
            one[0] = tok
            rc = ll.llama_decode(ctx, ll.llama_batch_get_one(one, 1))
            if rc != 0:
                self._reset_kv()
                raise LocalLLMError(f"llama_decode failed with code {rc} while generating")
            kv.append(tok)
            tok = int(ll.llama_sampler_sample(sampler, ctx, -1))

    def _decode_one(self, tok: int) -> None:
        ll, one = self._ll, self._one
        one[0] = tok
        rc = ll.llama_decode(self._ctx, ll.llama_batch_get_one(one, 1))
        if rc != 0:
            self._reset_kv()
            raise LocalLLMError(f"llama_decode failed with code {rc} while generating")
        self._kv.tokens.append(tok)

    def _verify(self, tok: int, draft: list[int], sampler: Any) -> tuple[int, int]:
        """Evaluate tok and the draft in one batch; the target samples each position and a
        draft token is kept while it equals that sample. Returns the first sample that is
        not a kept draft (a correction, or the token after a fully kept draft) and how
        many drafts were kept; the rejected drafts leave the KV cache."""
        ll, kv = self._ll, self._kv.tokens
        part = [tok, *draft]
        base = len(kv)
        batch = ll.llama_batch_init(len(part), 0, 1)
        try:
            for i, t in enumerate(part):
                batch.token[i], batch.pos[i] = t, base + i
                batch.n_seq_id[i], batch.seq_id[i][0], batch.logits[i] = 1, 0, True
            batch.n_tokens = len(part)
            rc = ll.llama_decode(self._ctx, batch)
        finally:
            ll.llama_batch_free(batch)
        if rc != 0:
            self._reset_kv()
            raise LocalLLMError(f"llama_decode failed with code {rc} while verifying a draft")
        kv.extend(part)
        sampled, n_ok = keep_matching(
            draft, lambda i: int(ll.llama_sampler_sample(sampler, self._ctx, i))
        )
        self._truncate(base + 1 + n_ok)
        return sampled, n_ok

    def exact_batches(self) -> bool:
        if self._exact is None:
            self._exact = self._probe_batches()
            log.info("%s: batched logits exact: %s", self.info.id, self._exact)
        return self._exact

    def _probe_batches(self) -> bool:
        """Evaluate two tokens after the cache, alone and as a batch; compare the logits."""
        import numpy as np

        ll, base = self._ll, len(self._kv.tokens)
        pair = [*self.tokenize("Hello world"), 0, 0][:2]
        if base + 2 > self.info.n_ctx:
            return False
        n_vocab = int(ll.llama_vocab_n_tokens(self._vocab))
        self._decode_one(pair[0])
        alone = np.ctypeslib.as_array(ll.llama_get_logits_ith(self._ctx, -1), (n_vocab,)).copy()
        self._truncate(base)
        batch = ll.llama_batch_init(2, 0, 1)
        try:
            for i, t in enumerate(pair):
                batch.token[i], batch.pos[i] = t, base + i
                batch.n_seq_id[i], batch.seq_id[i][0], batch.logits[i] = 1, 0, True
            batch.n_tokens = 2
            rc = ll.llama_decode(self._ctx, batch)
        finally:
            ll.llama_batch_free(batch)
        self._kv.tokens.extend(pair)
        if rc != 0:
            self._truncate(base)
            return False
        together = np.ctypeslib.as_array(ll.llama_get_logits_ith(self._ctx, 0), (n_vocab,))
        exact = bool(np.array_equal(alone, together))
        self._truncate(base)
        return exact

    def draft_greedy(self, context: Sequence[int], n: int) -> list[int]:
        """Greedy tokens after `context`, reusing the cached prefix (this model as a draft)."""
        ll = self._ll
        # the last context token is evaluated again, for its logits
        self._truncate(reusable_prefix(self._kv.tokens, context[:-1]))
        if not self._decode(context[len(self._kv.tokens) :], lambda: False):
            return []
        out: list[int] = []
        room = self.info.n_ctx - len(self._kv.tokens)
        vocab_n = int(ll.llama_vocab_n_tokens(self._vocab))
        for _ in range(min(n, room)):
            logits = ll.llama_get_logits_ith(self._ctx, -1)
            best = _argmax(logits, vocab_n)
            out.append(best)
            if len(out) < n:
                self._decode_one(best)
        return out

    # -- scoring (perplexity) ------------------------------------------------------
    def logprobs(self, tokens: Sequence[int], *, start: int = 1) -> list[float]:
        import numpy as np

        ll = self._ll
        check_scoring(len(tokens), start, self.info.n_ctx)
        self._clear_all()
        n_batch = min(self.info.n_ctx, 512)
        n_vocab = int(ll.llama_vocab_n_tokens(self._vocab))
        batch = ll.llama_batch_init(n_batch, 0, 1)
        out: list[float] = []
        try:
            for lo in range(0, len(tokens) - 1, n_batch):
                part = tokens[lo : min(lo + n_batch, len(tokens) - 1)]
                wanted = 0
                for i, tok in enumerate(part):
                    pos = lo + i
                    batch.token[i], batch.pos[i] = tok, pos
                    batch.n_seq_id[i], batch.seq_id[i][0] = 1, 0
                    batch.logits[i] = pos >= start - 1  # the logits that predict tokens[start:]
                    wanted += pos >= start - 1
                batch.n_tokens = len(part)
                rc = ll.llama_decode(self._ctx, batch)
                if rc != 0:
                    raise LocalLLMError(f"llama_decode failed with code {rc} at token {lo}")
                if wanted:
                    logits = np.ctypeslib.as_array(
                        ll.llama_get_logits(self._ctx), (wanted, n_vocab)
                    )
                    first = max(lo + 1, start)
                    out.extend(pick_logprobs(logits, tokens[first : lo + len(part) + 1]))
        finally:
            ll.llama_batch_free(batch)
            self._clear_all()
        return out

    # -- embeddings ----------------------------------------------------------------
    def _embed_context(self, pooling: str | None) -> tuple[Any, int]:
        """A second context on the same weights that returns pooled embeddings (one per
        pooling kind, made on first use), and its size in tokens."""
        ll = self._ll
        cached = self._embed_ctxs.get(pooling)
        if cached is not None:
            return cached
        n_ctx = min(self.info.n_ctx_train or EMBED_CTX, EMBED_CTX)
        params = ll.llama_context_default_params()
        params.n_ctx = n_ctx
        params.n_batch = params.n_ubatch = n_ctx  # a non-causal model reads an input whole
        params.n_seq_max = EMBED_SEQS
        params.kv_unified = True
        params.embeddings = True
        params.n_threads = params.n_threads_batch = self._threads
        params.no_perf = True
        params.pooling_type = _POOLING.get(pooling or "", ll.LLAMA_POOLING_TYPE_UNSPECIFIED)
        ctx = ll.llama_init_from_model(self._model, params)
        if ctx and ll.llama_pooling_type(ctx) == ll.LLAMA_POOLING_TYPE_NONE:
            ll.llama_free(ctx)  # a chat model has no pooling of its own: mean
            params.pooling_type = ll.LLAMA_POOLING_TYPE_MEAN
            ctx = ll.llama_init_from_model(self._model, params)
        if not ctx:
            raise LocalLLMError(f"could not create an embedding context of {n_ctx} tokens")
        self._embed_ctxs[pooling] = (ctx, n_ctx)
        return ctx, n_ctx

    def embed(
        self, inputs: Sequence[str | Sequence[int]], *, pooling: str | None = None
    ) -> tuple[list[list[float]], int]:
        ll = self._ll
        ctx, n_ctx = self._embed_context(pooling)
        rows = [
            self._tokenize(x.encode("utf-8"), add_special=True, parse_special=False)
            if isinstance(x, str)
            else list(x)
            for x in inputs
        ]
        n_vocab = self.info.n_vocab
        for i, row in enumerate(rows):
            if not row:
                raise InvalidRequest(f"input {i} is empty", param="input")
            bad = next((t for t in row if not 0 <= t < n_vocab), None)
            if bad is not None:
                raise InvalidRequest(
                    f"input {i} has token {bad}, which is not in the vocabulary "
                    f"(ids 0 to {n_vocab - 1})",
                    param="input",
                )
            if len(row) > n_ctx:
                raise InvalidRequest(
                    f"input {i} is {len(row)} tokens; embeddings take at most {n_ctx}",
                    param="input",
                    code="context_length_exceeded",
                )
        n_embd = int(ll.llama_model_n_embd(self._model))
        mem = ll.llama_get_memory(ctx)
        batch = ll.llama_batch_init(n_ctx, 0, EMBED_SEQS)
        out: list[list[float]] = []
        try:
            i = 0
            while i < len(rows):  # as many inputs per call as fit in the batch
                group: list[list[int]] = []
                used = 0
                while i < len(rows) and len(group) < EMBED_SEQS and used + len(rows[i]) <= n_ctx:
                    group.append(rows[i])
                    used += len(rows[i])
                    i += 1
                k = 0
                for seq, row in enumerate(group):
                    for pos, tok in enumerate(row):
                        batch.token[k], batch.pos[k] = tok, pos
                        batch.n_seq_id[k], batch.seq_id[k][0] = 1, seq
                        batch.logits[k] = True
                        k += 1
                batch.n_tokens = k
                ll.llama_memory_clear(mem, True)
                rc = ll.llama_decode(ctx, batch)
                if rc != 0:
                    raise LocalLLMError(f"llama_decode failed with code {rc} for embeddings")
                for seq in range(len(group)):
                    ptr = ll.llama_get_embeddings_seq(ctx, seq)
                    vec = np.ctypeslib.as_array(ptr, shape=(n_embd,)).astype(np.float64)
                    norm = float(np.linalg.norm(vec))
                    out.append((vec / norm if norm > 0 else vec).tolist())
        finally:
            ll.llama_batch_free(batch)
            ll.llama_memory_clear(mem, True)
        return out, sum(len(r) for r in rows)

    def close(self) -> None:
        for ctx, _ in getattr(self, "_embed_ctxs", {}).values():
            self._ll.llama_free(ctx)
        self._embed_ctxs = {}
        ll = self._ll
        if getattr(self, "_batch", None) is not None:
            ll.llama_batch_free(self._batch)
            self._batch = None
        if getattr(self, "_ctx", None):
            ll.llama_free(self._ctx)
            self._ctx = None
        if getattr(self, "_model", None):
            ll.llama_model_free(self._model)
            self._model = None


def _argmax(logits: Any, n: int) -> int:
    import numpy as np

    return int(np.argmax(np.ctypeslib.as_array(logits, (n,))))
