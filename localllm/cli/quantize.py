"""localllm quantize: on-device quantization into the store, with its quality report."""

from __future__ import annotations

import argparse
from typing import Any

from localllm.cli.common import (
    DEFAULT_EVAL_TOKENS,
    bounded_note,
    positive_int,
    print_table,
    progress_printer,
    token_count,
)
from localllm.config import Settings


def add_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    from localllm.models.quantize import MLX_GROUP_SIZES, TYPES

    quantize = sub.add_parser(
        "quantize",
        parents=[common],
        help="quantize a model into the store (GGUF through llama.cpp, MLX through mlx-lm)",
    )
    quantize.add_argument("model", help="model name, path or HF repo")
    quantize.add_argument(
        "--to", dest="type", required=True, metavar="TYPE", help=f"one of: {', '.join(TYPES)}"
    )
    quantize.add_argument("--name", help="store name of the result (default: MODEL-TYPE)")
    quantize.add_argument(
        "--allow-requantize",
        action="store_true",
        help="quantize an already-quantized model (loses more quality; f16 is always allowed)",
    )
    quantize.add_argument(
        "--group-size",
        type=int,
        choices=MLX_GROUP_SIZES,
        default=64,
        help="MLX types: weights per scale (default: 64)",
    )
    quantize.add_argument(
        "--threads", type=positive_int, dest="n_threads", help="CPU threads (default: cores)"
    )
    quantize.add_argument(
        "--no-report", action="store_true", help="skip the size / speed / perplexity report"
    )
    quantize.add_argument(
        "--eval-tokens",
        type=token_count,
        default=DEFAULT_EVAL_TOKENS,
        metavar="N|all",
        help=f"tokens of the held-out text the report scores (default: the first "
        f"{DEFAULT_EVAL_TOKENS:,}; all: the whole text, minutes per model)",
    )
    quantize.set_defaults(run=run)


def run(settings: Settings, args: argparse.Namespace) -> int:
    from localllm.models import quantize as q
    from localllm.models.store import ModelStore
    from localllm.units import format_bytes

    source = ModelStore.from_settings(settings).resolve(args.model)
    plan = q.plan_quantize(
        source,
        args.type,
        models_dir=settings.models_dir,
        name=args.name,
        allow_requantize=args.allow_requantize,
        group_size=args.group_size,
    )
    group = f", group size {plan.group_size}" if plan.group_size else ""
    print(
        f"{source.name} ({plan.source_quant}, {format_bytes(source.size_bytes)}) -> "
        f"{plan.name} ({plan.target}{group}, about {format_bytes(plan.estimate)}); "
        f"{format_bytes(plan.free)} free in {settings.models_dir}"
    )
    for warning in plan.warnings:
        print(f"warning: {warning}")
    result = q.quantize(
        plan,
        settings.models_dir,
        progress=progress_printer(f"Quantizing to {plan.target}", piped=True),
        n_threads=args.n_threads,
    )
    print(
        f"Quantized {source.name} to {plan.target} in {result.seconds:.1f} s: "
        f"{result.ref.name} ({format_bytes(result.ref.size_bytes)}) in {result.folder}"
    )
    if result.fallback:
        gs = plan.group_size or 64
        note = q.fallback_note(plan.target, result.fallback, result.tensors, gs)
        print(f"note: {note}")
    if not args.no_report:
        rows = q.measure_in_child(
            [source, result.ref],
            models_dir=settings.models_dir,
            max_tokens=args.eval_tokens,
            n_threads=args.n_threads,
            progress=progress_printer("Measuring size, speed and perplexity", piped=True),
        )
        print()
        print_report(rows)
        first = rows[0]
        note = bounded_note(
            first["scored"], first["text_tokens"], args.eval_tokens, "--eval-tokens"
        )
        if note:
            print(f"Scored {note.removeprefix('; ')}.")
    print(f"run it with: localllm chat {result.ref.name}")
    return 0


def print_report(rows: list[dict[str, Any]]) -> None:
    """The report table: each model's size, decode speed and perplexity (vs the first row)."""
    from localllm.models.quantize import report_footer, report_table

    print_table(report_table(rows))
    print(report_footer(rows))
