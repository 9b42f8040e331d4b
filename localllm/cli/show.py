"""localllm show: a model's chat template and default sampling."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from localllm.config import Settings


def add_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    show = sub.add_parser(
        "show", parents=[common], help="a model's chat template and default sampling"
    )
    show.add_argument("model", help="model name, path or HF repo")
    show.add_argument("--template", action="store_true", help="only the chat template")
    show.add_argument("--parameters", action="store_true", help="only the default sampling")
    show.set_defaults(run=run)


def run(settings: Settings, args: argparse.Namespace) -> int:
    """The chat template a model renders prompts with, and the sampling it gets by default."""
    from dataclasses import asdict

    from localllm.backends.base import SamplingParams
    from localllm.backends.chat_template import CHATML
    from localllm.models.gguf import read_meta
    from localllm.models.sampling import recommended
    from localllm.models.store import ModelStore

    ref = ModelStore.from_settings(settings).resolve(args.model)
    meta = read_meta(ref.path, ref.format)
    both = not (args.template or args.parameters)
    if args.template or both:
        if both:
            print(
                "# chat template" + ("" if meta.chat_template else " (none in the model: ChatML)")
            )
        elif not meta.chat_template:
            sys.stderr.write(f"{ref.name} has no chat template; ChatML is used:\n")
        print(meta.chat_template or CHATML)
    if args.parameters or both:
        if both:
            print("\n# default sampling (a request's fields override each)")
        rec = recommended(ref)
        params = asdict(SamplingParams.asked().with_defaults(rec.values))
        for key, value in params.items():
            if key == "given":
                continue
            shown = "none" if value in (None, ()) else value
            where = f"  # {rec.source}" if key in rec.values else ""
            print(f"{key} {shown}{where}")
    return 0
