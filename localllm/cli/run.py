"""localllm run: one prompt answered on stdout."""

from __future__ import annotations

import argparse
import sys
import threading
from typing import TYPE_CHECKING, Any

from localllm.cli.common import (
    EXIT_USAGE,
    model_flags,
    positive_int,
    progress_printer,
    temperature,
)
from localllm.config import Settings

if TYPE_CHECKING:
    from localllm.engine.client import EngineClient


def add_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    run_parser = sub.add_parser("run", parents=[common], help="answer one prompt on stdout")
    run_parser.add_argument("prompt", nargs="?", help="the prompt, or '-' to read it from stdin")
    model_flags(run_parser)
    run_parser.add_argument("--max-tokens", type=positive_int, help="stop after this many tokens")
    run_parser.add_argument("--temperature", type=temperature, help="0 = greedy (default: 0.8)")
    run_parser.add_argument("--seed", type=int, help="sampling seed, for repeatable answers")
    run_parser.add_argument("--system", help="a system prompt")
    run_parser.add_argument("--stats", action="store_true", help="print speed figures to stderr")
    run_parser.set_defaults(run=run)


def _read_prompt(args: argparse.Namespace) -> str:
    if args.prompt is None:
        raise _UsageError("run needs a prompt: localllm run \"your question\" (or '-' for stdin)")
    prompt = sys.stdin.read() if args.prompt == "-" else args.prompt
    if not prompt.strip():
        raise _UsageError("the prompt is empty")
    return str(prompt)


class _UsageError(Exception):
    pass


def run(settings: Settings, args: argparse.Namespace) -> int:
    from localllm.backends.base import Message, SamplingParams
    from localllm.engine.engine import Engine
    from localllm.engine.request import Request

    try:
        prompt = _read_prompt(args)
    except _UsageError as exc:
        sys.stderr.write(f"localllm: error: {exc}\n")
        return EXIT_USAGE
    messages = [Message("user", prompt)]
    if args.system:
        messages.insert(0, Message("system", args.system))
    params = SamplingParams.asked(
        temperature=args.temperature, seed=args.seed, max_tokens=args.max_tokens
    )
    engine: EngineClient = Engine(settings)
    cancel = threading.Event()
    try:
        remote = engine.remotes.find(settings.model) is not None  # served elsewhere
        if not remote:
            engine.load(settings.model, progress=progress_printer(f"Loading {settings.model}"))
        request = Request(params, messages=messages, model=settings.model if remote else None)
        final = None
        try:
            for chunk in engine.generate(request, cancel=cancel):
                if chunk.text:
                    sys.stdout.write(chunk.text)
                    sys.stdout.flush()
                if chunk.finish_reason is not None:
                    final = chunk
        except KeyboardInterrupt:
            cancel.set()
            sys.stdout.write("\n")
            return 130
        sys.stdout.write("\n")
        sys.stdout.flush()
        if args.stats and final is not None and final.stats is not None:
            s = final.stats
            sys.stderr.write(
                f"prompt {s.prompt_tokens} tokens ({s.cached_tokens} cached), "
                f"generated {s.generated_tokens} tokens, first token {s.ttft_s * 1000:.0f} ms, "
                f"{s.decode_tps:.1f} tokens/s, finish: {final.finish_reason}\n"
            )
            if s.draft_off:
                sys.stderr.write(f"speculative: off for this request ({s.draft_off})\n")
            if s.draft_proposed:
                speedup = f", {s.speedup:.2f}x plain speed" if s.speedup else ""
                sys.stderr.write(
                    f"speculative: {s.draft_accepted} of {s.draft_proposed} drafted tokens "
                    f"accepted ({s.draft_accepted / s.draft_proposed:.0%}){speedup}\n"
                )
    finally:
        engine.close()
    return 0
