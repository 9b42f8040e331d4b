"""GGUF header metadata, read with the `gguf` package without loading any weights."""

from __future__ import annotations

import json
import logging
import mmap
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from localllm.backends.common import fim_ids_from_tokens, vocab_fingerprint
from localllm.errors import DamagedModel, ModelLoadError

log = logging.getLogger(__name__)

GGUF_MAGIC = b"GGUF"


RANK_POOLING = 4  # llama.h's LLAMA_POOLING_TYPE_RANK


@dataclass(frozen=True, slots=True)
class GGUFMeta:
    path: Path
    file_size: int
    arch: str
    name: str
    params: int
    quant: str
    n_ctx_train: int
    n_layers: int
    n_embd: int
    n_head: int
    n_head_kv: int
    vocab_size: int
    chat_template: str | None
    fim_ids: tuple[int, int, int] | None
    vocab_fingerprint: str
    tensor_types: tuple[tuple[str, str], ...] = ()  # (tensor name, GGML type name)
    tensor_shapes: tuple[tuple[int, int], ...] = ()  # (row length, elements), as tensor_types
    data_start: int = 0  # the byte offset where tensor data begins (the header's size)
    data_end: int = 0  # the byte offset where the last tensor's data ends
    # the sampling its makers recommend, as SamplingParams fields (GGUF general.sampling.*,
    # an MLX folder's generation_config.json)
    sampling: tuple[tuple[str, float], ...] = ()
    pooling: int = 0  # llama.cpp's pooling type ({arch}.pooling_type): 4 is a reranker's

    @property
    def reranker(self) -> bool:
        return self.pooling == RANK_POOLING

    @property
    def truncated(self) -> bool:
        return self.data_end > self.file_size

    @property
    def has_fim(self) -> bool:
        return self.fim_ids is not None

    @property
    def kv_bytes_per_token(self) -> int:
        """KV cache bytes per token at f16: 2 (K and V) x layers x KV heads x head dim x 2."""
        head_dim = self.n_embd // self.n_head if self.n_head else 0
        return 2 * self.n_layers * self.n_head_kv * head_dim * 2


def is_gguf(path: Path) -> bool:
    """True when the file starts with the GGUF magic."""
    try:
        with path.open("rb") as fh:
            return fh.read(4) == GGUF_MAGIC
    except OSError:
        return False


class _Header:
    """A single forward pass over the GGUF header (key/values and tensor infos).

    gguf.GGUFReader builds a numpy view for every vocabulary entry, which takes
    seconds on a 49k-token vocabulary; listing models must not. This reads the same
    layout with `struct`, using the gguf package's type codes.
    """

    def __init__(self, data: memoryview) -> None:
        self.data = data
        self.pos = 0

    def take(self, fmt: str) -> Any:
        value = struct.unpack_from(fmt, self.data, self.pos)[0]
        self.pos += struct.calcsize(fmt)
        return value

    def string(self) -> str:
        n = self.take("<Q")
        raw = bytes(self.data[self.pos : self.pos + n])
        if len(raw) != n:
            raise ValueError("string runs past the end of the file")
        self.pos += n
        return raw.decode("utf-8", "replace")

    def value(self, vtype: int, *, keep: bool = True) -> Any:
        if vtype == _STRING:
            return self.string() if keep else self.skip_string()
        if vtype == _ARRAY:
            etype, count = self.take("<I"), self.take("<Q")
            left = len(self.data) - self.pos
            if count > left:  # every element takes at least a byte
                raise ValueError(f"an array of {count} entries in the {left} bytes left")
            if etype == _ARRAY:
                raise ValueError("an array of arrays (no metadata localllm reads has one)")
            if not keep:
                if etype in _SCALARS:
                    self.pos += struct.calcsize(_SCALARS[etype]) * count
                    if self.pos > len(self.data):
                        raise ValueError("an array runs past the end of the file")
                else:
                    for _ in range(count):
                        self.value(etype, keep=False)
                return None
            if count > MAX_ARRAY:
                raise ValueError(f"an array of {count} entries (at most {MAX_ARRAY} are read)")
            return [self.value(etype) for _ in range(count)]
        fmt = _SCALARS.get(vtype)
        if fmt is None:
            raise ValueError(f"unknown GGUF value type {vtype}")
        return self.take(fmt)

    def skip_string(self) -> None:
        self.pos += 8 + struct.unpack_from("<Q", self.data, self.pos)[0]
        if self.pos > len(self.data):
            raise ValueError("string runs past the end of the file")


_STRING, _ARRAY = 8, 9  # gguf.GGUFValueType.STRING / ARRAY
MAX_ARRAY = 1 << 20  # entries of a kept array (a vocabulary): more is a damaged file


_SCALARS = {
    0: "<B",
    1: "<b",
    2: "<H",
    3: "<h",
    4: "<I",
    5: "<i",
    6: "<f",
    7: "<?",
    10: "<Q",
    11: "<q",
    12: "<d",
}


@dataclass(frozen=True, slots=True)
class _Tensor:
    name: str
    count: int  # elements
    row: int  # elements in the first dimension (a row)
    ttype: int  # GGML type code
    offset: int  # from the start of the data section


def _parse(data: memoryview) -> tuple[dict[str, Any], list[_Tensor], int]:
    """Key/values, the tensor infos and where the data section starts."""
    h = _Header(data)
    if bytes(data[:4]) != GGUF_MAGIC:
        raise ValueError("missing GGUF magic")
    h.pos = 4
    version = h.take("<I")
    if version < 2:
        raise ValueError(f"GGUF version {version} is too old (2 or newer is supported)")
    n_tensors, n_kv = h.take("<Q"), h.take("<Q")
    fields: dict[str, Any] = {}
    arch = ""
    for _ in range(n_kv):
        key = h.string()
        vtype = h.take("<I")
        keep = _wanted(key, arch)
        value = h.value(vtype, keep=keep)
        if keep:
            fields[key] = value
            if key == "general.architecture" and isinstance(value, str):
                arch = value
    tensors = []
    for _ in range(n_tensors):
        name = h.string()
        n_dims = h.take("<I")
        if n_dims > MAX_DIMS:
            raise ValueError(f"tensor {name[:80]!r} has {n_dims:,} dimensions (at most {MAX_DIMS})")
        dims = [h.take("<Q") for _ in range(n_dims)]
        count = 1
        for d in dims:
            count *= d
        ttype = h.take("<I")
        tensors.append(_Tensor(name, count, dims[0] if dims else 1, ttype, h.take("<Q")))
    align = _typed(fields, "general.alignment", int, 32)
    if align < 1 or align & (align - 1):
        raise ValueError(f"general.alignment is {align}, not a power of two")
    return fields, tensors, -(-h.pos // align) * align


def _wanted(key: str, arch: str) -> bool:
    """The metadata localllm reads; everything else is skipped without building objects
    (a file may carry arrays of any size)."""
    if key.startswith("general."):
        return True
    if arch and key.startswith(arch + "."):
        return True
    return key in _KEEP or (key.startswith("tokenizer.ggml.") and key.endswith("_token_id"))


_KEEP = ("tokenizer.ggml.tokens", "tokenizer.chat_template")


def _typed(fields: dict[str, Any], key: str, kind: type, default: Any) -> Any:
    """A metadata value of the type it must have, or ValueError naming the key."""
    value = fields.get(key)
    if value is None:
        return default
    ok = isinstance(value, kind) and not (kind is int and isinstance(value, bool))
    if kind is float and isinstance(value, int):
        ok = True
    if not ok:
        raise ValueError(f"{key} is {_kind(value)}, expected {_KIND_NAMES.get(kind, kind)}")
    return value


def _kind(value: Any) -> str:
    if isinstance(value, list):
        return f"a list of {len(value)}"
    return {str: "a string", int: "an integer", float: "a number", bool: "a boolean"}.get(
        type(value), type(value).__name__
    )


_KIND_NAMES = {int: "an integer", str: "a string", list: "a list", float: "a number"}
MAX_CTX = 2**31 - 1
MAX_DIMS = 4  # ggml's tensors have at most four dimensions


def _type_name(ttype: int) -> str:
    import gguf

    try:
        return gguf.GGMLQuantizationType(ttype).name
    except ValueError:
        return f"type {ttype}"


def _data_end(tensors: list[_Tensor], data_start: int) -> int:
    """Where the tensor data must end, from each tensor's type and element count."""
    import gguf

    end = data_start
    for t in tensors:
        try:
            block, size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType(t.ttype)]
        except (ValueError, KeyError):
            continue  # a type this gguf package does not know: not counted
        end = max(end, data_start + t.offset + t.count // block * size)
    return end


def _quant_name(file_type: int | None, tensor_types: list[int]) -> str:
    import gguf

    if file_type is not None:
        try:
            name = gguf.LlamaFileType(int(file_type)).name
            return name.removeprefix("MOSTLY_").removeprefix("ALL_")
        except ValueError:
            pass
    if not tensor_types:
        return "unknown"
    # no file_type: the most common tensor type is the best description
    common = max(set(tensor_types), key=tensor_types.count)
    return _type_name(common)


def _fim_ids(fields: dict[str, Any], tokens: list[str]) -> tuple[int, int, int] | None:
    keys = (
        "tokenizer.ggml.fim_pre_token_id",
        "tokenizer.ggml.fim_suf_token_id",
        "tokenizer.ggml.fim_mid_token_id",
    )
    pre, suf, mid = (fields.get(k) for k in keys)
    if pre is not None and suf is not None and mid is not None:
        return (int(pre), int(suf), int(mid))
    return fim_ids_from_tokens(tokens)


def _header(path: Path) -> tuple[dict[str, Any], list[_Tensor], int]:
    """A GGUF file's parsed header; DamagedModel when it is not a valid GGUF."""
    if not is_gguf(path):
        raise DamagedModel(str(path), "not a GGUF file (the first 4 bytes are not 'GGUF')")
    try:
        with path.open("rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as mm:
            view = memoryview(mm)
            try:
                return _parse(view)
            finally:
                view.release()
    except (ValueError, struct.error, OSError, UnicodeDecodeError) as exc:
        raise DamagedModel(str(path), f"damaged GGUF header ({exc})") from None


def read_gguf(path: Path) -> GGUFMeta:
    """Parse the header of a GGUF file; raise DamagedModel when it is not a valid GGUF."""
    path = Path(path)
    fields, tensors, data_start = _header(path)
    try:
        return _meta(path, fields, tensors, data_start)
    except (ValueError, struct.error, OSError, UnicodeDecodeError) as exc:
        raise DamagedModel(str(path), f"damaged GGUF header ({exc})") from None


def projector_kinds(path: Path) -> frozenset[str]:
    """What a projector (mmproj) GGUF encodes: "image", "audio"; DamagedModel when its
    header is not a GGUF's, empty when it is not a projector."""
    fields, _tensors, _start = _header(Path(path))
    out = set()
    if fields.get("clip.has_vision_encoder"):
        out.add("image")
    if fields.get("clip.has_audio_encoder"):
        out.add("audio")
    return frozenset(out)


# GGUF's recommended-sampling keys (llama.cpp reads the same), as SamplingParams fields
GGUF_SAMPLING = {
    "general.sampling.temp": "temperature",
    "general.sampling.top_k": "top_k",
    "general.sampling.top_p": "top_p",
    "general.sampling.min_p": "min_p",
    "general.sampling.penalty_repeat": "repeat_penalty",
}
# generation_config.json's names for the same
HF_SAMPLING = {
    "temperature": "temperature",
    "top_k": "top_k",
    "top_p": "top_p",
    "min_p": "min_p",
    "repetition_penalty": "repeat_penalty",
}


def _sampling(values: dict[str, Any], names: dict[str, str]) -> tuple[tuple[str, float], ...]:
    """The recommended values that are numbers in range; anything else is left out (a
    model with an odd recommendation still loads, with localllm's defaults there)."""
    limits = {
        "temperature": (0.0, 2.0),
        "top_p": (0.0, 1.0),
        "min_p": (0.0, 1.0),
        "top_k": (0, 1 << 20),
        "repeat_penalty": (0.0, 10.0),
    }
    out = []
    for key, field in names.items():
        value = values.get(key)
        if isinstance(value, bool) or not isinstance(value, int | float):
            continue
        low, high = limits[field]
        if low <= value <= high:
            out.append((field, float(value)))
    return tuple(out)


def _meta(path: Path, fields: dict[str, Any], tensors: list[_Tensor], data_start: int) -> GGUFMeta:
    """The header's description, each value checked for its type and range."""
    arch = _typed(fields, "general.architecture", str, "unknown")

    def arch_int(key: str, default: int = 0) -> int:
        full = f"{arch}.{key}"
        v = fields.get(full)
        if isinstance(v, list):  # per-layer arrays: the first layer describes the model
            v = v[0] if v else default
        if v is None:
            return default
        if not isinstance(v, int) or isinstance(v, bool):
            raise ValueError(f"{full} is {_kind(v)}, expected an integer")
        if not 0 <= v <= MAX_CTX:
            raise ValueError(f"{full} is {v}, out of range (0 to {MAX_CTX})")
        return v

    tokens = _typed(fields, "tokenizer.ggml.tokens", list, [])
    if not all(isinstance(t, str) for t in tokens):
        raise ValueError("tokenizer.ggml.tokens has entries that are not strings")
    template = _typed(fields, "tokenizer.chat_template", str, None)
    name = _typed(fields, "general.name", str, path.stem)
    file_type = _typed(fields, "general.file_type", int, None)
    n_head = arch_int("attention.head_count")
    return GGUFMeta(
        path=path,
        file_size=path.stat().st_size,
        arch=arch,
        name=name or path.stem,
        params=sum(t.count for t in tensors),
        quant=_quant_name(file_type, [t.ttype for t in tensors]),
        n_ctx_train=arch_int("context_length"),
        n_layers=arch_int("block_count"),
        n_embd=arch_int("embedding_length"),
        n_head=n_head,
        n_head_kv=arch_int("attention.head_count_kv", n_head),
        vocab_size=len(tokens),
        chat_template=template,
        fim_ids=_fim_ids(fields, tokens),
        vocab_fingerprint=vocab_fingerprint(tokens),
        tensor_types=tuple((t.name, _type_name(t.ttype)) for t in tensors),
        tensor_shapes=tuple((t.row, t.count) for t in tensors),
        data_start=data_start,
        data_end=_data_end(tensors, data_start),
        sampling=_sampling(fields, GGUF_SAMPLING),
        pooling=arch_int("pooling_type"),
    )


ModelMeta = GGUFMeta  # the same description for MLX folders (see read_mlx_dir)


def _safetensors_header(path: Path) -> dict[str, Any]:
    with path.open("rb") as fh:
        (n,) = struct.unpack("<Q", fh.read(8))
        if n > 100 * 1024 * 1024:
            raise ValueError(f"a safetensors header of {n} bytes")
        header = json.loads(fh.read(n))
    return header if isinstance(header, dict) else {}


def capabilities(
    meta: ModelMeta, fmt: str = "gguf", media: frozenset[str] = frozenset()
) -> list[str]:
    """Every model can call tools here (a template without tools gets the generic format);
    fill-in-the-middle where the vocabulary has the tokens; embeddings on llama.cpp; a
    reranker (rank pooling) only ranks; vision and audio where its projector reads them
    (Ollama's words)."""
    if meta.reranker:
        return ["rerank"]
    out = ["completion", "tools"]
    if "image" in media:
        out.append("vision")
    if "audio" in media:
        out.append("audio")
    if meta.fim_ids:
        out.append("insert")
    if fmt == "gguf":
        out.append("embedding")
    return out


def read_mlx_dir(path: Path) -> ModelMeta:
    """Describe an MLX model folder from config.json, tokenizer.json and the safetensors headers."""
    path = Path(path)
    try:
        config = json.loads((path / "config.json").read_text(encoding="utf-8"))
        config = config.get("text_config", config) | {
            k: v for k, v in config.items() if k != "text_config"
        }
        files = sorted(path.glob("model*.safetensors"))
        headers = [_safetensors_header(f) for f in files]
    except (OSError, ValueError, struct.error) as exc:
        raise ModelLoadError(str(path), f"not a readable MLX model folder ({exc})") from None
    quant = config.get("quantization") or {}
    bits = int(quant.get("bits") or 16) if isinstance(quant, dict) else 16
    group = int(quant.get("group_size") or 64) if isinstance(quant, dict) else 64
    params = 0
    for header in headers:
        for name, t in header.items():
            if name == "__metadata__" or not name.endswith(".weight"):
                continue
            shape = [int(d) for d in t.get("shape", [])]
            scales = header.get(name.removesuffix(".weight") + ".scales")
            if scales and shape:  # quantized: rows x (groups x group size) weights
                shape = [*shape[:-1], int(scales["shape"][-1]) * group]
            count = 1
            for dim in shape:
                count *= dim
            params += count
    tokens: list[str] = []
    try:
        tok = json.loads((path / "tokenizer.json").read_text(encoding="utf-8"))
        by_id = {int(i): t for t, i in (tok.get("model", {}).get("vocab") or {}).items()}
        by_id.update({int(a["id"]): a["content"] for a in tok.get("added_tokens", [])})
        tokens = [by_id.get(i, "") for i in range(max(by_id) + 1)] if by_id else []
    except (OSError, ValueError, KeyError, TypeError):
        pass
    template = None
    try:
        tc = json.loads((path / "tokenizer_config.json").read_text(encoding="utf-8"))
        template = tc.get("chat_template") if isinstance(tc.get("chat_template"), str) else None
    except (OSError, ValueError):
        pass
    if template is None and (path / "chat_template.jinja").is_file():
        template = (path / "chat_template.jinja").read_text(encoding="utf-8")
    sampling: tuple[tuple[str, float], ...] = ()
    try:
        generation = json.loads((path / "generation_config.json").read_text(encoding="utf-8"))
        if isinstance(generation, dict) and generation.get("do_sample") is not False:
            sampling = _sampling(generation, HF_SAMPLING)
    except (OSError, ValueError):
        pass
    from localllm.provenance import imported_quant  # it reads GGUF headers with this module

    n_head = int(config.get("num_attention_heads") or 0)
    hidden = int(config.get("hidden_size") or 0)
    quant_name = imported_quant(path) or (
        f"mlx-{bits}bit (group {quant.get('group_size')})"
        if isinstance(quant, dict) and quant
        else str(config.get("torch_dtype") or "float16").upper()
    )
    return ModelMeta(
        path=path,
        file_size=sum(f.stat().st_size for f in files),
        arch=str(config.get("model_type") or "unknown"),
        name=path.name,
        params=params,
        quant=str(quant_name),
        n_ctx_train=int(config.get("max_position_embeddings") or 0),
        n_layers=int(config.get("num_hidden_layers") or 0),
        n_embd=int(config.get("head_dim") or 0) * n_head or hidden,
        n_head=n_head,
        n_head_kv=int(config.get("num_key_value_heads") or n_head),
        vocab_size=len(tokens) or int(config.get("vocab_size") or 0),
        chat_template=template,
        fim_ids=fim_ids_from_tokens(tokens),
        vocab_fingerprint=vocab_fingerprint(tokens),
        sampling=sampling,
    )


def read_meta(path: Path, fmt: str) -> ModelMeta:
    """The header description of a GGUF file or an MLX folder."""
    return read_mlx_dir(path) if fmt == "mlx" else read_gguf(path)
