"""The KV caches of an MLX model as the engine handles them: made (plain, or quantized as
kv_cache_type says), cut, copied between sequences, saved and restored, written to bytes
for the disk tier and read back.

mlx-lm keeps a plain layer's keys and values as one array each, [1, heads, tokens, dim];
a quantized layer (`QuantizedKVCache`, `kv_bits`) as three, the packed values and their
per-group scales and biases, each with the tokens on the same axis. Every operation here
works on either shape: a layer's keys (or values) are a tuple of arrays, cut along the
tokens axis.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import Any

KV_BITS = {"q8_0": 8, "q4_0": 4}  # kv_cache_type -> mlx-lm's kv_bits
KV_GROUP = 64  # values per quantization group (mlx-lm's default kv_group_size)
_MAGIC = b"LLK2"
_ARRAY = "<16sI4I"  # dtype name, ndim, shape (up to 4)
_RAW = {1: "uint8", 2: "uint16", 4: "uint32"}  # an unsigned type of each width, for raw bits

Layer = tuple[tuple[Any, ...], tuple[Any, ...]]  # (keys, values), each a tuple of arrays


def make_caches(model: Any, kv_type: str) -> list[Any]:
    """A fresh cache per layer: mlx-lm's own, with its plain layers quantized when
    `kv_type` asks for it (a sliding-window layer keeps its own kind)."""
    from mlx_lm.models.cache import KVCache, QuantizedKVCache, make_prompt_cache

    caches = make_prompt_cache(model)
    bits = KV_BITS.get(kv_type)
    if bits is None:
        return list(caches)
    return [
        QuantizedKVCache(group_size=KV_GROUP, bits=bits) if type(c) is KVCache else c
        for c in caches
    ]


def arrays(x: Any) -> tuple[Any, ...]:
    """A layer's keys or values as a tuple of arrays (one plain, three quantized)."""
    return tuple(x) if isinstance(x, (tuple, list)) else (x,)


def _shaped(parts: tuple[Any, ...], like: Any) -> Any:
    """`parts` in the form the cache keeps (`like`): one array, or a tuple of them."""
    return parts if isinstance(like, (tuple, list)) else parts[0]


def cut(x: Any, n: int) -> tuple[Any, ...]:
    """The first n tokens of a layer's keys or values (new arrays: later writes to the
    live cache cannot reach them)."""
    return tuple(a[..., :n, :] for a in arrays(x))


def snapshot(caches: Sequence[Any], n: int) -> list[Layer]:
    return [(cut(c.keys, n), cut(c.values, n)) for c in caches]


def nbytes(layers: Sequence[Layer]) -> int:
    return sum(a.nbytes for k, v in layers for a in (*k, *v))


def restore(caches: Sequence[Any], layers: Sequence[Layer], n: int) -> bool:
    """Make `layers` (n tokens) the caches' contents; False when they do not fit."""
    if len(layers) != len(caches):
        return False
    for c, (k, v) in zip(caches, layers, strict=True):
        quantized = hasattr(c, "bits")
        if not hasattr(c, "offset") or k[0].shape[2] != n or quantized != (len(k) == 3):
            return False
        # the cache writes past n into new arrays (it grows by concatenation when full)
        c.keys, c.values = (k, v) if quantized else (k[0], v[0])
        c.offset = n
    return True


def copy(dst: Sequence[Any], src: Sequence[Any], n: int) -> bool:
    """Make each layer of `dst` hold the first n tokens of `src`'s."""
    for mine, theirs in zip(dst, src, strict=True):
        if not hasattr(theirs, "offset") or theirs.keys is None:
            return False
        mine.keys = _shaped(cut(theirs.keys, n), theirs.keys)
        mine.values = _shaped(cut(theirs.values, n), theirs.values)
        mine.offset = n
    return True


def dump(layers: Sequence[Layer]) -> bytes:
    """Layers as bytes: a header (magic, layer count, arrays per side), then each array's
    dtype, shape and raw little-endian bits."""
    import numpy as np

    if not layers:
        return b""
    per_side = len(layers[0][0])
    parts = [struct.pack("<4sII", _MAGIC, len(layers), per_side)]
    for k, v in layers:
        for a in (*k, *v):
            shape = (*a.shape, 0, 0, 0, 0)[:4]
            parts.append(struct.pack(_ARRAY, str(a.dtype).encode(), a.ndim, *shape))
            raw = _RAW[a.itemsize]
            parts.append(np.asarray(a.view(getattr(_mx(), raw))).tobytes())
    return b"".join(parts)


def undump(data: bytes, n_tokens: int, n_layers: int) -> list[Layer]:
    """The inverse of dump; ValueError when the bytes are not n_layers layers of n_tokens."""
    import numpy as np

    mx = _mx()
    try:
        magic, count, per_side = struct.unpack_from("<4sII", data)
    except struct.error:
        raise ValueError("too short for a KV state") from None
    if magic != _MAGIC or per_side not in (1, 3):
        raise ValueError("not a KV state")
    if count != n_layers:
        raise ValueError(f"{count} layers, the model has {n_layers}")
    off = struct.calcsize("<4sII")
    head = struct.calcsize(_ARRAY)
    layers: list[Layer] = []
    for _ in range(count):
        sides = []
        for _side in range(2):
            items = []
            for _j in range(per_side):
                try:
                    name, ndim, *dims = struct.unpack_from(_ARRAY, data, off)
                except struct.error:
                    raise ValueError("a KV state cut short") from None
                off += head
                dtype = getattr(mx, name.rstrip(b"\0").decode().removeprefix("mlx.core."), None)
                shape = tuple(dims[:ndim])
                if dtype is None or ndim != 4 or shape[2] != n_tokens:
                    raise ValueError("not a KV state of these tokens")
                size = int(np.prod(shape)) * dtype.size
                if off + size > len(data):
                    raise ValueError("a KV state cut short")
                flat = np.frombuffer(
                    data, dtype=np.dtype(f"<u{dtype.size}"), count=size // dtype.size, offset=off
                )
                raw = getattr(mx, _RAW[dtype.size])
                items.append(mx.array(flat).view(raw).view(dtype).reshape(shape))
                off += size
            sides.append(tuple(items))
        layers.append((sides[0], sides[1]))
    if off != len(data):
        raise ValueError(f"{len(data) - off} bytes after the last layer")
    mx.eval(layers)
    return layers


def _mx() -> Any:
    import mlx.core as mx

    return mx
