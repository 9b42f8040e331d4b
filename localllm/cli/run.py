"""localllm run: one prompt answered on stdout; with --tools, as an agent's turn in a
folder (cli/run_turn.py shows it, agent/turn.py runs it)."""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from typing import TYPE_CHECKING, Any

from localllm.cli.common import (
    EXIT_USAGE,
    model_flags,
    positive_int,
    progress_printer,
    temperature,
)
from localllm.cli.run_turn import tool_names
from localllm.config import Settings

if TYPE_CHECKING:
    from localllm.engine.client import EngineClient


def add_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    run_parser = sub.add_parser("run", parents=[common], help="answer one prompt on stdout")
    run_parser.add_argument("prompt", nargs="?", help="the prompt, or '-' to read it from stdin")
    model_flags(run_parser)
    run_parser.add_argument("--max-tokens", type=positive_int, help="stop after this many tokens")
    run_parser.add_argument(
        "--temperature", type=temperature, help="0 = greedy (default: 0.8; 0 with --tools)"
    )
    run_parser.add_argument("--seed", type=int, help="sampling seed, for repeatable answers")
    run_parser.add_argument("--system", help="a system prompt")
    run_parser.add_argument("--stats", action="store_true", help="print speed figures to stderr")
    run_parser.add_argument(
        "--no-think", action="store_true", help="leave a thinking model's reasoning out"
    )
    agent = run_parser.add_argument_group(
        "tools",
        "answer as an agent in a folder: each call is shown on stderr and asked on the "
        "terminal (y/n/always) unless allowed; exit status 3: the step limit was reached, "
        "4: the turn was stopped",
    )
    agent.add_argument(
        "--tools",
        nargs="?",
        const="",
        metavar="NAMES",
        help="let the model use tools: alone, those that only look (read_file, list_folder, "
        "search_files); or those named, edit_file and run_command among them",
    )
    agent.add_argument("--folder", help="the folder the tools work in (default: here)")
    agent.add_argument(
        "--steps", type=positive_int, help="rounds of tool calls at most (default: agent_steps)"
    )
    agent.add_argument(
        "--allow", action="append", metavar="TOOL", help="run this tool's calls without asking"
    )
    agent.add_argument("--yes", "-y", action="store_true", help="run every call without asking")
    agent.add_argument("--json", action="store_true", help="one JSON event per line on stdout")
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


def _tools_or_prompt(args: argparse.Namespace) -> None:
    """`--tools` takes an optional list, so `run --tools "a question"` reads the question
    as that list: with no prompt given otherwise, it is the prompt."""
    if args.tools is None:
        return
    try:
        args.tools = tool_names(args.tools)
    except argparse.ArgumentTypeError as exc:
        if args.prompt is not None:
            raise _UsageError(f"--tools: {exc}") from None
        args.prompt, args.tools = args.tools, tool_names("")


def run(settings: Settings, args: argparse.Namespace) -> int:
    from localllm.backends.base import Message, SamplingParams
    from localllm.cli.run_turn import turn_main
    from localllm.engine.engine import Engine

    try:
        _tools_or_prompt(args)
        prompt = _read_prompt(args)
    except _UsageError as exc:
        sys.stderr.write(f"localllm: error: {exc}\n")
        return EXIT_USAGE
    messages = [Message("user", prompt)]
    if args.system:
        messages.insert(0, Message("system", args.system))
    temp = args.temperature
    if temp is None and args.tools is not None:
        # an agent's calls must come out in their format: Qwen2.5-Coder-1.5B answered "What
        # is the secret word in NOTES.md?" at 0 and did not in 3 tries at its default
        temp = 0.0
    params = SamplingParams.asked(temperature=temp, seed=args.seed, max_tokens=args.max_tokens)
    engine: EngineClient = Engine(settings)
    try:
        remote = engine.remotes.find(settings.model) is not None  # served elsewhere
        if not remote:
            engine.load(settings.model, progress=progress_printer(f"Loading {settings.model}"))
        model = settings.model if remote else None
        try:
            return asyncio.run(turn_main(engine, settings, args, messages, params, model=model))
        except KeyboardInterrupt:
            sys.stdout.write("\n")
            return 130
        except BrokenPipeError:  # `| head`: the reader has what it wanted
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            return 141
    finally:
        engine.close()
