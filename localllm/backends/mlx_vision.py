"""Images on the MLX backend, through mlx-vlm: a model folder whose config has a
`vision_config` (LLaVA, SmolVLM, Gemma 3, ...) is loaded by mlx-vlm; its language model
does every text step as an mlx-lm model does, and a picture is read by the whole model
(vision tower, projector, language model) in a step of its own.

A picture is laid out as the model's processor lays it out (its image tokens, and the
tokens around them that some models add), and written into the prompt as stand-in ids
(backends/media.py), so the prompt cache tells pictures apart as on llama.cpp. Each
sequence reads its pictures on its own, as MLX's text steps do (mlx-vlm's batching
pads prompts together, which the scheduler's sequences of different lengths are not).
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from localllm.backends import media as media_ids
from localllm.backends.base import MEDIA_MARKER, Media
from localllm.backends.common import KVLedger
from localllm.errors import InvalidRequest, LocalLLMError, ModelLoadError

_KEEP = 8  # pictures whose processed pixels are kept (processed again from `held`)


def is_vision_dir(folder: Path) -> bool:
    """Whether an MLX model folder is a vision-language model (mlx-vlm loads it)."""
    try:
        config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(config, dict) and isinstance(config.get("vision_config"), dict)


class Logits:
    """mlx-vlm's language model as an mlx-lm model: called, it gives the logits array
    (mlx-vlm wraps them in an output object); everything else is the model's own."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        out = self.inner(*args, **kwargs)
        return getattr(out, "logits", out)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


class MlxVision:
    """A vision-language model loaded by mlx-vlm, and the pictures of prompts being read."""

    def __init__(self, folder: Path) -> None:
        try:
            from mlx_vlm.utils import load
        except ImportError:
            raise ModelLoadError(
                str(folder), "a vision model needs mlx-vlm: pip install 'localllm[mlx]'"
            ) from None
        try:
            self.model, self.processor = load(str(folder))
        except Exception as exc:  # mlx-vlm raises many kinds for a folder it cannot read
            raise ModelLoadError(str(folder), f"mlx-vlm could not load it ({exc})") from None
        config = self.model.config
        self.image_token = getattr(self.processor, "image_token", None) or "<image>"
        self.language = Logits(self.model.language_model)
        self.name = str(getattr(config, "model_type", "?"))
        self._lock = threading.Lock()  # the tokenizer thread adds pictures, the worker reads
        self._runs: OrderedDict[int, tuple[list[int], dict[str, Any]]] = OrderedDict()
        self.held = media_ids.Held()  # run base -> the picture, to process it again

    # -- prompts ---------------------------------------------------------------------
    def tokenize(
        self, text: str, media: Sequence[Media], tokenize: Callable[[str], list[int]]
    ) -> list[int]:
        """The ids of `text` (tokenized by `tokenize`) with each MEDIA_MARKER replaced by
        the next picture's stand-in ids."""
        pieces = text.split(MEDIA_MARKER)
        if len(pieces) - 1 != len(media):
            raise InvalidRequest(
                f"the prompt places {len(pieces) - 1} images and carries {len(media)}",
                param="messages",
            )
        out = tokenize(pieces[0])
        bases: list[int] = []
        for item, piece in zip(media, pieces[1:], strict=True):
            if item.kind != "image":
                raise InvalidRequest(
                    f"this model ({self.name}, mlx-vlm) reads images, not audio",
                    param="messages",
                    code="audio_not_supported",
                )
            stand = self._picture(item)
            bases.append(-stand[0])
            self.held.add(-stand[0], item, keep=bases)
            out += stand
            out += tokenize(piece)
        if out and out[-1] < 0:
            raise InvalidRequest(
                "a prompt may not end with an image: add text after it", param="messages"
            )
        return out

    def _picture(self, item: Media) -> list[int]:
        """A picture as the processor lays it out: its ids (kept, with its pixels) and
        the stand-ins that take their place in the prompt (thread-safe)."""
        from PIL import Image

        img = Image.frombytes("RGB", (item.width, item.height), item.data)
        try:
            inputs = self.processor(text=[self.image_token], images=[img], return_tensors="np")
        except Exception as exc:
            raise InvalidRequest(
                f"the model's processor could not read the image ({exc})",
                param="messages",
                code="unsupported_media",
            ) from None
        ids = [int(t) for t in inputs["input_ids"][0]]
        bos = getattr(getattr(self.processor, "tokenizer", None), "bos_token_id", None)
        if len(ids) > 1 and bos is not None and ids[0] == bos:  # the template placed it
            ids = ids[1:]
        # numpy here: MLX arrays belong to the thread that made them, and the worker reads
        extra = {
            k: np.asarray(v) for k, v in inputs.items() if k not in ("input_ids", "attention_mask")
        }
        stand = media_ids.run_ids(item.digest, len(ids))
        with self._lock:
            self._runs[-stand[0]] = (ids, extra)
            self._runs.move_to_end(-stand[0])
            while len(self._runs) > _KEEP:
                self._runs.popitem(last=False)
        return stand

    # -- steps -----------------------------------------------------------------------
    def read(self, cache: list[Any], kv: KVLedger, tokens: Sequence[int]) -> tuple[Any, int]:
        """Evaluate a step's part that holds pictures: text by the language model, each
        picture by the whole model. Returns the last text's logits and its length (what
        the step's logits rows are read from). A part that starts inside a picture (a
        cache that kept half of one) reads it again whole."""
        full = [*kv.tokens, *tokens]
        start = len(kv.tokens)
        if media_ids.continues(full, start):
            back = media_ids.run_start(full, start)
            for c in cache:
                c.trim(start - back)
            kv.cut(back)
            again = full[back:start]
            out = self._segments(cache, [*again, *tokens])
            kv.tokens.extend(again)  # the step adds `tokens` after these
            return out
        return self._segments(cache, tokens)

    def _segments(self, cache: list[Any], tokens: Sequence[int]) -> tuple[Any, int]:
        import mlx.core as mx

        out, n, i = None, 0, 0
        while i < len(tokens):
            if tokens[i] >= 0:
                j = i
                while j < len(tokens) and tokens[j] >= 0:
                    j += 1
                out, n = self.language(mx.array(list(tokens[i:j]))[None], cache=cache), j - i
            else:
                j = media_ids.run_end(tokens, i)
                base = media_ids.run_base(tokens, i)
                with self._lock:
                    prepared = self._runs.get(base)
                if prepared is None:  # processed again from the picture
                    item = self.held.get(base)
                    if item is None:
                        raise LocalLLMError(
                            "a picture of this prompt is no longer held: send it again"
                        )
                    self._picture(item)
                    with self._lock:
                        prepared = self._runs[base]
                ids, extra = prepared
                if len(ids) != j - i:
                    raise LocalLLMError(
                        f"a step holds {j - i} of a picture's {len(ids)} tokens; it is read whole"
                    )
                arrays = {k: mx.array(v) for k, v in extra.items()}
                result = self.model(mx.array(ids)[None], mask=None, cache=cache, **arrays)
                out, n = getattr(result, "logits", result), j - i
            mx.eval([out, *[c.state for c in cache]])
            i = j
        return out, n
