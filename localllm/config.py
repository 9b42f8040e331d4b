"""Settings, built once: defaults < TOML file < LOCALLLM_* environment < flags.

The TOML file is `config.toml` in the user config directory, or the file named
by `LOCALLLM_CONFIG`. Keys are the field names of `Settings`, for example::

    port = 8642
    model = "starter"
    n_ctx = 4096
"""

from __future__ import annotations

import dataclasses
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import platformdirs

from localllm.errors import ConfigError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

APP_NAME = "localllm"
DEFAULT_PORT = 8642
ENV_PREFIX = "LOCALLLM_"


def _data_dir() -> Path:
    return Path(platformdirs.user_data_dir(APP_NAME))


def _cache_dir() -> Path:
    return Path(platformdirs.user_cache_dir(APP_NAME))


def _lmstudio_dir() -> Path:
    return Path.home() / ".lmstudio" / "models"


def _ollama_dir() -> Path:
    explicit = os.environ.get("OLLAMA_MODELS")
    return Path(explicit).expanduser() if explicit else Path.home() / ".ollama" / "models"


MAX_KEEP_ALIVE_S = 366 * 24 * 3600  # a keep-alive longer than a year is a mistake
DEFAULT_PARALLEL = 4  # sequences per model when the `parallel` setting is not given
SPECULATE_MODES = ("off", "lookup", "draft", "auto")  # speculative decoding


@dataclass(frozen=True, slots=True)
class Settings:
    """Everything configurable. Passed explicitly; never a module-level singleton."""

    host: str = "127.0.0.1"
    port: int = DEFAULT_PORT
    model: str = "starter"
    backend: str = "auto"  # auto | llamacpp | mlx
    n_ctx: int | None = None  # None: the trained context, halved while it does not fit
    n_threads: int | None = None  # None: physical cores
    n_gpu_layers: int = -1  # -1: every layer when the build can offload
    max_queue: int = 16  # requests waiting or running before 503
    parallel: int | None = None  # sequences decoded together per model; None: 4 if they fit
    deterministic: bool = False  # requests run alone, output independent of the cache
    max_body_bytes: int = 8 * 1024 * 1024
    stream_interval_ms: int = 20  # streamed text is framed at most this often (first at once)
    prompt_cache_ram_mb: int | None = None  # None: a quarter of available memory, <= 8 GiB
    prompt_cache_disk_mb: int = 2048  # 0 turns the disk tier off
    context_policy: str = "error"  # API prompts over the context: error | truncate-oldest
    max_loaded_models: int = 3  # models resident at once (the default + on-demand ones)
    keep_alive_s: int = 300  # idle seconds before an on-demand model unloads; -1: never
    memory_budget_mb: int | None = None  # all loaded models together; None: what is free
    force_load: bool = False  # load even when the estimate says it will not fit
    speculate: str = "auto"  # off | lookup | draft | auto (lookup, or the draft model if set)
    draft_model: str | None = None  # a smaller model with the target's vocabulary
    log_level: str = "warning"
    # security (see server/guard.py): Host names served besides loopback, the bound
    # address and IP literals ("*": any); browser origins allowed besides loopback and IDE
    # webviews ("*": any, "scheme://*": any of that scheme); model paths over the API
    allowed_hosts: tuple[str, ...] = ()
    allowed_origins: tuple[str, ...] = ()
    allow_model_paths: bool = False
    no_auth: bool = False  # serve a non-loopback address with no API key
    drain_s: float = 10.0  # on SIGTERM, seconds to let running answers finish
    data_dir: Path = field(default_factory=_data_dir)
    cache_dir: Path = field(default_factory=_cache_dir)
    lmstudio_dir: Path = field(default_factory=_lmstudio_dir)  # models used where they lie
    ollama_dir: Path = field(default_factory=_ollama_dir)

    @property
    def models_dir(self) -> Path:
        """Where the model store keeps its models."""
        return self.data_dir / "models"

    def base_url(self) -> str:
        host = "127.0.0.1" if self.host in ("0.0.0.0", "") else self.host
        if ":" in host:
            host = f"[{host}]"
        return f"http://{host}:{self.port}/v1"


_FIELDS = {f.name: f for f in dataclasses.fields(Settings)}


def _coerce(name: str, value: Any, source: str) -> Any:
    """Turn a TOML or environment value into the field's type, or raise ConfigError."""
    if value is None:
        return None
    kind = str(_FIELDS[name].type)
    try:
        if kind.startswith("tuple"):
            items = value.split(",") if isinstance(value, str) else value
            if not isinstance(items, list | tuple):
                raise ValueError("expected a list of strings")
            return tuple(str(v).strip() for v in items if str(v).strip())
        if kind == "float":
            if isinstance(value, bool):
                raise ValueError("a boolean is not a number")
            return float(value)
        if "Path" in kind:
            return Path(str(value)).expanduser()
        if kind == "bool":
            if isinstance(value, bool):
                return value
            word = str(value).strip().lower()
            if word not in ("true", "false", "1", "0", "yes", "no"):
                raise ValueError("expected true or false")
            return word in ("true", "1", "yes")
        if "int" in kind:
            if isinstance(value, bool):
                raise ValueError("a boolean is not a number")
            blank = isinstance(value, str) and value.strip().lower() in ("", "none", "auto")
            if blank and "None" in kind:
                return None
            return int(value)
        return str(value)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{source}: {name} = {value!r} is not valid ({exc})") from None


def config_path(env: Mapping[str, str]) -> Path:
    """The TOML file to read: LOCALLLM_CONFIG, else config.toml in the user config dir."""
    explicit = env.get(ENV_PREFIX + "CONFIG")
    if explicit:
        return Path(explicit).expanduser()
    return Path(platformdirs.user_config_dir(APP_NAME)) / "config.toml"


def _from_file(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"Cannot read config file {path}: {exc}") from None
    unknown = sorted(set(raw) - set(_FIELDS))
    if unknown:
        raise ConfigError(
            f"Unknown key(s) in {path}: {', '.join(unknown)}. Known keys: {', '.join(_FIELDS)}."
        )
    return {k: _coerce(k, v, str(path)) for k, v in raw.items()}


def _from_env(env: Mapping[str, str]) -> dict[str, Any]:
    values = {}
    for name in _FIELDS:
        key = ENV_PREFIX + name.upper()
        if key in env:
            values[name] = _coerce(name, env[key], key)
    return values


def load_settings(
    flags: Mapping[str, Any] | None = None, *, env: Mapping[str, str] | None = None
) -> Settings:
    """Build Settings from defaults, the TOML file, the environment and flags (in that order).

    Flags whose value is None are treated as not given.
    """
    env = os.environ if env is None else env
    values: dict[str, Any] = {}
    values.update(_from_file(config_path(env)))
    values.update(_from_env(env))
    for key, value in (flags or {}).items():
        if value is None:
            continue
        if key not in _FIELDS:
            raise ConfigError(f"Unknown setting '{key}'")
        values[key] = value
    settings = Settings(**values)
    _validate(settings)
    return settings


def _validate(s: Settings) -> None:
    if s.context_policy not in ("error", "truncate-oldest"):
        raise ConfigError(
            f"context_policy must be error or truncate-oldest, got '{s.context_policy}'"
        )
    if s.prompt_cache_ram_mb is not None and s.prompt_cache_ram_mb < 0:
        raise ConfigError(f"prompt_cache_ram_mb must be 0 or more, got {s.prompt_cache_ram_mb}")
    if s.prompt_cache_disk_mb < 0:
        raise ConfigError(f"prompt_cache_disk_mb must be 0 or more, got {s.prompt_cache_disk_mb}")
    if s.speculate not in SPECULATE_MODES:
        raise ConfigError(
            f"speculate must be one of {', '.join(SPECULATE_MODES)}, got '{s.speculate}'"
        )
    if s.backend not in ("auto", "llamacpp", "mlx"):
        raise ConfigError(f"backend must be auto, llamacpp or mlx, got '{s.backend}'")
    if not 0 < s.port < 65536:
        raise ConfigError(f"port must be between 1 and 65535, got {s.port}")
    if s.n_ctx is not None and s.n_ctx < 16:
        raise ConfigError(f"n_ctx must be at least 16 tokens, got {s.n_ctx}")
    if s.n_threads is not None and s.n_threads < 1:
        raise ConfigError(f"n_threads must be at least 1, got {s.n_threads}")
    if s.max_loaded_models < 1:
        raise ConfigError(f"max_loaded_models must be at least 1, got {s.max_loaded_models}")
    if s.memory_budget_mb is not None and s.memory_budget_mb < 1:
        raise ConfigError(f"memory_budget_mb must be at least 1, got {s.memory_budget_mb}")
    if s.parallel is not None and not 1 <= s.parallel <= 64:
        raise ConfigError(f"parallel must be 1 to 64, got {s.parallel}")
    if s.max_queue < 1:
        raise ConfigError(f"max_queue must be at least 1, got {s.max_queue}")
    if not 0 <= s.stream_interval_ms <= 1000:
        raise ConfigError(f"stream_interval_ms must be 0 to 1000, got {s.stream_interval_ms}")
    if not (s.keep_alive_s == -1 or 0 <= s.keep_alive_s <= MAX_KEEP_ALIVE_S):
        raise ConfigError(
            f"keep_alive_s must be -1 (never unload) or 0 to {MAX_KEEP_ALIVE_S}, "
            f"got {s.keep_alive_s}"
        )
    if not 0 <= s.drain_s <= 3600:
        raise ConfigError(f"drain_s must be 0 to 3600 seconds, got {s.drain_s}")
    if s.max_body_bytes < 1024:
        raise ConfigError(f"max_body_bytes must be at least 1024, got {s.max_body_bytes}")
