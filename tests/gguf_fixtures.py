"""Write GGUF variants of the starter model for cases the starter itself cannot show."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gguf


def copy_with_metadata(
    src: Path, dst: Path, extra: dict[str, Any], *, arch: str | None = None
) -> Path:
    """Copy a GGUF, adding or replacing integer/float/string key-values (weights unchanged);
    `arch` replaces general.architecture."""
    reader = gguf.GGUFReader(src, "r")
    arch = arch or str(reader.fields["general.architecture"].contents())
    writer = gguf.GGUFWriter(dst, arch=arch)
    for name, field in reader.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture" or name in extra:
            continue
        vtype = gguf.GGUFValueType(field.types[0])
        sub = gguf.GGUFValueType(field.types[1]) if vtype == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(name, field.contents(), vtype, sub_type=sub)
    for name, value in extra.items():
        if isinstance(value, list):
            writer.add_array(name, value)
            continue
        if isinstance(value, str):
            vtype = gguf.GGUFValueType.STRING
        elif isinstance(value, float):
            vtype = gguf.GGUFValueType.FLOAT32
        else:
            vtype = gguf.GGUFValueType.UINT32
        writer.add_key_value(name, value, vtype)
    for t in reader.tensors:
        # for quantized types the reader's data shape is in bytes, which the writer expects
        writer.add_tensor_info(t.name, t.data.shape, t.data.dtype, int(t.data.nbytes),
                               t.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for t in reader.tensors:
        writer.write_tensor_data(t.data)
    writer.close()
    return dst


def tiny_bert(
    dst: Path,
    *,
    pooling: int = 2,
    seed: int = 0,
    head: tuple[float, float] | None = None,
    poison: float | None = None,
) -> Path:
    """A two-layer BERT embedding model (32 wide) with random weights and a small
    WordPiece vocabulary, pooling CLS (2) by default: what llama.cpp needs to run the
    BERT family, for the embedding path's shape and pooling (not for quality).

    With `head` (scale, bias): a reranker (rank pooling, 4) with a classification head,
    a dense layer then one output whose weights are random times `scale` plus `bias`
    (scale 0: every pair scores exactly `bias`). With `poison` (NaN or infinity): the
    input norm's bias is that value, so every vector and score is not a finite number,
    as a damaged file's are."""
    if head is not None:
        pooling = 4
    import numpy as np

    rng = np.random.default_rng(seed)
    n_embd, n_ff, n_ctx, n_layer, n_head = 32, 64, 128, 2, 2
    words = ["the", "cat", "sat", "on", "mat", "dog", "ran", "code", "file"]
    letters = [chr(c) for c in range(ord("a"), ord("z") + 1)]
    # llama.cpp's WordPiece vocabulary: a word's start carries U+2581, "##" is dropped
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    vocab += ["\u2581" + w for w in words] + ["\u2581" + c for c in letters] + letters
    vocab += ["\u2581.", "\u2581,", "\u2581!", "\u2581?"]
    types = [gguf.TokenType.CONTROL] * 5 + [gguf.TokenType.NORMAL] * (len(vocab) - 5)
    w = gguf.GGUFWriter(dst, arch="bert")
    w.add_name("tiny-bert")
    w.add_context_length(n_ctx)
    w.add_embedding_length(n_embd)
    w.add_feed_forward_length(n_ff)
    w.add_block_count(n_layer)
    w.add_head_count(n_head)
    w.add_layer_norm_eps(1e-12)
    w.add_causal_attention(False)
    w.add_pooling_type(gguf.PoolingType(pooling))
    w.add_tokenizer_model("bert")
    w.add_token_list(vocab)
    w.add_token_types(types)
    w.add_token_type_count(2)
    w.add_bos_token_id(2)  # llama.cpp's WordPiece input: [CLS] (as BOS) ... [SEP]
    w.add_uint32("tokenizer.ggml.cls_token_id", 2)
    w.add_sep_token_id(3)
    w.add_unk_token_id(1)
    w.add_pad_token_id(0)
    w.add_mask_token_id(4)
    w.add_add_bos_token(True)
    w.add_add_eos_token(True)

    def t(name: str, *shape: int, scale: float = 0.2) -> None:
        w.add_tensor(name, (rng.standard_normal(shape) * scale).astype(np.float32))

    def ones(name: str, n: int) -> None:
        w.add_tensor(name, np.ones(n, dtype=np.float32))

    t("token_embd.weight", len(vocab), n_embd)
    t("token_types.weight", 2, n_embd)
    t("position_embd.weight", n_ctx, n_embd)
    ones("token_embd_norm.weight", n_embd)
    if poison is None:
        t("token_embd_norm.bias", n_embd, scale=0.0)
    else:
        w.add_tensor("token_embd_norm.bias", np.full(n_embd, poison, dtype=np.float32))
    for i in range(n_layer):
        for part in ("attn_q", "attn_k", "attn_v", "attn_output"):
            t(f"blk.{i}.{part}.weight", n_embd, n_embd)
            t(f"blk.{i}.{part}.bias", n_embd, scale=0.02)
        ones(f"blk.{i}.attn_output_norm.weight", n_embd)
        t(f"blk.{i}.attn_output_norm.bias", n_embd, scale=0.0)
        t(f"blk.{i}.ffn_up.weight", n_ff, n_embd)
        t(f"blk.{i}.ffn_up.bias", n_ff, scale=0.02)
        t(f"blk.{i}.ffn_down.weight", n_embd, n_ff)
        t(f"blk.{i}.ffn_down.bias", n_embd, scale=0.02)
        ones(f"blk.{i}.layer_output_norm.weight", n_embd)
        t(f"blk.{i}.layer_output_norm.bias", n_embd, scale=0.0)
    if head is not None:
        scale, bias = head
        t("cls.weight", n_embd, n_embd, scale=0.5)
        t("cls.bias", n_embd, scale=0.1)
        t("cls.output.weight", 1, n_embd, scale=scale)
        w.add_tensor("cls.output.bias", np.array([bias], dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return dst


def starter_lora(
    starter: Path,
    dst: Path,
    *,
    rank: int = 8,
    seed: int = 0,
    layers: int = 4,
    scale: float = 2.0,
    misfit: bool = False,
) -> Path:
    """A LoRA adapter for the starter with random weights: A and B for the attention query
    and feed-forward down projections of its first `layers` blocks, in llama.cpp's adapter
    layout (general.type "adapter", adapter.type "lora", `<tensor>.lora_a` of [n_in, r] and
    `.lora_b` of [r, n_out] in ggml's order). Large enough to change the starter's answer
    at scale 1; the numbers mean nothing. `misfit`: the feed-forward tensors are shaped
    for a model twice as wide (an adapter trained for another model)."""
    import numpy as np

    reader = gguf.GGUFReader(starter, "r")
    arch = str(reader.fields["general.architecture"].contents())
    shapes = {t.name: [int(n) for n in t.shape] for t in reader.tensors}  # ggml order
    rng = np.random.default_rng(seed)
    w = gguf.GGUFWriter(dst, arch=arch)
    w.add_type("adapter")
    w.add_string("adapter.type", "lora")
    w.add_float32("adapter.lora.alpha", float(rank))
    for i in range(layers):
        for part in ("attn_q", "ffn_down"):
            name = f"blk.{i}.{part}.weight"
            n_in, n_out = shapes[name][0], shapes[name][1]
            if misfit and part == "ffn_down":
                n_in *= 2
            a = rng.standard_normal((rank, n_in)) * scale / np.sqrt(n_in)
            b = rng.standard_normal((n_out, rank)) * scale
            w.add_tensor(f"{name}.lora_a", a.astype(np.float32))
            w.add_tensor(f"{name}.lora_b", b.astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return dst


def tiny_projector(dst: Path, *, text_embd: int = 576, seed: int = 0) -> Path:
    """A LLaVA-style vision projector (`mmproj`) of random weights for a text model of
    `text_embd` (the starter's 576): a one-block CLIP encoder on 32x32 images in 8x8
    patches, and the two-layer MLP (mm.0, mm.2) that maps each of its 16 patches to one
    embedding of the text model. Its answers are noise; libmtmd loads and runs it as it
    would a real LLaVA projector."""
    import numpy as np

    rng = np.random.default_rng(seed)
    embd, ff, image, patch, hidden = 32, 64, 32, 8, 64
    n_pos = (image // patch) ** 2 + 1  # the patches and the class embedding
    writer = _encoder_header(dst, "mlp", "vision", text_embd,
                             {"image_size": image, "patch_size": patch})
    writer.add_bool("clip.has_text_encoder", False)
    writer.add_bool("clip.use_gelu", True)
    writer.add_array("clip.vision.image_mean", [0.5, 0.5, 0.5])
    writer.add_array("clip.vision.image_std", [0.5, 0.5, 0.5])

    def weights(*shape: int, scale: float = 0.2) -> Any:
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    def ones(n: int) -> Any:
        return np.ones(n, dtype=np.float32)

    def zeros(n: int) -> Any:
        return np.zeros(n, dtype=np.float32)

    tensors: dict[str, Any] = {
        "v.patch_embd.weight": weights(embd, 3, patch, patch).astype(np.float16),
        "v.class_embd": weights(embd),
        "v.position_embd.weight": weights(n_pos, embd),
        "v.pre_ln.weight": ones(embd),
        "v.pre_ln.bias": zeros(embd),
        "mm.0.weight": weights(hidden, embd).astype(np.float16),
        "mm.0.bias": zeros(hidden),
        "mm.2.weight": weights(text_embd, hidden).astype(np.float16),
        "mm.2.bias": zeros(text_embd),
    }
    tensors |= _encoder_block("v.blk.0", embd, ff, weights, k_bias=True)
    return _written(writer, tensors, dst)


def noise_png(width: int = 48, height: int = 40, seed: int = 0) -> bytes:
    """A PNG of random pixels (each seed a different picture)."""
    import io

    import numpy as np
    from PIL import Image

    pixels = (np.random.default_rng(seed).random((height, width, 3)) * 255).astype(np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, "PNG")
    return out.getvalue()


def vision_folder(root: Path, name: str = "seer") -> Path:
    """A store folder holding the starter (linked) and a tiny projector beside it: a model
    that reads images (its answers are noise)."""
    from localllm.models.starter import starter_path

    starter = starter_path()
    assert starter is not None
    folder = root / name
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "SmolLM2-135M-Instruct.Q4_1.gguf").symlink_to(starter)
    tiny_projector(folder / "mmproj-seer-f16.gguf")
    return folder


def tiny_llava_mlx(dst: Path, tokenizer_from: Path, seed: int = 0) -> Path:
    """An MLX LLaVA folder of random weights, as mlx-vlm loads it: a two-layer Llama text
    model on the starter's tokenizer (plus an `<image>` token), a two-layer CLIP vision
    tower on 32x32 images in 8x8 patches (16 image tokens), and LLaVA's projector; the
    processor files transformers reads (LlavaProcessor, CLIPImageProcessor). Its answers
    are noise; mlx-vlm loads and runs it as it would a real LLaVA."""
    import json

    import mlx.core as mx
    from mlx.utils import tree_flatten
    from mlx_vlm.models.llava import Model, ModelConfig
    from mlx_vlm.models.llava.config import TextConfig, VisionConfig
    from tokenizers import AddedToken, Tokenizer

    dst.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer.from_file(str(tokenizer_from / "tokenizer.json"))
    tok.add_special_tokens([AddedToken("<image>", special=True, normalized=False)])
    image_id = tok.token_to_id("<image>")
    assert image_id is not None
    tok.save(str(dst / "tokenizer.json"))
    tc = json.loads((tokenizer_from / "tokenizer_config.json").read_text())
    tc.setdefault("added_tokens_decoder", {})[str(image_id)] = {
        "content": "<image>", "lstrip": False, "normalized": False, "rstrip": False,
        "single_word": False, "special": True}
    tc["processor_class"] = "LlavaProcessor"
    (dst / "tokenizer_config.json").write_text(json.dumps(tc))
    text = {"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2,
            "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2,
            "vocab_size": image_id + 1, "rms_norm_eps": 1e-5, "max_position_embeddings": 2048,
            "tie_word_embeddings": False}
    vision = {"model_type": "clip_vision_model", "hidden_size": 32, "num_hidden_layers": 2,
              "intermediate_size": 64, "num_attention_heads": 2, "image_size": 32,
              "patch_size": 8, "projection_dim": 32}
    config = {"model_type": "llava", "image_token_index": image_id, "vocab_size": image_id + 1,
              "vision_feature_select_strategy": "default", "vision_feature_layer": -2,
              "eos_token_id": [2], "text_config": text, "vision_config": vision}
    (dst / "config.json").write_text(json.dumps(config))
    (dst / "preprocessor_config.json").write_text(json.dumps({
        "image_processor_type": "CLIPImageProcessor", "size": {"shortest_edge": 32},
        "crop_size": {"height": 32, "width": 32}, "do_resize": True, "do_center_crop": True,
        "do_normalize": True, "do_rescale": True, "rescale_factor": 1 / 255,
        "do_convert_rgb": True, "resample": 3, "image_mean": [0.5] * 3, "image_std": [0.5] * 3}))
    (dst / "processor_config.json").write_text(json.dumps({
        "processor_class": "LlavaProcessor", "patch_size": 8, "image_token": "<image>",
        "vision_feature_select_strategy": "default", "num_additional_image_tokens": 1}))
    mx.random.seed(seed)
    mc = ModelConfig.from_dict(config)
    mc.text_config = TextConfig.from_dict(text)
    mc.vision_config = VisionConfig.from_dict(vision)
    weights = dict(tree_flatten(Model(mc).parameters()))
    mx.save_safetensors(str(dst / "model.safetensors"), weights)
    return dst


def tiny_audio_projector(dst: Path, *, text_embd: int = 576, seed: int = 0) -> Path:
    """A Qwen2-Audio-style projector (`mmproj`) of random weights for a text model of
    `text_embd`: a one-block Whisper encoder on 128 mel bins and the linear layer that
    maps each of its frames to an embedding of the text model. libmtmd computes the mel
    spectrogram, encodes and projects as for the real Qwen2-Audio; the answers are noise."""
    import numpy as np

    rng = np.random.default_rng(seed)
    embd, ff, mels, n_pos = 32, 64, 128, 1500
    writer = _encoder_header(dst, "qwen2a", "audio", text_embd, {"num_mel_bins": mels})
    writer.add_bool("clip.has_vision_encoder", False)

    def weights(*shape: int, scale: float = 0.2) -> Any:
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    tensors: dict[str, Any] = {
        "a.conv1d.1.weight": weights(embd, mels, 3).astype(np.float16),
        "a.conv1d.1.bias": weights(embd, 1),
        "a.conv1d.2.weight": weights(embd, embd, 3).astype(np.float16),
        "a.conv1d.2.bias": weights(embd, 1),
        "a.position_embd.weight": weights(n_pos, embd),
        "a.post_ln.weight": np.ones(embd, dtype=np.float32),
        "a.post_ln.bias": np.zeros(embd, dtype=np.float32),
        "mm.a.fc.weight": weights(text_embd, embd).astype(np.float16),
        "mm.a.fc.bias": np.zeros(text_embd, dtype=np.float32),
    }
    # Whisper's key projection has no bias
    tensors |= _encoder_block("a.blk.0", embd, ff, weights, k_bias=False)
    return _written(writer, tensors, dst)


_ENCODER = {"embedding_length": 32, "feed_forward_length": 64, "block_count": 1,
            "attention.head_count": 2}


def _encoder_header(dst: Path, projector: str, modality: str, text_embd: int,
                    extra: dict[str, int]) -> Any:
    """A projector GGUF's writer with the keys of a one-block encoder of `modality`."""
    writer = gguf.GGUFWriter(dst, arch="clip")
    writer.add_string("general.name", f"tiny-{projector}-projector")
    writer.add_string("clip.projector_type", projector)
    writer.add_bool(f"clip.has_{modality}_encoder", True)
    for key, value in {**_ENCODER, "projection_dim": text_embd, **extra}.items():
        writer.add_uint32(f"clip.{modality}.{key}", value)
    writer.add_float32(f"clip.{modality}.attention.layer_norm_epsilon", 1e-5)
    return writer


def _encoder_block(block: str, embd: int, ff: int, weights: Any, *, k_bias: bool) -> dict:
    """One transformer block of a projector's encoder: attention, feed-forward, norms."""
    import numpy as np

    out: dict[str, Any] = {}
    for name in ("attn_q", "attn_k", "attn_v", "attn_out"):
        out[f"{block}.{name}.weight"] = weights(embd, embd).astype(np.float16)
        if name != "attn_k" or k_bias:
            out[f"{block}.{name}.bias"] = np.zeros(embd, dtype=np.float32)
    out[f"{block}.ffn_up.weight"] = weights(ff, embd).astype(np.float16)
    out[f"{block}.ffn_up.bias"] = np.zeros(ff, dtype=np.float32)
    out[f"{block}.ffn_down.weight"] = weights(embd, ff).astype(np.float16)
    out[f"{block}.ffn_down.bias"] = np.zeros(embd, dtype=np.float32)
    for norm in ("ln1", "ln2"):
        out[f"{block}.{norm}.weight"] = np.ones(embd, dtype=np.float32)
        out[f"{block}.{norm}.bias"] = np.zeros(embd, dtype=np.float32)
    return out


def _written(writer: Any, tensors: dict[str, Any], dst: Path) -> Path:
    for name, data in tensors.items():
        writer.add_tensor(name, data)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return dst


def tone_wav(seconds: float = 1.0, hz: float = 440.0, rate: int = 16000) -> bytes:
    """A WAV file of a sine tone (16-bit mono)."""
    import io
    import wave

    import numpy as np

    t = np.arange(int(seconds * rate)) / rate
    samples = (np.sin(2 * np.pi * hz * t) * 0.3 * 32767).astype("<i2")
    out = io.BytesIO()
    with wave.open(out, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(samples.tobytes())
    return out.getvalue()
