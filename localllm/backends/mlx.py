"""The MLX backend, over mlx-lm's model code and a `tokenizers` tokenizer.

One KV cache per sequence (`n_seq` of them), kept between requests: a prompt
that extends the cached tokens is prefilled only past the shared prefix. The
scheduler's batched `step` runs each sequence's part in turn (mlx-lm's caches
are per sequence; see `step`). The decode loop queues the next
step on MLX before handing the current token out, so the device works while
the caller does. On a CPU-only MLX build the model computes in float32 (MLX's
float16 arithmetic on the CPU is many times slower); on Metal it stays as stored.

`mlx`, `mlx_lm` and `tokenizers` are imported only here, when a model loads.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import importlib.util
import itertools
import json
import logging
import random
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from localllm.backends import mlx_kv
from localllm.backends.base import (
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
    global_scales,
)
from localllm.backends.common import (
    KVLedger,
    batch_bounds,
    chat_tokens,
    check_scoring,
    fim_ids_from_tokens,
    penalties,
    reusable_prefix,
    vocab_fingerprint,
)
from localllm.backends.mlx_lora import MlxLoras
from localllm.backends.mlx_meta import (
    EOG_NAMES,
    gpt2_byte_decoder,
    quant_label,
    read_json,
    token_text,
)
from localllm.backends.mlx_vision import MlxVision, is_vision_dir
from localllm.errors import InvalidRequest, LocalLLMError, ModelLoadError
from localllm.hardware import apple_silicon
from localllm.provenance import imported_quant, read_provenance

log = logging.getLogger(__name__)

PENALTY_LAST_N = 64  # as on llama.cpp
_NEEDS = ("mlx", "mlx_lm", "tokenizers")


def mlx_device() -> str:
    """Where MLX computes: 'metal' (Apple GPU) or 'cpu'."""
    import mlx.core as mx

    return "metal" if mx.default_device() == mx.gpu else "cpu"


class MlxBackend:
    name: ClassVar[str] = "mlx"

    def available(self) -> bool:
        try:
            return all(importlib.util.find_spec(m) is not None for m in _NEEDS)
        except (ImportError, ValueError):  # a broken or half-removed install
            return False

    def can_load(self, ref: ModelRef) -> bool:
        return ref.format == "mlx"

    def memory_profile(self, ref: ModelRef, n_ctx: int | None) -> MemoryProfile:
        # on Apple Silicon the KV is f16 in unified memory; on a CPU MLX computes in f32;
        # kv_cache_type q8_0 / q4_0 is mlx-lm's quantized cache (backends/mlx_kv.py)
        kv = "f16" if apple_silicon() else "f32"
        return MemoryProfile(kv, gpu_offload=False, kv_block=mlx_kv.KV_GROUP)

    def load(self, ref: ModelRef, options: LoadOptions) -> MlxModel:
        return MlxModel(ref, options)


class MlxModel:
    """An MLX model directory and its KV cache. Not thread-safe: one worker uses it."""

    def __init__(self, ref: ModelRef, options: LoadOptions) -> None:
        import mlx.core as mx
        from mlx.utils import tree_map
        from mlx_lm.utils import load_model
        from tokenizers import Tokenizer

        self._mx = mx
        folder = Path(ref.path)
        report = options.progress or (lambda _f: None)
        report(0.05)
        self._vision: MlxVision | None = None
        model: Any
        try:
            if is_vision_dir(folder):  # a vision-language model: mlx-vlm's
                self._vision = MlxVision(folder)
                model, config = self._vision.language, read_json(folder / "config.json")
                config = {**config.get("text_config", {}), **config}
            else:
                model, config = load_model(folder)
            tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
        except ModelLoadError:
            raise
        except Exception as exc:  # mlx-lm raises many kinds for a bad folder
            raise ModelLoadError(str(folder), f"mlx-lm could not load it ({exc})") from None
        self._loras = MlxLoras(model, options.loras)
        self.adapters = self._loras.adapters
        report(0.8)
        self._device = mlx_device()
        if self._device == "cpu":
            whole = self._vision.model if self._vision is not None else model
            whole.update(
                tree_map(
                    lambda a: a.astype(mx.float32) if a.dtype in (mx.float16, mx.bfloat16) else a,
                    whole.parameters(),
                )
            )
            mx.eval(whole.parameters())
        self._model: Any = model
        self._tok = tokenizer
        self._make_cache = lambda: mlx_kv.make_caches(model, options.kv_type)
        self.n_seq = max(1, options.n_seq)
        self._caches: list[list[Any]] = [self._make_cache() for _ in range(self.n_seq)]
        self._kvs = [KVLedger() for _ in range(self.n_seq)]
        self._kv = self._kvs[0]  # the draft-model calls use sequence 0
        self._logits: dict[int, Any] = {}  # seq -> its logits rows in the last step
        self._exact: bool | None = None  # exact_batches(), probed once when first asked
        self._tok_config = read_json(folder / "tokenizer_config.json")
        self._pieces = self._piece_table(folder)
        self.info = self._describe(ref, folder, config, options)
        self.info.extra["kv_type"] = options.kv_type if options.kv_type in mlx_kv.KV_BITS else "f16"
        if self._vision is not None:
            self.info = dataclasses.replace(self.info, media=frozenset({"image"}))
        report(1.0)

    # -- metadata ------------------------------------------------------------------
    def _describe(
        self, ref: ModelRef, folder: Path, config: dict[str, Any], options: LoadOptions
    ) -> ModelInfo:
        tok, tc = self._tok, self._tok_config
        size = tok.get_vocab_size(with_added_tokens=True)
        texts = [tok.id_to_token(i) or "" for i in range(size)]
        specials = {a.content for a in tok.get_added_tokens_decoder().values() if a.special}
        eos = config.get("eos_token_id")
        eog = set(eos if isinstance(eos, list) else [eos] if eos is not None else [])
        gen = read_json(folder / "generation_config.json").get("eos_token_id")
        eog |= set(gen if isinstance(gen, list) else [gen] if gen is not None else [])
        eog |= {i for i, t in enumerate(texts) if t in EOG_NAMES and t in specials}
        eos_id = tok.token_to_id(token_text(tc.get("eos_token")) or "\x00")
        if eos_id is not None:
            eog.add(int(eos_id))
        bos_text = token_text(tc.get("bos_token"))
        bos_id = tok.token_to_id(bos_text) if bos_text else config.get("bos_token_id")
        add_bos = bool(tc.get("add_bos_token", False)) or self._post_processor_adds(bos_id)
        template = tc.get("chat_template")
        if not template and (folder / "chat_template.jinja").is_file():
            template = (folder / "chat_template.jinja").read_text(encoding="utf-8")
        if isinstance(template, list):  # several named templates: take the default one
            named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
            template = named.get("default") or next(iter(named.values()), None)
        provenance = (read_provenance(folder) or {}).get("source", {})
        imported = imported_quant(folder)
        n_ctx_train = int(config.get("max_position_embeddings") or 0)
        fim = fim_ids_from_tokens(texts)
        extra = {"description": f"{config.get('model_type', '?')} (mlx-lm)"}
        if imported:
            extra["imported_from"] = str(provenance.get("identity", {}).get("path", ""))
        return ModelInfo(
            id=ref.name,
            format="mlx",
            backend="mlx",
            device=self._device,
            n_ctx=options.n_ctx or default_n_ctx(n_ctx_train),
            n_ctx_train=n_ctx_train,
            chat_template=template if isinstance(template, str) else None,
            eog_ids=frozenset(int(i) for i in eog),
            bos_id=int(bos_id) if bos_id is not None else None,
            add_bos=add_bos,
            quant=imported or quant_label(config),
            vocab_fingerprint=vocab_fingerprint(texts),
            fim=FimTokens(*fim) if fim else None,
            extra=extra,
            n_vocab=size,
            max_token_bytes=max((len(t.encode()) for t in texts), default=1),
        )

    def _post_processor_adds(self, bos_id: int | None) -> bool:
        """True when the tokenizer's own post-processor puts BOS in front (Llama 3 style)."""
        if bos_id is None:
            return False
        with_special = self._tok.encode("a", add_special_tokens=True).ids
        return bool(with_special) and with_special[0] == bos_id

    def _piece_table(self, folder: Path) -> list[bytes]:
        """The bytes of every token as generated text (control tokens give no bytes)."""
        tok = self._tok
        size = tok.get_vocab_size(with_added_tokens=True)
        added = tok.get_added_tokens_decoder()
        raw = read_json(folder / "tokenizer.json")
        decoder = json.dumps(raw.get("decoder") or {})
        pieces: list[bytes] = []
        if '"ByteLevel"' in decoder:
            table = gpt2_byte_decoder()
            for i in range(size):
                text = tok.id_to_token(i) or ""
                if i in added:
                    pieces.append(b"" if added[i].special else text.encode("utf-8"))
                else:
                    pieces.append(bytes(table.get(ch, 32) for ch in text))
            return pieces
        for i in range(size):  # SentencePiece style: "\u2581" is a space, <0xNN> a byte
            text = tok.id_to_token(i) or ""
            if i in added:
                pieces.append(b"" if added[i].special else text.encode("utf-8"))
            elif len(text) == 6 and text.startswith("<0x") and text.endswith(">"):
                pieces.append(bytes([int(text[3:5], 16)]))
            else:
                pieces.append(text.replace("\u2581", " ").encode("utf-8"))
        return pieces

    # -- text ----------------------------------------------------------------------
    def tokenize(self, text: str, *, special: bool = False) -> list[int]:
        """Token ids for `text`, without BOS; `special` parses control tokens like <|im_end|>."""
        self._tok.encode_special_tokens = not special
        return list(self._tok.encode(text, add_special_tokens=False).ids)

    def detokenize(self, tokens: Sequence[int]) -> str:
        """Text for tokens, control tokens included: the inverse of tokenize(special=True)."""
        added = self._tok.get_added_tokens_decoder()
        data = b"".join(
            added[t].content.encode("utf-8") if t in added else self.piece(t) for t in tokens
        )
        return data.decode("utf-8", "replace")

    def render_chat(
        self, messages: Sequence[Message], variables: Mapping[str, Any] | None = None
    ) -> list[int]:
        info = self.info
        special = functools.partial(self.tokenize, special=True)
        vision = self._vision
        return chat_tokens(
            info.chat_template,
            messages,
            bos_text=token_text(self._tok_config.get("bos_token")) or "",
            eos_text=token_text(self._tok_config.get("eos_token")) or "",
            tokenize_special=special,
            media_tokenize=functools.partial(vision.tokenize, tokenize=special) if vision else None,
            add_bos=info.add_bos,
            bos_id=info.bos_id,
            variables=variables,
        )

    # -- generation ----------------------------------------------------------------
    @property
    def _cache(self) -> list[Any]:
        return self._caches[0]

    def _reset_kv(self, seq: int = 0) -> None:
        self._caches[seq] = self._make_cache()
        self._kvs[seq].clear()

    def _truncate(self, n: int, seq: int = 0) -> bool:
        """Keep the first n KV positions; False (and an empty cache) if a layer cannot."""
        kv, cache = self._kvs[seq], self._caches[seq]
        extra = len(kv.tokens) - n
        if extra > 0:
            if not all(c.is_trimmable() for c in cache):
                self._reset_kv(seq)
                return n == 0
            for c in cache:
                c.trim(extra)
            kv.cut(n)
        return True

    # -- KV states -------------------------------------------------------------------
    def kv_prefix(self, seq: int = 0) -> list[int]:
        return self._kvs[seq].prefix()

    def save_kv(self, seq: int = 0, *, exact: bool = True) -> KVSnapshot:
        kv = self._kvs[seq]
        if (exact and not self._truncate(kv.canonical, seq)) or not kv.tokens:
            return KVSnapshot((), 0, [])
        layers = mlx_kv.snapshot(self._caches[seq], len(kv.tokens))
        self._mx.eval(layers)
        return kv.saved(mlx_kv.nbytes(layers), layers)

    def load_kv(self, snapshot: KVSnapshot, seq: int = 0) -> bool:
        self._reset_kv(seq)
        if not snapshot.tokens:
            return False
        if not mlx_kv.restore(self._caches[seq], snapshot.payload, len(snapshot.tokens)):
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
        self._logits[seq] = row  # until the next step
        return True

    def seq_keep(self, seq: int, n: int) -> bool:
        return self._truncate(n, seq)

    def seq_copy(self, src: int, dst: int, n: int) -> bool:
        self._reset_kv(dst)
        if n <= 0 or src == dst:
            return n <= 0
        n = min(n, len(self._kvs[src].tokens))
        if not mlx_kv.copy(self._caches[dst], self._caches[src], n):
            self._reset_kv(dst)
            return False
        self._kvs[dst].copied(self._kvs[src], n)
        return True

    def use_adapters(self, scales: Scales) -> None:
        self._loras.use(scales)

    def step(self, work: Sequence[SeqWork]) -> None:
        """Each sequence's part in turn, evaluated lazily and then together: mlx-lm's KV
        caches are one per sequence of its own length, so one model call for all of them
        would need a left-padded batch cache rebuilt each step."""
        mx = self._mx
        self._logits = {}
        try:
            for w in work:
                n = len(w.tokens)
                if self._vision is not None and w.tokens and min(w.tokens) < 0:
                    out, n = self._vision.read(self._caches[w.seq], self._kvs[w.seq], w.tokens)
                else:
                    out = self._model(mx.array(list(w.tokens))[None], cache=self._caches[w.seq])
                if w.logits:
                    self._logits[w.seq] = out[:, n - w.logits :, :]
            mx.eval([*self._logits.values(), *[c.state for w in work for c in self._caches[w.seq]]])
        except Exception as exc:
            for w in work:
                self._reset_kv(w.seq)
            raise LocalLLMError(f"MLX failed in a batched step: {exc}") from exc
        for w in work:
            row = self._own_row(self._logits[w.seq]) if w.last and w.seq in self._logits else None
            self._kvs[w.seq].append(w.tokens, exact=w.exact, final=w.final, row=row)

    def _own_row(self, logits: Any) -> Any:
        """The last row of a step's logits in a buffer of its own, in its own dtype: a
        slice would keep the step's whole output (every prompt position's logits) alive."""
        mx = self._mx
        last = logits[:, -1:, :]
        return mx.array(np.array(last.astype(mx.float32))).astype(last.dtype)

    def new_sampler(self, params: SamplingParams, history: Sequence[int]) -> Any:
        """A sampler whose draws do not depend on other sequences: mlx-lm samples from MLX's
        global random key, so each draw first seeds it from this sequence's seed and its
        draw count (requests interleave draws in a batch)."""
        mx = self._mx
        inner = self._sampler(params, history)
        if params.temperature <= 0:
            return inner
        base = params.seed if params.seed is not None else random.getrandbits(32)
        draws = itertools.count()

        def sample(logits: Any) -> Any:
            mx.random.seed((base + 0x9E3779B1 * next(draws)) & 0xFFFFFFFF)
            return inner(logits)

        return sample

    def sample(self, sampler: Any, seq: int, row: int, allowed: Any = None) -> int:
        logits = self._logits[seq][:, row, :]
        if allowed is not None:
            mx = self._mx
            width = logits.shape[-1]
            keep = allowed[:width]
            if len(keep) < width:  # the output layer is padded past the vocabulary
                keep = np.concatenate([keep, np.zeros(width - len(keep), dtype=np.bool_)])
            logits = mx.where(mx.array(keep)[None], logits, -mx.inf)
        return int(sampler(logits).item())

    def logits(self, seq: int, row: int) -> Any:
        row_logits = self._logits[seq][0, row, : self.info.n_vocab]
        return np.array(row_logits.astype(self._mx.float32))

    def vocab_bytes(self) -> tuple[list[bytes], list[int]]:
        added = self._tok.get_added_tokens_decoder()
        tokens = list(self._pieces)
        special = []
        for i, token in added.items():
            if i < len(tokens) and token.special:
                tokens[i] = token.content.encode("utf-8")
                special.append(i)
        return tokens, sorted(special)

    def free_sampler(self, sampler: Any) -> None:
        pass

    def piece(self, token: int) -> bytes:
        pieces = self._pieces
        return pieces[token] if 0 <= token < len(pieces) else b""  # < 0: a picture's stand-in

    def dump_kv(self, snapshot: KVSnapshot) -> bytes:
        return mlx_kv.dump(snapshot.payload)

    def undump_kv(self, tokens: Sequence[int], data: bytes) -> KVSnapshot:
        layers = mlx_kv.undump(data, len(tokens), len(self._caches[0]))
        return KVSnapshot(tuple(tokens), mlx_kv.nbytes(layers), layers)

    def _prefill(self, tokens: Sequence[int], should_stop: Callable[[], bool]) -> bool:
        """Evaluate all but the last prompt token in aligned batches; False when cancelled."""
        mx = self._mx
        start = len(self._kv.tokens)
        bounds = batch_bounds(start, len(tokens) + 1)[:-1]
        for lo, hi in itertools.pairwise(bounds):
            if lo and should_stop():
                return False
            self._model(mx.array(tokens[lo:hi])[None], cache=self._cache)
            mx.eval([c.state for c in self._cache])
            self._kv.evaluated(tokens[lo:hi], start, lo, hi)
        return True

    def _sampler(self, params: SamplingParams, prompt: Sequence[int]) -> Callable[[Any], Any]:
        """A function from the last logits (1 x vocab) to the next token (lazy, shape (1,))."""
        mx = self._mx
        from mlx_lm.sample_utils import make_logits_processors, make_sampler

        processors = []
        if penalties(params) or params.logit_bias:
            processors = make_logits_processors(
                logit_bias=dict(params.logit_bias) or None,
                repetition_penalty=params.repeat_penalty if params.repeat_penalty != 1 else None,
                repetition_context_size=PENALTY_LAST_N,
                presence_penalty=params.presence_penalty or None,
                presence_context_size=PENALTY_LAST_N,
                frequency_penalty=params.frequency_penalty or None,
                frequency_context_size=PENALTY_LAST_N,
            )
        # a picture's stand-ins (negative ids) are no tokens a penalty counts
        history = [mx.array([t for t in prompt[-PENALTY_LAST_N:] if t >= 0], dtype=mx.int32)]
        if params.temperature <= 0:
            pick = None
        else:
            seed = params.seed if params.seed is not None else random.getrandbits(32)
            mx.random.seed(seed & 0xFFFFFFFF)
            pick = make_sampler(
                temp=params.temperature,
                top_p=params.top_p if params.top_p < 1.0 else 0.0,
                min_p=params.min_p,
                top_k=max(params.top_k, 0),
            )

        def sample(logits: Any) -> Any:
            for proc in processors:
                logits = proc(history[0], logits)
            if pick is None:
                token = mx.argmax(logits, axis=-1)
            else:
                token = pick(logits - mx.logsumexp(logits, axis=-1, keepdims=True))
            if processors:
                history[0] = mx.concatenate([history[0], token])[-PENALTY_LAST_N:]
            return token

        return sample

    def exact_batches(self) -> bool:
        if self._exact is None:
            mx, base = self._mx, len(self._kv.tokens)
            pair = [*self.tokenize("Hello world"), 0, 0][:2]
            alone = self._model(mx.array(pair[:1])[None], cache=self._cache)[0, -1]
            self._kv.tokens.append(pair[0])
            self._truncate(base)
            together = self._model(mx.array(pair)[None], cache=self._cache)[0, 0]
            self._kv.tokens.extend(pair)
            self._truncate(base)
            self._exact = bool(mx.array_equal(alone, together).item())
            log.info("%s: batched logits exact: %s", self.info.id, self._exact)
        return self._exact

    def draft_greedy(self, context: Sequence[int], n: int) -> list[int]:
        """Greedy tokens after `context`, reusing the cached prefix (this model as a draft)."""
        mx = self._mx
        self._truncate(reusable_prefix(self._kv.tokens, context[:-1]))
        self._prefill(context[len(self._kv.tokens) : -1], lambda: False)
        out: list[int] = []
        tok = context[-1]
        for _ in range(min(n, self.info.n_ctx - len(self._kv.tokens) - 1)):
            logits = self._model(mx.array([tok])[None], cache=self._cache)
            self._kv.tokens.append(tok)
            tok = int(mx.argmax(logits[:, -1, :], axis=-1).item())
            out.append(tok)
        return out

    # -- scoring (perplexity) ------------------------------------------------------
    def logprobs(self, tokens: Sequence[int], *, start: int = 1) -> list[float]:
        mx = self._mx
        check_scoring(len(tokens), start, self.info.n_ctx)
        self._reset_kv()
        self.use_adapters(global_scales(self.adapters))
        # through a fresh cache of the model's kind: a quantized KV cache is what attention reads
        fresh = self._make_cache()
        logits = self._model(mx.array(tokens[:-1])[None], cache=fresh)
        logits = logits[0, start - 1 :].astype(mx.float32)
        norm = mx.logsumexp(logits, axis=-1)
        picked = mx.take_along_axis(logits, mx.array(tokens[start:])[:, None], axis=-1)[:, 0]
        return [float(v) for v in (picked - norm).tolist()]

    def embed(
        self,
        inputs: Sequence[str | Sequence[int]],
        *,
        pooling: str | None = None,
        first: int = 0,
    ) -> tuple[list[list[float]], int]:
        raise InvalidRequest(
            f"{self.info.id} runs on MLX, and mlx-lm cannot compute embeddings; use a GGUF "
            "model (llama.cpp) for /v1/embeddings",
            param="model",
            code="embeddings_not_supported",
        )

    def rerank(
        self, query: str, documents: Sequence[str], *, first: int = 0, cut: str | None = None
    ) -> tuple[list[float], int]:
        raise InvalidRequest(
            f"{self.info.id} runs on MLX, and mlx-lm has no reranking head; use a GGUF "
            "reranker (llama.cpp) for /v1/rerank",
            param="model",
            code="rerank_not_supported",
        )

    def close(self) -> None:
        self._caches = [[] for _ in self._caches]
        for kv in self._kvs:
            kv.clear()
        self._model = None
        with contextlib.suppress(AttributeError):  # older MLX has no clear_cache
            self._mx.clear_cache()
