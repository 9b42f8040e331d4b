"""The `localllm` command. Each command is a module of this package with `add_parser(sub,
common)`, which adds its parser and sets `run(settings, args)` as what it runs;
`COMMANDS` lists them in the order `--help` shows. The bare command opens the chat."""

from __future__ import annotations

import argparse
import contextlib
import importlib
import logging
import os
import sys
from collections.abc import Sequence
from typing import NoReturn

from localllm import __version__
from localllm.cli.common import EXIT_USAGE, Parser, setup_logging
from localllm.config import load_settings
from localllm.errors import (
    ConfigError,
    DamagedModel,
    InvalidRequest,
    LocalLLMError,
    ModelNotFound,
)
from localllm.fsguard import PathRefused

# the command modules (`list` and `eval` are listing.py and evaluate.py: a module named
# like a builtin would shadow it in this package)
COMMANDS = (
    "chat",
    "serve",
    "run",
    "listing",
    "pull",
    "rm",
    "ps",
    "load",
    "stop",
    "info",
    "convert",
    "quantize",
    "evaluate",
    "bench",
    "show",
    "completion",
    "keys",
    "usage",
    "service",
    "logs",
    "remote",
    "mcp",
    "launch",
)
# the settings a command's flags may set (config.Settings' names)
SETTING_FLAGS = (
    "model",
    "n_ctx",
    "n_threads",
    "host",
    "port",
    "backend",
    "force_load",
    "speculate",
    "draft_model",
    "parallel",
    "kv_cache_type",
    "lora",
    "mmproj",
    "deterministic",
    "no_auth",
)


def build_parser() -> Parser:
    parser = Parser(
        prog="localllm",
        description="Local LLM inference: chat and an "
        "OpenAI-compatible endpoint on your own machine.",
    )
    parser.add_argument("--version", action="version", version=f"localllm {__version__}")
    parser.add_argument(
        "--log-level",
        choices=["debug", "info", "warning", "error"],
        help="diagnostics on stderr (default: warning)",
    )
    # --log-level is accepted before or after the command
    common = Parser(add_help=False)
    common.add_argument(
        "--log-level",
        choices=["debug", "info", "warning", "error"],
        default=argparse.SUPPRESS,
        help=argparse.SUPPRESS,
    )
    sub = parser.add_subparsers(dest="command", parser_class=Parser, metavar="COMMAND")
    for name in COMMANDS:
        importlib.import_module(f"localllm.cli.{name}").add_parser(sub, common)
    parser.command_names = frozenset(sub.choices)
    return parser


_TOP_LEVEL = ("-h", "--help", "--version", "--log-level")
PASSTHROUGH = ("launch",)  # commands whose arguments after `--` are another program's


def _with_command(parser: Parser, raw: list[str]) -> list[str]:
    """`localllm --port 9000` opens the chat with that flag: flags given to the bare
    command are the chat's (argparse would read "9000" as the command's name)."""
    names = parser.command_names
    if not raw or not raw[0].startswith("-") or raw[0].split("=")[0] in _TOP_LEVEL:
        return raw
    if any(arg in names for arg in raw):
        return raw
    return ["chat", *raw]


def main(argv: Sequence[str] | None = None) -> int:
    code = _main(argv)
    if argv is None and "mlx.core" in sys.modules:
        _end_process(code)
    return code


def _end_process(code: int) -> NoReturn:
    """End a command that used MLX here. MLX keeps C++ threads for work done off the main
    thread (the engine's worker) and their destructors call std::terminate while the
    interpreter shuts down: the answer was printed, then "terminate called without an
    active exception", ggml's backtrace and exit code 134. Everything the command wrote
    is flushed and closed first; only the interpreter's teardown is skipped."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    logging.shutdown()
    os._exit(code)


def _main(argv: Sequence[str] | None) -> int:
    parser = build_parser()
    if "_ARGCOMPLETE" in os.environ:  # the shell asks for completions: answer and exit
        import argcomplete

        argcomplete.autocomplete(parser)
    raw = _with_command(parser, list(sys.argv[1:] if argv is None else argv))
    passed: list[str] | None = None
    if raw[:1] and raw[0] in PASSTHROUGH and "--" in raw:  # the rest is the client's
        at = raw.index("--")
        raw, passed = raw[:at], raw[at + 1 :]
    args = parser.parse_args(raw)
    if passed is not None:
        args.client_args = passed
    if args.command is None:
        args = parser.parse_args([*raw, "chat"])
    if getattr(args, "model_flag", None):
        if args.model and args.model != args.model_flag:
            sys.stderr.write(
                f"localllm: error: two models named: {args.model} and --model {args.model_flag}\n"
            )
            return EXIT_USAGE
        args.model = args.model_flag
    flags = {k: getattr(args, k, None) for k in SETTING_FLAGS}
    flags["log_level"] = args.log_level
    try:
        settings = load_settings(flags)
    except ConfigError as exc:
        sys.stderr.write(f"localllm: error: {exc.message}\n")
        return EXIT_USAGE
    setup_logging(settings.log_level)
    try:
        return int(args.run(settings, args))
    except (ModelNotFound, ConfigError, DamagedModel, InvalidRequest) as exc:  # bad input
        sys.stderr.write(f"localllm: error: {exc.message}\n")
        return EXIT_USAGE
    except PathRefused as exc:  # a user's file not read or written, and why
        sys.stderr.write(f"localllm: error: {exc}\n")
        return EXIT_USAGE
    except LocalLLMError as exc:
        sys.stderr.write(f"localllm: error: {exc.message}\n")
        return 1
    except KeyboardInterrupt:
        return 130
