"""Images and audio on the llama.cpp backend, through libmtmd and the model's projector.

`tokenize` lays a prompt out as llama-server does (mtmd's chunks: the model's text
around each picture, the picture's own tokens), with each picture's tokens written as
its stand-in ids (backends/media.py) and its chunk kept by the ids' base. `prefill`
reads the part of a sequence's step that holds pictures: text in plain batches, each
picture encoded by the projector (once; its embeddings kept for the next prompt that
shows it) and decoded whole by mtmd's helper, which knows each model's attention
(non-causal image blocks, for one). What follows the last picture goes into the step's
shared batch like any text.
"""

from __future__ import annotations

import ctypes
import dataclasses
import logging
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from localllm.backends import media as media_ids
from localllm.backends.base import MEDIA_MARKER, Media, SeqWork
from localllm.backends.common import BATCH, KVLedger
from localllm.errors import InvalidRequest, LocalLLMError, ModelLoadError

log = logging.getLogger(__name__)
T = TypeVar("T")
_KEEP_CHUNKS = 8  # pictures whose prepared chunks are kept (made again from `held`)
_KEEP_EMBEDDINGS = 8  # pictures whose encoded embeddings are kept


class Projector:
    """A loaded projector (mmproj GGUF) beside a llama.cpp model."""

    def __init__(self, ll: Any, model: Any, path: str, threads: int) -> None:
        from llama_cpp import mtmd_cpp as mt

        from localllm.backends.llamacpp_native import _state

        self._ll, self._mt = ll, mt
        if "log_cb" in _state:  # mtmd's lines go where llama.cpp's go
            mt.mtmd_log_set(_state["log_cb"], ctypes.c_void_p(0))
            mt.mtmd_helper_log_set(_state["log_cb"], ctypes.c_void_p(0))
        params = mt.mtmd_context_params_default()
        params.use_gpu = bool(ll.llama_supports_gpu_offload())
        params.n_threads = threads
        params.media_marker = MEDIA_MARKER.encode()
        params.print_timings = False
        params.warmup = False
        if not Path(path).is_file():
            raise ModelLoadError(path, "the projector file (mmproj) does not exist")
        ctx = mt.mtmd_init_from_file(path.encode(), model, params)
        if not ctx:
            raise ModelLoadError(
                path,
                "libmtmd could not load it as a projector for this model (a projector of "
                "another model, or not a projector: see the log)",
            )
        self._ctx = ctx
        self.path = path
        kinds = set()
        if mt.mtmd_support_vision(ctx):
            kinds.add("image")
        if mt.mtmd_support_audio(ctx):
            kinds.add("audio")
        self.kinds = frozenset(kinds)
        self.mrope = bool(mt.mtmd_decode_use_mrope(ctx))
        self._n_embd = int(ll.llama_model_n_embd_inp(model))
        self._lock = threading.Lock()  # the tokenizer thread adds chunks, the worker reads
        self.held = media_ids.Held()  # run base -> the picture, to prepare it again
        self._chunks: OrderedDict[int, Any] = OrderedDict()  # run base -> owned chunk
        self._embd: OrderedDict[int, Any] = OrderedDict()  # run base -> float32 embeddings
        self._pos = (ll.llama_pos * 1)()

    # -- prompts ---------------------------------------------------------------------
    def tokenize(self, text: str, media: Sequence[Media]) -> list[int]:
        """The prompt's ids for `text` (control tokens parsed, no BOS added) with each
        MEDIA_MARKER in it replaced by the next of `media` (as the model lays a picture
        out: its own tokens around the stand-in ids)."""
        if text.count(MEDIA_MARKER) != len(media):
            raise InvalidRequest(
                f"the prompt places {text.count(MEDIA_MARKER)} images or clips and carries "
                f"{len(media)}",
                param="messages",
            )
        for m in media:
            if m.kind not in self.kinds:
                what = "images" if m.kind == "image" else "audio"
                raise InvalidRequest(
                    f"this model's projector ({Path(self.path).name}) does not read {what}",
                    param="messages",
                    code="vision_not_supported" if m.kind == "image" else "audio_not_supported",
                )
        by_digest = {m.digest: m for m in media}
        out = self._chunked(text, media, lambda chunks: self._flatten(chunks, by_digest))
        if out and out[-1] < 0:
            raise InvalidRequest(
                "a prompt may not end with an image or clip: add text after it",
                param="messages",
            )
        return out

    def _chunked(self, text: str, media: Sequence[Media], read: Callable[[Any], T]) -> T:
        """`read` of mtmd's chunks for `text` with `media` in place of its markers."""
        mt = self._mt
        bitmaps = [self._bitmap(m) for m in media]
        chunks = mt.mtmd_input_chunks_init()
        try:
            arr = (mt.mtmd_bitmap_p_ctypes * max(1, len(bitmaps)))(*bitmaps)
            raw = text.encode("utf-8")
            inp = mt.mtmd_input_text(raw, len(raw), False, True)
            rc = mt.mtmd_tokenize(self._ctx, chunks, ctypes.byref(inp), arr, len(bitmaps))
            if rc != 0:
                raise InvalidRequest(
                    f"the projector could not read the prompt's {len(media)} images or clips "
                    f"(mtmd_tokenize said {rc})",
                    param="messages",
                    code="unsupported_media",
                )
            return read(chunks)
        finally:
            mt.mtmd_input_chunks_free(chunks)
            for bm in bitmaps:
                mt.mtmd_bitmap_free(bm)

    def _bitmap(self, m: Media) -> Any:
        mt = self._mt
        buf = (ctypes.c_uint8 * len(m.data)).from_buffer_copy(m.data)
        if m.kind == "image":
            bm = mt.mtmd_bitmap_init(m.width, m.height, buf)
        else:
            bm = mt.mtmd_helper_bitmap_init_from_buf(self._ctx, buf, len(m.data), False)
        if not bm:
            raise InvalidRequest(
                f"the {m.kind} ({len(m.data):,} bytes) could not be decoded",
                param="messages",
                code="unsupported_media",
            )
        mt.mtmd_bitmap_set_id(bm, m.digest.encode())
        return bm

    def _flatten(self, chunks: Any, by_digest: dict[str, Media]) -> list[int]:
        """The prompt's ids: text chunks' tokens, each picture's stand-ins (its chunk
        kept, and the picture held to prepare it again, the prompt's others never let go
        for it)."""
        mt = self._mt
        out: list[int] = []
        bases: list[int] = []
        n_out = ctypes.c_size_t(0)
        for i in range(mt.mtmd_input_chunks_size(chunks)):
            chunk = mt.mtmd_input_chunks_get(chunks, i)
            if mt.mtmd_input_chunk_get_type(chunk) == mt.MTMD_INPUT_CHUNK_TYPE_TEXT:
                ptr = mt.mtmd_input_chunk_get_tokens_text(chunk, ctypes.byref(n_out))
                out.extend(ptr[: n_out.value])
                continue
            n = int(mt.mtmd_input_chunk_get_n_tokens(chunk))
            if self.mrope and int(mt.mtmd_input_chunk_get_n_pos(chunk)) != n:
                raise InvalidRequest(
                    "this model places a picture's tokens by M-RoPE positions (Qwen2-VL and "
                    "its kin), which localllm does not serve yet",
                    param="messages",
                    code="vision_not_supported",
                )
            digest = (mt.mtmd_input_chunk_get_id(chunk) or b"").decode()
            ids = media_ids.run_ids(digest, n)
            bases.append(-ids[0])
            self._keep(-ids[0], mt.mtmd_input_chunk_copy(chunk))
            self.held.add(-ids[0], by_digest[digest], keep=bases)
            out.extend(ids)
        return out

    def _media_chunk(self, chunks: Any) -> Any:
        """An owned copy of the one picture's chunk among `chunks`."""
        mt = self._mt
        for i in range(mt.mtmd_input_chunks_size(chunks)):
            chunk = mt.mtmd_input_chunks_get(chunks, i)
            if mt.mtmd_input_chunk_get_type(chunk) != mt.MTMD_INPUT_CHUNK_TYPE_TEXT:
                return mt.mtmd_input_chunk_copy(chunk)
        raise LocalLLMError("the projector made no chunk of a picture it read before")

    def _keep(self, base: int, chunk: Any) -> None:
        with self._lock:
            old = self._chunks.pop(base, None)
            self._chunks[base] = chunk
            drop = [old] if old is not None else []
            while len(self._chunks) > _KEEP_CHUNKS:
                drop.append(self._chunks.popitem(last=False)[1])
        for c in drop:
            self._mt.mtmd_input_chunk_free(c)

    # -- steps -----------------------------------------------------------------------
    def read_pictures(
        self, lctx: Any, batch: Any, kvs: Sequence[KVLedger], work: Sequence[SeqWork]
    ) -> list[SeqWork]:
        """A step's parts with each one that holds pictures read up to its last (see
        `prefill`): what is left of them is text, for the step's shared batch."""
        rest = []
        for w in work:
            if not w.tokens or min(w.tokens) >= 0:
                rest.append(w)
                continue
            tail = self.prefill(lctx, batch, w.seq, kvs[w.seq], w.tokens)
            if tail or w.logits:
                rest.append(dataclasses.replace(w, tokens=tail))
        return rest

    def prefill(
        self, lctx: Any, batch: Any, seq: int, kv: KVLedger, tokens: Sequence[int]
    ) -> list[int]:
        """Read `tokens` (a step's part for `seq`, after what its KV holds) up to the end
        of its last picture; the rest (text) is returned for the step's batch. A part
        that starts inside a picture (a cache that kept half of one) reads it again whole."""
        full = [*kv.tokens, *tokens]
        start = len(kv.tokens)
        if media_ids.continues(full, start):
            back = media_ids.run_start(full, start)
            if not self._ll.llama_memory_seq_rm(self._ll.llama_get_memory(lctx), seq, back, -1):
                raise LocalLLMError(f"could not drop the half-read picture of sequence {seq}")
            kv.cut(back)
            start = back
        last = max(i for i, t in enumerate(full) if t < 0 and i >= start)
        end = media_ids.run_end(full, last)
        i = start
        while i < end:
            if full[i] >= 0:
                j = i
                while j < end and full[j] >= 0:
                    j += 1
                self._text(lctx, batch, seq, full[i:j], i)
            else:
                j = media_ids.run_end(full, i)
                self._picture(lctx, seq, full, i, j)
            kv.tokens.extend(full[i:j])
            i = j
        return full[end:]

    def _text(self, lctx: Any, batch: Any, seq: int, part: Sequence[int], pos: int) -> None:
        ll = self._ll
        for lo in range(0, len(part), BATCH):
            piece = part[lo : lo + BATCH]
            for k, tok in enumerate(piece):
                batch.token[k], batch.pos[k] = tok, pos + lo + k
                batch.n_seq_id[k], batch.seq_id[k][0] = 1, seq
                batch.logits[k] = False
            batch.n_tokens = len(piece)
            rc = ll.llama_decode(lctx, batch)
            if rc != 0:
                raise LocalLLMError(f"llama_decode failed with code {rc} beside a picture")

    def _picture(self, lctx: Any, seq: int, full: Sequence[int], i: int, j: int) -> None:
        mt = self._mt
        base = media_ids.run_base(full, i)
        with self._lock:
            chunk = self._chunks.get(base)
            if chunk is not None:
                self._chunks.move_to_end(base)
        if chunk is None:  # prepared again from the picture
            item = self.held.get(base)
            if item is None:
                raise LocalLLMError("a picture of this prompt is no longer held: send it again")
            chunk = self._chunked(MEDIA_MARKER, [item], self._media_chunk)
            self._keep(base, chunk)
        n = int(self._mt.mtmd_input_chunk_get_n_tokens(chunk))
        if j - i != n:  # the scheduler reads a picture whole (media.whole_runs)
            raise LocalLLMError(f"a step holds {j - i} of a picture's {n} tokens; it is read whole")
        embd = self._embd.get(base)
        if embd is None:
            rc = mt.mtmd_encode_chunk(self._ctx, chunk)
            if rc != 0:
                raise LocalLLMError(f"the projector failed to encode a picture (code {rc})")
            n_embd = self._n_embd
            ptr = mt.mtmd_get_output_embd(self._ctx)
            embd = np.ctypeslib.as_array(ptr, shape=((j - i) * n_embd,)).copy()
            self._embd[base] = embd
            while len(self._embd) > _KEEP_EMBEDDINGS:
                self._embd.popitem(last=False)
        else:
            self._embd.move_to_end(base)
        out = embd.ctypes.data_as(ctypes.POINTER(ctypes.c_float))
        rc = mt.mtmd_helper_decode_image_chunk(
            self._ctx, lctx, chunk, out, i, seq, BATCH, self._pos,
            mt.mtmd_helper_post_decode_callback(0), None,
        )  # fmt: skip
        if rc != 0:
            raise LocalLLMError(f"llama_decode failed with code {rc} reading a picture")

    def close(self) -> None:
        with self._lock:
            chunks, self._chunks = list(self._chunks.values()), OrderedDict()
        for c in chunks:
            self._mt.mtmd_input_chunk_free(c)
        self._embd.clear()
        if self._ctx:
            self._mt.mtmd_free(self._ctx)
            self._ctx = None
