"""The `localllm` command: chat, serve and run here; model management in cli_models."""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from localllm import __version__
from localllm.cli_common import EXIT_USAGE, positive_int, progress_printer
from localllm.config import DEFAULT_PORT, SPECULATE_MODES, Settings, load_settings
from localllm.errors import ConfigError, DamagedModel, LocalLLMError, ModelNotFound

if TYPE_CHECKING:
    from localllm.engine.client import EngineClient

log = logging.getLogger(__name__)


class _Parser(argparse.ArgumentParser):
    """argparse that reports a bad flag as one clear line (exit code 2)."""

    command_names: frozenset[str] = frozenset()  # the top-level parser's commands

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"localllm: error: {message} (see '{self.prog} --help')\n")


_positive_int = positive_int


def _temperature(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got '{text}'") from None
    if not 0.0 <= value <= 2.0:
        raise argparse.ArgumentTypeError(f"expected a value from 0 to 2, got {value}")
    return value


def _port(text: str) -> int:
    value = _positive_int(text)
    if value > 65535:
        raise argparse.ArgumentTypeError(f"a port is at most 65535, got {value}")
    return value


def build_parser() -> _Parser:
    parser = _Parser(
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
    common = _Parser(add_help=False)
    common.add_argument(
        "--log-level",
        choices=["debug", "info", "warning", "error"],
        default=argparse.SUPPRESS,
        help=argparse.SUPPRESS,
    )
    sub = parser.add_subparsers(dest="command", parser_class=_Parser, metavar="COMMAND")

    def model_flags(p: argparse.ArgumentParser) -> None:
        p.add_argument(
            "--model", "-m", help="model name, path to a .gguf, or HF repo (default: starter)"
        )
        p.add_argument(
            "--ctx",
            type=_positive_int,
            dest="n_ctx",
            help="context size in tokens (default: the trained context, as far as memory allows)",
        )
        p.add_argument(
            "--threads",
            type=_positive_int,
            dest="n_threads",
            help="CPU threads (default: physical cores)",
        )
        backend_flag(p)
        force_flag(p)
        speculate_flags(p)
        batch_flags(p)

    def batch_flags(p: argparse.ArgumentParser) -> None:
        p.add_argument(
            "--parallel",
            type=_positive_int,
            help="requests decoded together per model (default: 4, fewer if memory is short)",
        )
        p.add_argument(
            "--deterministic",
            action="store_true",
            default=None,
            help="each request runs alone and its output does not depend on the prompt cache"
            " (slower: see the README)",
        )

    def speculate_flags(p: argparse.ArgumentParser) -> None:
        p.add_argument(
            "--speculate",
            choices=SPECULATE_MODES,
            help="speculative decoding: lookup (drafts from the prompt), draft (a draft "
            "model), auto (default: the draft model if one is set, else lookup), off",
        )
        p.add_argument(
            "--draft",
            dest="draft_model",
            metavar="MODEL",
            help="a smaller model with the same vocabulary that drafts tokens",
        )

    def force_flag(p: argparse.ArgumentParser) -> None:
        p.add_argument(
            "--force",
            action="store_true",
            dest="force_load",
            default=None,
            help="load the model even if the memory estimate says it will not fit",
        )

    def backend_flag(p: argparse.ArgumentParser) -> None:
        p.add_argument(
            "--backend",
            choices=["auto", "llamacpp", "mlx"],
            help="auto (default): MLX on Apple Silicon, llama.cpp elsewhere",
        )

    chat = sub.add_parser(
        "chat", parents=[common], help="open the terminal chat (the default command)"
    )
    chat.add_argument("model", nargs="?", help="model name, path to a .gguf, or HF repo")
    chat.add_argument(
        "--model",
        dest="model_flag",
        metavar="MODEL",
        help="the same, as a flag (localllm --model X)",
    )
    chat.add_argument(
        "--ctx",
        type=_positive_int,
        dest="n_ctx",
        help="context size in tokens (default: the trained context, as far as memory allows)",
    )
    chat.add_argument(
        "--threads",
        type=_positive_int,
        dest="n_threads",
        help="CPU threads (default: physical cores)",
    )
    backend_flag(chat)
    force_flag(chat)
    speculate_flags(chat)
    batch_flags(chat)
    chat.add_argument("--port", type=_port, help=f"endpoint port (default: {DEFAULT_PORT})")
    chat.add_argument(
        "--no-serve", action="store_true", help="do not start the endpoint beside the chat"
    )

    serve = sub.add_parser("serve", parents=[common], help="serve the OpenAI-compatible endpoint")
    model_flags(serve)
    serve.add_argument("--host", help="address to bind (default: 127.0.0.1)")
    serve.add_argument("--port", type=_port, help=f"port (default: {DEFAULT_PORT})")
    serve.add_argument(
        "--no-auth",
        action="store_true",
        default=None,
        help="serve a non-loopback --host with no API key (anyone who can reach it may use it)",
    )

    run = sub.add_parser("run", parents=[common], help="answer one prompt on stdout")
    run.add_argument("prompt", nargs="?", help="the prompt, or '-' to read it from stdin")
    model_flags(run)
    run.add_argument("--max-tokens", type=_positive_int, help="stop after this many tokens")
    run.add_argument("--temperature", type=_temperature, help="0 = greedy (default: 0.8)")
    run.add_argument("--seed", type=int, help="sampling seed, for repeatable answers")
    run.add_argument("--system", help="a system prompt")
    run.add_argument("--stats", action="store_true", help="print speed figures to stderr")

    listing = sub.add_parser("list", parents=[common], help="list local models")
    listing.add_argument("--json", action="store_true", help="machine-readable output")
    pull = sub.add_parser(
        "pull", parents=[common], help="download a model from Hugging Face into the store"
    )
    pull.add_argument("repo", help="org/repo, org/repo:Q4_K_M (a quant) or org/repo:file.gguf")
    pull.add_argument("--name", help="store name (default: the GGUF's or repository's name)")
    pull.add_argument("--revision", help="a branch, tag or commit (default: main)")
    pull.add_argument("--ctx", type=_positive_int, dest="n_ctx", help="context for the estimate")
    pull.add_argument("--force", action="store_true", help="pull even if it will not fit in memory")
    rm = sub.add_parser("rm", parents=[common], help="remove a model from the model store")
    rm.add_argument("model", help="a model name from 'localllm list' (source: store)")
    rm.add_argument("--yes", "-y", action="store_true", help="do not ask first")
    ps = sub.add_parser(
        "ps", parents=[common], help="what the running server has loaded, and its prompt cache"
    )
    ps.add_argument("--json", action="store_true", help="the server's /health as JSON")
    ps.add_argument("--host", help="the server's address (default: 127.0.0.1)")
    ps.add_argument("--port", type=_port, help=f"the server's port (default: {DEFAULT_PORT})")
    load = sub.add_parser(
        "load", parents=[common], help="load a model in the running server (preload or pin)"
    )
    load.add_argument("model", help="a model name from 'localllm list'")
    load.add_argument("--ctx", type=_positive_int, dest="n_ctx", help="context size in tokens")
    load.add_argument(
        "--ttl", help="idle time before it unloads: seconds or 10m, 2h; -1 keeps it loaded"
    )
    stop = sub.add_parser("stop", parents=[common], help="unload models from the running server")
    stop.add_argument("model", nargs="?", help="the model to unload")
    stop.add_argument("--all", action="store_true", help="unload every model")
    for p in (load, stop):
        p.add_argument("--host", help="the server's address (default: 127.0.0.1)")
        p.add_argument("--port", type=_port, help=f"the server's port (default: {DEFAULT_PORT})")
    info = sub.add_parser(
        "info", parents=[common], help="describe a model (reads its header, not its weights)"
    )
    info.add_argument("model", help="model name, path or HF repo")
    info.add_argument("--json", action="store_true", help="machine-readable output")
    info.add_argument(
        "--ctx", type=_positive_int, dest="n_ctx", help="context size for the memory estimate"
    )
    backend_flag(info)
    convert = sub.add_parser(
        "convert", parents=[common], help="import a GGUF model into MLX (in the model store)"
    )
    convert.add_argument("model", help="model name, path or HF repo of a GGUF")
    convert.add_argument("--to", choices=["mlx"], required=True, help="the target format")
    convert.add_argument("--name", help="store name of the result (default: MODEL-mlx)")
    _quantize_parsers(sub, common, backend_flag)
    show = sub.add_parser(
        "show", parents=[common], help="a model's chat template and default sampling"
    )
    show.add_argument("model", help="model name, path or HF repo")
    show.add_argument("--template", action="store_true", help="only the chat template")
    show.add_argument("--parameters", action="store_true", help="only the default sampling")
    completion = sub.add_parser(
        "completion", parents=[common], help='shell completion: eval "$(localllm completion bash)"'
    )
    completion.add_argument("shell", choices=["bash", "zsh", "fish"])
    from localllm import cli_keys, cli_logs, cli_remote, cli_service

    cli_keys.add_parsers(sub, common)
    cli_service.add_parsers(sub, common)
    cli_logs.add_parsers(sub, common)
    cli_remote.add_parsers(sub, common)
    parser.command_names = frozenset(sub.choices)
    return parser


def _quantize_parsers(
    sub: Any, common: argparse.ArgumentParser, backend_flag: Callable[[Any], None]
) -> None:
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
        "--threads", type=_positive_int, dest="n_threads", help="CPU threads (default: cores)"
    )
    quantize.add_argument(
        "--no-report", action="store_true", help="skip the size / speed / perplexity report"
    )
    quantize.add_argument(
        "--eval-tokens",
        type=_positive_int,
        help="score only the first N tokens of the held-out text in the report (default: all)",
    )
    evaluate = sub.add_parser(
        "eval", parents=[common], help="perplexity of a model on the held-out text or a file"
    )
    evaluate.add_argument("model", help="model name, path or HF repo")
    evaluate.add_argument("--file", type=Path, help="a UTF-8 text file (default: the shipped text)")
    evaluate.add_argument(
        "--tokens", type=_positive_int, help="score only the first N tokens (default: all)"
    )
    evaluate.add_argument(
        "--window",
        type=_positive_int,
        default=512,
        help="tokens per evaluation window; the second half of each is scored (default: 512)",
    )
    evaluate.add_argument(
        "--threads", type=_positive_int, dest="n_threads", help="CPU threads (default: cores)"
    )
    backend_flag(evaluate)


def _setup_logging(level: str) -> None:
    logging.basicConfig(
        level=level.upper(), stream=sys.stderr, format="%(levelname)s %(name)s: %(message)s"
    )


_TOP_LEVEL = ("-h", "--help", "--version", "--log-level")


def _with_command(parser: _Parser, raw: list[str]) -> list[str]:
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
    args = parser.parse_args(raw)
    command = args.command or "chat"
    if args.command is None:
        args = parser.parse_args([*raw, "chat"])
    keys = (
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
        "deterministic",
        "no_auth",
    )
    if getattr(args, "model_flag", None):
        if args.model and args.model != args.model_flag:
            sys.stderr.write(
                f"localllm: error: two models named: {args.model} and --model {args.model_flag}\n"
            )
            return EXIT_USAGE
        args.model = args.model_flag
    flags = {k: getattr(args, k, None) for k in keys}
    flags["log_level"] = args.log_level
    try:
        settings = load_settings(flags)
    except ConfigError as exc:
        sys.stderr.write(f"localllm: error: {exc.message}\n")
        return EXIT_USAGE
    _setup_logging(settings.log_level)
    from localllm import cli_keys, cli_logs, cli_models, cli_quantize, cli_remote, cli_service

    handlers: dict[str, Callable[[Settings, argparse.Namespace], int]] = {
        "chat": cmd_chat,
        "serve": cmd_serve,
        "run": cmd_run,
        "list": cli_models.cmd_list,
        "info": cli_models.cmd_info,
        "convert": cli_models.cmd_convert,
        "ps": cli_models.cmd_ps,
        "rm": cli_models.cmd_rm,
        "pull": cli_models.cmd_pull,
        "quantize": cli_quantize.cmd_quantize,
        "eval": cli_quantize.cmd_eval,
        "keys": cli_keys.cmd_keys,
        "usage": cli_keys.cmd_usage,
        "service": cli_service.cmd_service,
        "show": cli_models.cmd_show,
        "load": cli_models.cmd_load,
        "stop": cli_models.cmd_stop,
        "completion": cmd_completion,
        "logs": cli_logs.cmd_logs,
        "remote": cli_remote.cmd_remote,
    }
    try:
        return handlers[command](settings, args)
    except (ModelNotFound, ConfigError, DamagedModel) as exc:
        sys.stderr.write(f"localllm: error: {exc.message}\n")
        return EXIT_USAGE
    except LocalLLMError as exc:
        sys.stderr.write(f"localllm: error: {exc.message}\n")
        return 1
    except KeyboardInterrupt:
        return 130


# -- commands -----------------------------------------------------------------------


def _read_prompt(args: argparse.Namespace) -> str:
    if args.prompt is None:
        raise _UsageError("run needs a prompt: localllm run \"your question\" (or '-' for stdin)")
    prompt = sys.stdin.read() if args.prompt == "-" else args.prompt
    if not prompt.strip():
        raise _UsageError("the prompt is empty")
    return str(prompt)


class _UsageError(Exception):
    pass


def cmd_run(settings: Settings, args: argparse.Namespace) -> int:
    from localllm.backends.base import Message, SamplingParams
    from localllm.engine.worker import Engine, Request

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
            if s.draft_proposed:
                speedup = f", {s.speedup:.2f}x plain speed" if s.speedup else ""
                sys.stderr.write(
                    f"speculative: {s.draft_accepted} of {s.draft_proposed} drafted tokens "
                    f"accepted ({s.draft_accepted / s.draft_proposed:.0%}){speedup}\n"
                )
    finally:
        engine.close()
    return 0


def cmd_completion(_settings: Settings, args: argparse.Namespace) -> int:
    """The shell code that completes localllm's commands and flags (argcomplete's)."""
    import argcomplete

    sys.stdout.write(argcomplete.shellcode(["localllm"], shell=args.shell))
    return 0


def cmd_chat(settings: Settings, args: argparse.Namespace) -> int:
    from localllm.engine.worker import Engine
    from localllm.history import History
    from localllm.tui.app import ChatApp

    engine: EngineClient = Engine(settings)
    try:
        if engine.remotes.find(settings.model) is None:  # a remote's model loads nothing
            engine.resolve(settings.model)  # a bad name fails now, with exit code 2
        history = History(settings.data_dir / "history.sqlite3")
        try:
            ChatApp(settings, engine, history=history, serve=not args.no_serve).run()
        finally:
            history.close()
    finally:
        engine.close()
    return 0


def cmd_serve(settings: Settings, args: argparse.Namespace) -> int:
    from localllm.engine.accounting import Accounting
    from localllm.engine.worker import Engine
    from localllm.server.runner import bind, check_exposure, make_server

    accounting = Accounting.for_settings(settings)
    try:
        check_exposure(settings, accounting)
    except ConfigError:
        accounting.close()
        raise
    engine: EngineClient = Engine(settings)
    engine.observe(accounting.observe)
    try:
        if engine.remotes.find(settings.model) is not None:
            raise ConfigError(
                f"{settings.model} is a remote engine's model: the server's default model "
                "is a local one; clients name the remote model in their requests"
            )
        ref = engine.resolve(settings.model)  # a bad name fails now, with exit code 2
        sock = bind(settings.host, settings.port)
    except LocalLLMError as exc:
        engine.close()
        accounting.close()
        if isinstance(exc, ConfigError):
            sys.stderr.write(f"localllm: error: {exc.message}\n")
            return EXIT_USAGE
        raise
    server = make_server(settings, engine, accounting)
    from localllm.server.guard import write_access_log

    write_access_log(sys.stderr)
    from localllm.cli_logs import write_file_log

    log_file = write_file_log(settings)
    events = logging.getLogger("localllm.serve")
    events.info("starting on %s (pid %d, log %s)", settings.base_url(), os.getpid(), log_file)
    failed: list[LocalLLMError] = []

    def load() -> None:
        try:
            engine.load(ref, progress=progress_printer(f"Loading {ref.name}"))
        except LocalLLMError as exc:
            failed.append(exc)
            server.request_exit()
            return
        sys.stderr.write(
            f"localllm: serving {ref.name} at {settings.base_url()} (Ctrl-C to stop)\n"
        )
        sys.stderr.flush()
        events.info("serving %s at %s", ref.name, settings.base_url())

    threading.Thread(target=load, name="localllm-load", daemon=True).start()
    signal.signal(signal.SIGTERM, lambda *_: server.request_exit())
    try:
        server.run(sockets=[sock])
    finally:
        engine.close()
        accounting.close()
    events.info("stopped")
    if failed:
        events.error("%s", failed[0].message)
        sys.stderr.write(f"localllm: error: {failed[0].message}\n")
        return 1
    return 0
