"""GGUF to MLX import: `localllm convert MODEL --to mlx`.

`mlx.core.load` reads Q4_0, Q4_1 and Q8_0 tensors straight into MLX's affine
quantized layout (weights, scales, biases) and F16/F32 as they are, so an
import copies weights without requantizing them. The rest is translation:
GGUF tensor names to mlx-lm's, the GGUF hyperparameters to an mlx-lm
config.json, and the GGUF vocabulary, merges and special tokens to a
tokenizer.json. llama.cpp's converter stores the query and key projections
permuted for interleaved rotary embeddings, so the config sets
`rope_traditional` (MLX's interleaved rotation) instead of permuting back.

The result is written to a hidden folder in the store and renamed into place
only when complete, with `localllm.json` recording where it came from.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from localllm.backends.base import ModelRef
from localllm.errors import BackendUnavailable, ImportFailed
from localllm.models.gguf import GGUFMeta, read_gguf
from localllm.provenance import PROVENANCE, read_provenance

IMPORTER_VERSION = 1
SUPPORTED_ARCHS = ("llama",)
NATIVE_TYPES = ("F32", "F16", "BF16", "Q4_0", "Q4_1", "Q8_0")  # what mx.load keeps as is

_LAYER_TENSORS = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_TOP_TENSORS = {
    "token_embd": "model.embed_tokens",
    "output_norm": "model.norm",
    "output": "lm_head",
}
_PARTS = ("weight", "scales", "biases", "bias")
_LAYER_NAME = re.compile(r"^blk\.(\d+)\.([a-z_]+)\.([a-z]+)$")
_TOP_NAME = re.compile(r"^([a-z_]+)\.([a-z]+)$")

# Pre-tokenizer regular expressions, by the GGUF's `tokenizer.ggml.pre`.
_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_PRE_GPT2 = ("default", "gpt-2", "gpt2")
_PRE_DIGITS = ("smollm", "starcoder", "refact")  # one digit per token, then GPT-2's split
_PRE_LLAMA3 = ("llama-bpe", "llama3")
# GGUF token types
_CONTROL, _USER_DEFINED = 3, 4


def import_name(ref: ModelRef) -> str:
    """The store name of a model's MLX import: `starter` -> `starter-mlx`."""
    return re.sub(r"[^A-Za-z0-9._-]+", "--", ref.name).strip("-") + "-mlx"


def source_identity(path: Path) -> dict[str, Any]:
    """What identifies the GGUF an import came from: its path, size and change time."""
    st = path.stat()
    return {"path": str(path.resolve()), "size": st.st_size, "mtime_ns": st.st_mtime_ns}


def find_import(models_dir: Path, gguf_path: Path) -> Path | None:
    """An existing, current MLX import of this GGUF in the store, if there is one."""
    if not models_dir.is_dir():
        return None
    try:
        wanted = source_identity(gguf_path)
    except OSError:
        return None
    for folder in sorted(models_dir.iterdir()):
        if folder.name.startswith(".") or not folder.is_dir():
            continue
        prov = read_provenance(folder)
        if (
            prov
            and prov.get("importer_version") == IMPORTER_VERSION
            and prov.get("source", {}).get("identity") == wanted
        ):
            return folder
    return None


def check_importable(meta: GGUFMeta) -> None:
    """Raise ImportFailed unless the header says the import can work (reads no weights)."""
    where = str(meta.path)
    if meta.truncated:
        raise ImportFailed(
            where,
            f"the file is truncated: its tensors need {meta.data_end} bytes, "
            f"the file has {meta.file_size}",
        )
    if meta.arch not in SUPPORTED_ARCHS:
        raise ImportFailed(
            where,
            f"the importer does not know the '{meta.arch}' architecture "
            f"(it knows: {', '.join(SUPPORTED_ARCHS)}); run it on llama.cpp instead",
        )
    foreign = sorted({t for _, t in meta.tensor_types if t not in NATIVE_TYPES})
    if foreign:
        raise ImportFailed(
            where,
            f"MLX cannot read {', '.join(foreign)} tensors as they are "
            f"(it reads {', '.join(NATIVE_TYPES)}); use a Q4_0, Q4_1, Q8_0 or F16 GGUF",
        )


def import_gguf(
    ref: ModelRef,
    models_dir: Path,
    *,
    name: str | None = None,
    progress: Callable[[float], None] | None = None,
) -> Path:
    """Import a GGUF into `models_dir/<name>` as an MLX model; return the folder.

    An import of the same unchanged file is reused. Nothing is left behind when
    any step fails.
    """
    report = progress or (lambda _f: None)
    meta = read_gguf(ref.path)
    check_importable(meta)
    existing = find_import(models_dir, ref.path)
    if existing is not None and (name is None or existing.name == name):
        report(1.0)
        return existing
    target = models_dir / (name or import_name(ref))
    if target.exists():
        raise ImportFailed(
            str(ref.path),
            f"{target} already exists and is not an import of this file; choose another --name",
        )
    try:
        import mlx.core as mx
    except ImportError:
        from localllm.backends import backend_hint

        raise BackendUnavailable("mlx", backend_hint("mlx")) from None

    from localllm.models.staging import CONVERT_PREFIX, staging_dir, sweep_stale

    sweep_stale(models_dir)  # a killed conversion's leftovers
    staging = staging_dir(models_dir, CONVERT_PREFIX, target.name)
    tmp = staging / "model"
    tmp.mkdir()
    try:
        report(0.05)
        try:
            loaded: Any = mx.load(str(ref.path), return_metadata=True)
            weights, fields = loaded
        except (RuntimeError, ValueError) as exc:
            raise ImportFailed(str(ref.path), f"MLX could not read its tensors ({exc})") from None
        report(0.4)
        mapped, quantized = _map_tensors(weights, str(ref.path))
        config = _config(fields, mapped, quantized, meta)
        mx.save_safetensors(str(tmp / "model.safetensors"), mapped, metadata={"format": "mlx"})
        report(0.8)
        _write_tokenizer(fields, tmp, meta)
        _write_json(tmp / "config.json", config)
        _write_json(
            tmp / PROVENANCE,
            {
                "importer_version": IMPORTER_VERSION,
                "format": "mlx",
                "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                "source": {
                    "name": ref.name,
                    "format": "gguf",
                    "quant": meta.quant,
                    "vocab_fingerprint": meta.vocab_fingerprint,
                    "identity": source_identity(ref.path),
                },
            },
        )
        os.replace(tmp, target)  # the store sees the model only now, complete
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    report(1.0)
    return target


def _write_json(path: Path, data: dict[str, Any]) -> None:
    path.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def _map_tensors(weights: dict[str, Any], source: str) -> tuple[dict[str, Any], bool]:
    """GGUF tensor names to mlx-lm's; also whether any tensor is quantized."""
    out: dict[str, Any] = {}
    quantized = False
    for gname, array in weights.items():
        layer = _LAYER_NAME.match(gname)
        top = None if layer else _TOP_NAME.match(gname)
        if layer and layer.group(2) in _LAYER_TENSORS and layer.group(3) in _PARTS:
            base = f"model.layers.{layer.group(1)}.{_LAYER_TENSORS[layer.group(2)]}"
            part = layer.group(3)
        elif top and top.group(1) in _TOP_TENSORS and top.group(2) in _PARTS:
            base, part = _TOP_TENSORS[top.group(1)], top.group(2)
        else:
            raise ImportFailed(source, f"tensor '{gname}' has no counterpart in an MLX llama")
        quantized = quantized or part == "scales"
        out[f"{base}.{part}"] = array
    return out, quantized


def _field(fields: dict[str, Any], key: str, default: Any = None) -> Any:
    value = fields.get(key, default)
    if hasattr(value, "item"):  # mx.load gives numbers as 0-d arrays
        value = value.item()
    return value


def _config(
    fields: dict[str, Any], mapped: dict[str, Any], quantized: bool, meta: GGUFMeta
) -> dict[str, Any]:
    arch = meta.arch

    def a(key: str, default: Any = None) -> Any:
        return _field(fields, f"{arch}.{key}", default)

    n_head = int(a("attention.head_count"))
    n_embd = int(a("embedding_length"))
    config: dict[str, Any] = {
        "model_type": arch,
        "architectures": ["LlamaForCausalLM"],
        "hidden_size": n_embd,
        "num_hidden_layers": int(a("block_count")),
        "intermediate_size": int(a("feed_forward_length")),
        "num_attention_heads": n_head,
        "num_key_value_heads": int(a("attention.head_count_kv", n_head)),
        "head_dim": int(a("attention.key_length", n_embd // n_head)),
        "rms_norm_eps": float(a("attention.layer_norm_rms_epsilon", 1e-5)),
        "vocab_size": len(fields.get("tokenizer.ggml.tokens") or []) or int(a("vocab_size")),
        "max_position_embeddings": int(a("context_length", 4096)),
        "rope_theta": float(a("rope.freq_base", 10000.0)),
        "rope_traditional": True,  # GGUF's permuted q/k projections
        "tie_word_embeddings": "lm_head.weight" not in mapped,
        "attention_bias": any(k.endswith("self_attn.q_proj.bias") for k in mapped),
        "mlp_bias": False,
    }
    scaling = _field(fields, f"{arch}.rope.scaling.type")
    if scaling == "linear":
        config["rope_scaling"] = {"type": "linear", "factor": float(a("rope.scaling.factor", 1))}
    elif scaling not in (None, "none"):
        raise ImportFailed(str(meta.path), f"rope scaling '{scaling}' is not supported by MLX")
    for key, gkey in (("bos_token_id", "bos_token_id"), ("eos_token_id", "eos_token_id")):
        value = _field(fields, f"tokenizer.ggml.{gkey}")
        if value is not None:
            config[key] = int(value)
    if quantized:
        # the default for layers the per-layer inference does not cover; each quantized
        # layer's own bits and group size are read back from its tensor shapes at load
        config["quantization"] = {"group_size": 32, "bits": 4}
    return config


def _pre_tokenizer(pre: str, source: str) -> Any:
    from tokenizers import Regex, pre_tokenizers

    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if pre in _PRE_GPT2:
        return byte_level
    if pre in _PRE_DIGITS:
        return pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
    if pre in _PRE_LLAMA3:
        return pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(_LLAMA3_SPLIT), behavior="isolated", invert=False),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )
    known = ", ".join((*_PRE_GPT2, *_PRE_DIGITS, *_PRE_LLAMA3))
    raise ImportFailed(source, f"its pre-tokenizer '{pre}' is not one the importer knows ({known})")


def _write_tokenizer(fields: dict[str, Any], folder: Path, meta: GGUFMeta) -> None:
    """tokenizer.json and tokenizer_config.json from the GGUF vocabulary."""
    source = str(meta.path)
    try:
        from tokenizers import AddedToken, Tokenizer, decoders
        from tokenizers.models import BPE
    except ImportError:
        from localllm.backends import backend_hint

        raise BackendUnavailable("mlx", backend_hint("mlx")) from None
    kind = _field(fields, "tokenizer.ggml.model")
    if kind != "gpt2":
        raise ImportFailed(
            source, f"its tokenizer '{kind}' cannot be rebuilt (byte-level BPE, 'gpt2', can)"
        )
    tokens: list[str] = list(fields["tokenizer.ggml.tokens"])
    raw_types: Any = fields.get("tokenizer.ggml.token_type")
    types = raw_types.tolist() if hasattr(raw_types, "tolist") else list(raw_types or [])
    merges = [tuple(m.split(" ", 1)) for m in fields.get("tokenizer.ggml.merges") or []]
    vocab: dict[str, int] = {}
    for i, text in enumerate(tokens):
        vocab.setdefault(text, i)
    tok = Tokenizer(BPE(vocab=vocab, merges=merges, fuse_unk=False))
    tok.pre_tokenizer = _pre_tokenizer(str(_field(fields, "tokenizer.ggml.pre", "default")), source)
    tok.decoder = decoders.ByteLevel()
    added = [
        AddedToken(tokens[i], special=t == _CONTROL, normalized=False)
        for i, t in enumerate(types)
        if t in (_CONTROL, _USER_DEFINED)
    ]
    tok.add_special_tokens([a for a in added if a.special])
    tok.add_tokens([a for a in added if not a.special])
    tok.save(str(folder / "tokenizer.json"))

    def token_text(key: str) -> str | None:
        idx = _field(fields, f"tokenizer.ggml.{key}")
        return tokens[int(idx)] if idx is not None and 0 <= int(idx) < len(tokens) else None

    config: dict[str, Any] = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": meta.n_ctx_train or 4096,
        "clean_up_tokenization_spaces": False,
        "add_bos_token": bool(_field(fields, "tokenizer.ggml.add_bos_token", False)),
        "add_eos_token": False,
    }
    for key, name in (
        ("bos_token", "bos_token_id"),
        ("eos_token", "eos_token_id"),
        ("unk_token", "unknown_token_id"),
        ("pad_token", "padding_token_id"),
    ):
        special = token_text(name)
        if special is not None:
            config[key] = special
    template = _field(fields, "tokenizer.chat_template")
    if template:
        config["chat_template"] = str(template)
    _write_json(folder / "tokenizer_config.json", config)


def ensure_import(
    ref: ModelRef, models_dir: Path, progress: Callable[[float], None] | None = None
) -> ModelRef:
    """The MLX ref for a GGUF (importing once), or the ref itself when it is MLX already."""
    if ref.format == "mlx":
        return ref
    folder = import_gguf(ref, models_dir, progress=progress)
    from localllm.models.store import dir_size

    return ModelRef(folder.name, folder, "mlx", "store", dir_size(folder))
