"""localllm eval: a model's perplexity on the held-out text or a file."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from localllm.cli.common import (
    DEFAULT_EVAL_TOKENS,
    backend_flag,
    bounded_note,
    kv_flag,
    lora_flag,
    positive_int,
    progress_printer,
    token_count,
)
from localllm.config import Settings, lora_spec


def add_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    evaluate = sub.add_parser(
        "eval", parents=[common], help="perplexity of a model on the held-out text or a file"
    )
    evaluate.add_argument("model", help="model name, path or HF repo")
    evaluate.add_argument("--file", type=Path, help="a UTF-8 text file (default: the shipped text)")
    evaluate.add_argument(
        "--tokens",
        type=token_count,
        default=DEFAULT_EVAL_TOKENS,
        metavar="N|all",
        help=f"tokens of the text to score (default: the first {DEFAULT_EVAL_TOKENS:,}; "
        "all: the whole text)",
    )
    evaluate.add_argument(
        "--window",
        type=positive_int,
        default=512,
        help="tokens per evaluation window; the second half of each is scored (default: 512)",
    )
    evaluate.add_argument(
        "--threads", type=positive_int, dest="n_threads", help="CPU threads (default: cores)"
    )
    backend_flag(evaluate)
    kv_flag(evaluate)
    lora_flag(evaluate)
    evaluate.set_defaults(run=run)


def run(settings: Settings, args: argparse.Namespace) -> int:
    from localllm.engine.evaluate import load_for_eval, perplexity, read_text
    from localllm.models.quantize import HELDOUT_LABEL
    from localllm.models.store import ModelStore

    ref = ModelStore.from_settings(settings).resolve(args.model)
    text = read_text(args.file)
    model = load_for_eval(
        ref,
        backend=settings.backend,
        models_dir=settings.models_dir,
        window=args.window,
        n_threads=args.n_threads,
        kv_type=settings.kv_cache_type,
        loras=tuple(lora_spec(spec) for spec in settings.lora),
    )
    try:
        result = perplexity(
            model,
            text,
            window=args.window,
            max_tokens=args.tokens,
            progress=progress_printer(f"Evaluating {ref.name}", piped=True),
        )
        where = str(args.file) if args.file else HELDOUT_LABEL
        window = min(args.window, model.info.n_ctx)
        kv = f", KV {settings.kv_cache_type}" if settings.kv_cache_type != "f16" else ""
        kv += "".join(f", LoRA {Path(a.path).name} x{a.scale:g}" for a in model.adapters)
        print(
            f"{ref.name} ({model.info.backend}, {model.info.quant}{kv}): perplexity "
            f"{result.value:.3f} over {result.scored:,} tokens ({result.windows} "
            f"window{'s' if result.windows != 1 else ''} of "
            f"{window}, second halves scored) of {where}"
            f"{bounded_note(result.scored, result.text_tokens, args.tokens, '--tokens')}"
        )
    finally:
        model.close()
    sys.stdout.flush()
    return 0
