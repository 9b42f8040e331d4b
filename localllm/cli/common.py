"""What the command modules share: the parser that reports a bad flag in one line, flag
groups, argument types, exit codes, progress on stderr, tables, JSON, device names and
the running server's admin routes."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from localllm.config import (
    DEFAULT_PORT,
    KV_CACHE_TYPES,
    SPECULATE_MODES,
    Settings,
    load_settings,
    lora_spec,
)
from localllm.errors import ConfigError

if TYPE_CHECKING:
    from localllm.backends.base import ModelRef

EXIT_USAGE = 2


def positive_int(text: str) -> int:
    """An argparse type: a whole number of at least 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got '{text}'") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a number >= 1, got {value}")
    return value


# what `quantize`'s report and `eval` score unless told otherwise: about a minute for
# both of quantize's models on two cores with the starter (docs/benchmarks.md); the whole
# shipped text is ~40,000 tokens, most of an hour for a 7B model on a laptop
DEFAULT_EVAL_TOKENS = 4096


def token_count(text: str) -> int | None:
    """A positive number of tokens, or `all` (None: no bound)."""
    if text.strip().lower() == "all":
        return None
    return positive_int(text)


def progress_printer(label: str, *, piped: bool = False) -> Callable[[float], None] | None:
    """A one-line progress display on stderr where a person is watching; with piped=True,
    where nobody is (a log, CI), a plain line at every tenth of the way instead."""
    if not sys.stderr.isatty():
        return _progress_lines(label) if piped else None
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


def bounded_note(scored: int, text_tokens: int, limit: int | None, flag: str) -> str:
    """What a bounded perplexity left out, and the flag that scores it all ('' if none)."""
    if limit is None or limit >= text_tokens:
        return ""
    return f"; the first {limit:,} of its {text_tokens:,} tokens ({flag} all scores the whole)"


def _progress_lines(label: str) -> Callable[[float], None]:
    last = [-1]

    def show(fraction: float) -> None:
        tenth = int(fraction * 10)
        if tenth != last[0]:
            last[0] = tenth
            sys.stderr.write(f"{label}: {tenth * 10}%\n")
            sys.stderr.flush()

    return show


def device_of(backend: str) -> str:
    """Where a backend computes on this machine, without loading a model."""
    if backend == "mlx":
        from localllm.backends.mlx import mlx_device

        return mlx_device()
    from localllm.backends.llamacpp_native import gpu_offload
    from localllm.hardware import physical_cores

    offload = gpu_offload()
    return "gpu (all layers offloaded)" if offload else f"cpu ({physical_cores()} threads)"


class Parser(argparse.ArgumentParser):
    """argparse that reports a bad flag as one clear line (exit code 2)."""

    command_names: frozenset[str] = frozenset()  # the top-level parser's commands

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"localllm: error: {message} (see '{self.prog} --help')\n")


def temperature(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got '{text}'") from None
    if not 0.0 <= value <= 2.0:
        raise argparse.ArgumentTypeError(f"expected a value from 0 to 2, got {value}")
    return value


def port(text: str) -> int:
    value = positive_int(text)
    if value > 65535:
        raise argparse.ArgumentTypeError(f"a port is at most 65535, got {value}")
    return value


def model_flags(p: argparse.ArgumentParser, *, model_flag: str = "model") -> None:
    """The flags of a command that loads a model: which one (`--model`; `model_flag`
    names where it is stored), its context, threads, backend, and how it decodes."""
    if model_flag == "model":
        p.add_argument(
            "--model", "-m", help="model name, path to a .gguf, or HF repo (default: starter)"
        )
    else:
        p.add_argument(
            "--model",
            dest=model_flag,
            metavar="MODEL",
            help="the same, as a flag (localllm --model X)",
        )
    p.add_argument(
        "--ctx",
        type=positive_int,
        dest="n_ctx",
        help="context size in tokens (default: the trained context, as far as memory allows)",
    )
    p.add_argument(
        "--threads",
        type=positive_int,
        dest="n_threads",
        help="CPU threads (default: physical cores)",
    )
    backend_flag(p)
    kv_flag(p)
    lora_flag(p)
    p.add_argument(
        "--mmproj",
        type=existing_file,
        metavar="FILE",
        help="the model's projector (mmproj GGUF), to read images and audio (default: the "
        "one beside the model file)",
    )
    force_flag(p)
    speculate_flags(p)
    batch_flags(p)


def batch_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--parallel",
        type=positive_int,
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


def kv_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--kv-cache-type",
        choices=KV_CACHE_TYPES,
        help="what the KV cache stores: f16 (default), q8_0 (about half the memory) or "
        "q4_0 (about a quarter), for longer contexts in the same memory",
    )


def lora_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--lora",
        action="append",
        type=lora_arg,
        metavar="FILE[:SCALE]",
        help="a LoRA adapter for the model (GGUF; an mlx-lm adapter folder on MLX), at "
        "SCALE (default 1.0); repeat for several (ids 0, 1, ...); requests pick theirs with "
        '"lora": [{"id": 0, "scale": 0.5}]',
    )


def existing_file(text: str) -> str:
    if not Path(text).expanduser().is_file():
        raise argparse.ArgumentTypeError(f"there is no file at {text}")
    return str(Path(text).expanduser().resolve())


def lora_arg(text: str) -> str:
    """`--lora FILE[:SCALE]`, checked: the adapter exists and the scale is a number."""
    try:
        path, _scale = lora_spec(text)
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(exc.message) from None
    if not Path(path).exists():
        raise argparse.ArgumentTypeError(f"there is no LoRA adapter at {path}")
    return text


def backend_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--backend",
        choices=["auto", "llamacpp", "mlx"],
        help="auto (default): MLX on Apple Silicon, llama.cpp elsewhere",
    )


def server_flags(p: argparse.ArgumentParser) -> None:
    """Where the running server is (the commands that talk to it)."""
    p.add_argument("--host", help="the server's address (default: 127.0.0.1)")
    p.add_argument("--port", type=port, help=f"the server's port (default: {DEFAULT_PORT})")


def setup_logging(level: str) -> None:
    logging.basicConfig(
        level=level.upper(), stream=sys.stderr, format="%(levelname)s %(name)s: %(message)s"
    )


def print_json(value: Any) -> None:

    sys.stdout.write(json.dumps(value, indent=2) + "\n")


def print_table(rows: Sequence[Sequence[str]]) -> None:
    """Rows under a header row, in columns."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())


def configured_draft(settings: Settings) -> ModelRef | None:
    from localllm.engine.speculative import configured_draft
    from localllm.models.store import ModelStore

    return configured_draft(settings, ModelStore.from_settings(settings))


def admin(settings: Settings, route: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    """POST to a running server's admin route: (status, JSON body); status 0 when no
    server answers. It sends LOCALLLM_API_KEY when that is set, else the owner's secret
    (owner.key in the data folder, which this user alone can read and which the servers
    of that folder take as an admin key)."""
    import urllib.error
    import urllib.request

    from localllm.engine.accounting import owner_secret

    url = settings.base_url().removesuffix("/v1") + route
    headers = {"Content-Type": "application/json"}
    key = os.environ.get("LOCALLLM_API_KEY") or owner_secret(settings.data_dir)
    headers["Authorization"] = f"Bearer {key}"
    req = urllib.request.Request(url, json.dumps(body).encode(), headers, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=600) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        try:
            return exc.code, json.loads(exc.read() or b"{}")
        except ValueError:
            return exc.code, {}
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        return 0, {"error": {"message": f"no localllm server answers at {url} ({reason})"}}


def admin_failed(status: int, body: dict[str, Any]) -> int:
    message = (body.get("error") or {}).get("message") or f"the server answered {status}"
    if status == 401:
        message += " (set LOCALLLM_API_KEY to a key from `localllm keys add`)"
    sys.stderr.write(f"localllm: error: {message}\n")
    return 1


def origin(ref: ModelRef, models_dir: Path) -> str:
    """The SOURCE column: where a model lives, for a quantization what it was made from,
    for a pull the repository (the name it was pulled by runs too)."""
    from localllm.models.quantize import quantized_from
    from localllm.models.store import pulled_from

    if ref.source != "store":
        return ref.source
    made = quantized_from(ref.path if ref.path.is_dir() else ref.path.parent)
    if made:
        return f"store: {made}"
    repo = pulled_from(ref, models_dir)
    return f"pulled: {repo}" if repo else ref.source


def sampling_line(rec: Any) -> str:
    """The recommended values and where they came from; the rest are localllm's."""
    from localllm.backends.base import SamplingParams

    if not rec.values:
        p = SamplingParams()
        return (
            f"localllm's defaults (temperature {p.temperature}, top_p {p.top_p}, "
            f"top_k {p.top_k}, min_p {p.min_p}): the model recommends none"
        )
    said = ", ".join(
        f"{k} {str(v).lower() if isinstance(v, bool) else format(v, 'g')}"
        for k, v in rec.values.items()
    )
    return f"{said} from {rec.source}; the rest localllm's defaults"


# -- the config file -------------------------------------------------------------------------
def write_config(path: Path, change: Any) -> Any:
    """Apply `change` to the config document (tomlkit: the user's comments and order
    stay) and write it back whole (fsguard: through a symlink, one rename, a temporary
    name no one else made), once the new text has been read back as settings in a
    private folder (a change that would not load leaves the old file); the change's
    result. PathRefused when the file cannot be read or written."""
    import tempfile

    import tomlkit

    from localllm.fsguard import read_user_file, write_user_file

    text = read_user_file(path) or ""
    try:
        doc = tomlkit.parse(text)
    except tomlkit.exceptions.ParseError as exc:
        raise ConfigError(f"Cannot read config file {path}: {exc}") from None
    result = change(doc)
    new = tomlkit.dumps(doc)
    with tempfile.TemporaryDirectory(prefix="localllm-config-") as private:
        trial = Path(private) / "config.toml"
        trial.write_text(new, encoding="utf-8")
        load_settings(env={**os.environ, "LOCALLLM_CONFIG": str(trial)})
    if new != text:
        write_user_file(path, new, backup=False)
    return result


def drop_table(doc: Any, key: str, name: str) -> bool:
    """Remove the [[key]] table named `name`; False when the file has none."""
    tables = doc.get(key)
    if tables is None:
        return False
    keep = [t for t in tables if t.get("name") != name]
    if len(keep) == len(tables):
        return False
    if keep:
        import tomlkit

        doc[key] = tomlkit.aot()
        for t in keep:
            doc[key].append(t)
    else:
        del doc[key]
    return True
