"""A LoRA adapter on an MLX model: mlx-lm's `adapter_path` folder (adapter_config.json
and adapters.safetensors), loaded with the model, its scale set per step.

mlx-lm takes one adapter folder per model, so an MLX model has at most one adapter (id
0). Its LoRA layers add `scale * (x @ A @ B)` to each wrapped layer's output; a step's
scale multiplies the scale the adapter was trained with (1.0: as trained, 0: the base
model's output exactly).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from localllm.backends.base import Adapter, Scales
from localllm.errors import AdapterMismatch, InvalidRequest, ModelLoadError


class MlxLoras:
    """The adapter of one MLX model (none or one) and the scale its layers apply now."""

    def __init__(self, model: Any, specs: Sequence[tuple[str, float]]) -> None:
        self.adapters: list[Adapter] = []
        self._layers: list[tuple[Any, float]] = []  # each LoRA layer and its trained scale
        self._current = 1.0
        if not specs:
            return
        if len(specs) > 1:
            raise InvalidRequest(
                f"an MLX model takes one LoRA adapter folder (mlx-lm's adapter_path), "
                f"got {len(specs)}",
                param="lora",
            )
        from mlx_lm.tuner.utils import load_adapters

        path, scale = specs[0]
        try:
            load_adapters(model, path)
        except FileNotFoundError:
            raise ModelLoadError(
                path, "no LoRA adapter folder (adapter_config.json) here"
            ) from None
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise AdapterMismatch(path, f"mlx-lm refuses it: {str(exc)[:300]}") from None
        model.eval()  # the adapter's dropout is for training
        self._layers = [
            (m, float(m.scale))
            for _, m in model.named_modules()
            if hasattr(m, "lora_a") and isinstance(getattr(m, "scale", None), (int, float))
        ]
        self.adapters.append(Adapter.loaded(path, scale))

    def use(self, scales: Scales) -> None:
        scale = dict(scales).get(0, 0.0)
        if scale == self._current:
            return
        for layer, trained in self._layers:
            layer.scale = trained * scale
        self._current = scale
