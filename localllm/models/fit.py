"""Will a model fit? An estimate of the memory a load takes, against what the machine has free.

A load takes the weights (the file, or the MLX folder), the KV cache at the chosen
context (f16 per element; f32 where MLX computes on a CPU) and working buffers.
The buffers were measured for llama.cpp on the starter model: about 57 MiB at
n_ctx 2048 and at 8192 alike; the estimate takes 64 MiB plus 5% of the weights,
which stays above that and grows with larger models.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from dataclasses import dataclass

from localllm.backends.base import ModelRef, default_n_ctx
from localllm.errors import DamagedModel, LocalLLMError, ModelTooLarge
from localllm.hardware import available_memory, gpu_free_memory
from localllm.models import projector
from localllm.models.gguf import ModelMeta, read_meta
from localllm.units import format_bytes

_MIB = 1024 * 1024
BUFFER_BASE = 64 * _MIB


@dataclass(frozen=True, slots=True)
class Estimate:
    """The memory a load of `name` at `n_ctx` would take, in parts."""

    name: str
    weights: int
    kv: int
    buffers: int
    n_ctx: int
    kv_per_token: int  # 0 when the header could not be read
    draft: Estimate | None = None  # a draft model beside it (speculative decoding)
    n_seq: int = 1  # sequences decoded together (`parallel`), each with n_ctx of KV

    @property
    def total(self) -> int:
        return self.weights + self.kv + self.buffers + (self.draft.total if self.draft else 0)

    def text(self) -> str:
        seqs = f"{self.n_seq} x " if self.n_seq > 1 else ""
        kv = f"KV {format_bytes(self.kv)} at {seqs}{self.n_ctx} tokens"
        draft = f" + draft {self.draft.name} {format_bytes(self.draft.total)}" if self.draft else ""
        return (
            f"about {format_bytes(self.total)} (weights {format_bytes(self.weights)}"
            f" + {kv} + buffers {format_bytes(self.buffers)}{draft})"
        )

    def max_ctx(self, free: int) -> int:
        """The largest context (a multiple of 256) whose load fits in `free` bytes; 0: none.
        A draft model runs at the target's context, so its KV grows with it."""
        d = self.draft
        room = free - self.weights - self.buffers - (d.weights + d.buffers if d else 0)
        per_token = self.kv_per_token * self.n_seq + (d.kv_per_token if d else 0)
        if self.kv_per_token <= 0 or room <= 0:
            return 0
        return min(self.n_ctx, room // per_token // 256 * 256)

    def at_ctx(self, n_ctx: int) -> Estimate:
        """The same model (and draft) at another context size."""
        draft = self.draft.at_ctx(n_ctx) if self.draft else None
        kv = n_ctx * self.kv_per_token * self.n_seq
        return dataclasses.replace(self, kv=kv, n_ctx=n_ctx, draft=draft)

    def with_seq(self, n_seq: int) -> Estimate:
        """The same load with room for n_seq sequences of n_ctx tokens each."""
        kv = self.n_ctx * self.kv_per_token * n_seq
        return dataclasses.replace(self, kv=kv, n_seq=n_seq)

    def max_seq(self, free: int) -> int:
        """The most sequences (at most n_seq) whose KV fits in `free` bytes beside the rest;
        0: not even one."""
        for n in range(self.n_seq, 0, -1):
            if self.with_seq(n).total <= free:
                return n
        return 0

    def with_draft(
        self, draft: ModelRef | None, *, target: ModelRef | None = None, kv_scale: float = 1.0
    ) -> Estimate:
        """The same load with a draft model beside it, at the same context (alone when there
        is none, or when the target is the draft model itself)."""
        if draft is None or (target is not None and draft.path == target.path):
            return self
        return dataclasses.replace(
            self, draft=estimate(draft, self.n_ctx or None, kv_scale=kv_scale)
        )

    def with_weights(self, weights: int) -> Estimate:
        """Another file of the same model (another quantization): its weights, same KV."""
        return dataclasses.replace(self, weights=weights, buffers=buffers(weights))


def buffers(weights: int) -> int:
    """Working buffers beside the weights and the KV cache (see the module's note)."""
    return BUFFER_BASE + weights // 20


def from_meta(
    name: str, meta: ModelMeta | None, weights: int, n_ctx: int | None, *, kv_scale: float = 1.0
) -> Estimate:
    """The estimate from a header already read (None: unreadable, the weights are all we
    know). `kv_scale`: the KV's size against f16 (2: f32; below 1: quantized)."""
    if meta is None:
        return Estimate(name, weights, 0, buffers(weights), n_ctx or 0, 0)
    n = n_ctx or default_n_ctx(meta.n_ctx_train)
    per_token = math.ceil(meta.kv_bytes_per_token * kv_scale)
    return Estimate(name, weights, per_token * n, buffers(weights), n, per_token)


def trained_context(ref: ModelRef) -> int:
    """The context a model was trained for, from its header; 0 when it does not say."""
    try:
        return read_meta(ref.path, ref.format).n_ctx_train
    except LocalLLMError:
        return 0


def estimate(ref: ModelRef, n_ctx: int | None = None, *, kv_scale: float = 1.0) -> Estimate:
    """The estimate for a local model, from its header (no weights are read). A damaged
    header is refused here, before any backend reads the file."""
    try:
        meta: ModelMeta | None = read_meta(ref.path, ref.format)
    except DamagedModel:
        raise
    except LocalLLMError:
        meta = None
    if meta is not None and ref.format == "gguf" and meta.truncated:
        raise DamagedModel(
            str(ref.path),
            f"the file is truncated: its tensors need {meta.data_end:,} bytes and it has "
            f"{meta.file_size:,} (an interrupted download or copy?)",
        )
    need = from_meta(ref.name, meta, ref.size_bytes, n_ctx, kv_scale=kv_scale)
    mmproj = projector.beside(ref.path) if ref.format == "gguf" else None
    if mmproj is not None:  # the projector loads beside it: its weights count too
        with contextlib.suppress(OSError):
            need = dataclasses.replace(need, weights=need.weights + mmproj.stat().st_size)
    return need


@dataclass(frozen=True, slots=True)
class Free:
    """Memory a model can go into, and what it is."""

    bytes: int
    where: str  # "RAM" or "VRAM on <GPU>"

    def text(self) -> str:
        return f"{format_bytes(self.bytes)} {self.where} free"


def free_memory(*, gpu_offload: bool = False, budget_mb: int | None = None) -> Free:
    """Free RAM, or the GPU's free VRAM when layers go there; capped by a configured budget."""
    free = Free(available_memory(), "RAM")
    if gpu_offload:
        gpu = gpu_free_memory()
        if gpu is not None:
            free = Free(gpu[1], f"VRAM on {gpu[0]}")
    if budget_mb is not None and budget_mb * _MIB < free.bytes:
        free = Free(budget_mb * _MIB, f"{free.where} (memory_budget_mb)")
    return free


def default_context(
    ref: ModelRef, room: Free, n_seq: int, *, kv_scale: float = 1.0, floor: int = 4096
) -> int:
    """The context a model gets unless told: the trained one, halved while its load (with
    KV for n_seq sequences) would not fit in `room` or its KV would take more than half
    of it; never below min(trained, floor). 0 when the header does not say."""
    trained = trained_context(ref)
    if not trained:
        return 0
    base = estimate(ref, trained, kv_scale=kv_scale).with_seq(n_seq)  # one more header read
    low = min(trained, floor)
    n = trained
    while n > low:
        need = base.at_ctx(n)
        if fits(need, room) and need.kv <= room.bytes // 2:
            break
        n //= 2
    return max(n, low)


def fits(need: Estimate, free: Free) -> bool:
    return need.total <= free.bytes


def refusal(need: Estimate, free: Free) -> ModelTooLarge:
    """The error for a load that will not fit, with a way out."""
    ctx = need.max_ctx(free.bytes)
    if ctx >= 256:
        hint = f"a smaller context (--ctx {ctx} needs {format_bytes(need.at_ctx(ctx).total)})"
    else:
        hint = (
            "a smaller quantization of this model (Q4_K_M or q4_0 take about a quarter of f16)"
            " or close other programs"
        )
    return ModelTooLarge(need.name, need.text(), need.total, free.text(), free.bytes, hint)


def check(need: Estimate, free: Free) -> None:
    """Raise ModelTooLarge when `need` does not fit in `free`."""
    if not fits(need, free):
        raise refusal(need, free)
