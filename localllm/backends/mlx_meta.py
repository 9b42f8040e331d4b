"""What the MLX backend reads from a model folder besides the weights: the tokenizer's
byte table, its configuration files, the end-of-turn names and the quantization label."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

# Names that end a turn in common chat formats; added tokens with these names stop
# generation like the configured end-of-sequence ids (llama.cpp does the same).
EOG_NAMES = (
    "<|endoftext|>",
    "<|im_end|>",
    "<|eot_id|>",
    "<|end_of_text|>",
    "<|end|>",
    "<end_of_turn>",
    "<|return|>",
    "</s>",
    # a repository marker starts a new file in code models; llama.cpp ends there too
    "<|fim_repo|>",
    "<|repo_name|>",
    "<reponame>",
)


def gpt2_byte_decoder() -> dict[str, int]:
    """The inverse of GPT-2's byte-to-printable-character table used by byte-level BPE."""
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("\u00a1"), ord("\u00ac") + 1),
        *range(ord("\u00ae"), ord("\u00ff") + 1),
    ]
    table, extra = {}, 0
    for b in range(256):
        if b in printable:
            table[chr(b)] = b
        else:
            table[chr(256 + extra)] = b
            extra += 1
    return table


def read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def token_text(value: Any) -> str | None:
    """tokenizer_config.json names tokens as strings or as {"content": ...} objects."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


def quant_label(config: dict[str, Any]) -> str:
    q = config.get("quantization") or config.get("quantization_config")
    if isinstance(q, dict) and q.get("bits"):
        return f"mlx-{q['bits']}bit (group {q.get('group_size', '?')})"
    return str(config.get("torch_dtype") or config.get("dtype") or "float16").upper()
