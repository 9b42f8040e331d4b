"""`localllm quantize` and `localllm eval`: on-device quantization and its quality report."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from localllm.cli_common import progress_printer
from localllm.config import Settings


def cmd_quantize(settings: Settings, args: argparse.Namespace) -> int:
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
        progress=progress_printer(f"Quantizing to {plan.target}"),
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
            progress=progress_printer("Measuring size, speed and perplexity"),
        )
        print()
        print_report(rows)
    print(f"run it with: localllm chat {result.ref.name}")
    return 0


def print_report(rows: list[dict[str, Any]]) -> None:
    """The report table: each model's size, decode speed and perplexity (vs the first row)."""
    from localllm.cli_models import _print_table
    from localllm.models.quantize import report_footer, report_table

    _print_table(report_table(rows))
    print(report_footer(rows))


def cmd_eval(settings: Settings, args: argparse.Namespace) -> int:
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
    )
    try:
        result = perplexity(
            model,
            text,
            window=args.window,
            max_tokens=args.tokens,
            progress=progress_printer(f"Evaluating {ref.name}"),
        )
        where = str(args.file) if args.file else HELDOUT_LABEL
        window = min(args.window, model.info.n_ctx)
        print(
            f"{ref.name} ({model.info.backend}, {model.info.quant}): perplexity "
            f"{result.value:.3f} over {result.scored:,} tokens ({result.windows} "
            f"window{'s' if result.windows != 1 else ''} of "
            f"{window}, second halves scored) of {where}"
        )
    finally:
        model.close()
    sys.stdout.flush()
    return 0
