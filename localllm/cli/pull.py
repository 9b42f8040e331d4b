"""localllm pull: a model from the Hugging Face hub into the store, checked against memory first."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from localllm.cli.common import (
    configured_draft,
    positive_int,
)
from localllm.config import Settings


def add_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    pull = sub.add_parser(
        "pull", parents=[common], help="download a model from Hugging Face into the store"
    )
    pull.add_argument("repo", help="org/repo, org/repo:Q4_K_M (a quant) or org/repo:file.gguf")
    pull.add_argument("--name", help="store name (default: the GGUF's or repository's name)")
    pull.add_argument("--revision", help="a branch, tag or commit (default: main)")
    pull.add_argument("--ctx", type=positive_int, dest="n_ctx", help="context for the estimate")
    pull.add_argument("--force", action="store_true", help="pull even if it will not fit in memory")
    pull.set_defaults(run=run)


def run(settings: Settings, args: argparse.Namespace) -> int:
    from localllm.models import fit, hub
    from localllm.units import format_bytes

    plan = hub.plan_pull(args.repo, name=args.name, revision=args.revision)
    files = len(plan.files)
    print(
        f"{plan.repo} @ {plan.commit[:12]}: {plan.kind.upper()}, {files} file"
        f"{'s' if files != 1 else ''}, {format_bytes(plan.total)} -> {plan.name}"
    )
    already = hub.existing(settings.models_dir, plan)
    if already is not None:
        print(f"Already in the store at {already}; run it with: localllm chat {plan.name}")
        return 0
    need = hub.estimate_remote(plan, settings.n_ctx).with_draft(configured_draft(settings))
    free = fit.free_memory(budget_mb=settings.memory_budget_mb)
    verdict = "fits" if fit.fits(need, free) else "does NOT fit"
    print(f"Memory: needs {need.text()}; {free.text()}: {verdict}")
    if not fit.fits(need, free):
        smaller = [
            f"{plan.repo}:{label} ({format_bytes(size)})"
            for label, size in plan.others
            if fit.fits(need.with_weights(size), free)
        ]
        if not args.force:
            hint = f"; these would: {', '.join(smaller)}" if smaller else ""
            sys.stderr.write(
                f"localllm: error: {plan.name} will not fit in memory{hint}. "
                "Pull it anyway with --force.\n"
            )
            return 1
        print("Pulling anyway (--force).")
    folder = hub.pull(plan, settings.models_dir)
    size = sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())
    print(f"Pulled {plan.name} ({format_bytes(size)}, verified) into {folder}")
    print(f"run it with: localllm chat {plan.name}")
    return 0
