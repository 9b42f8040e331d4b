"""Settings, built once: defaults < TOML file < LOCALLLM_* environment < flags.

The TOML file is `config.toml` in the user config directory, or the file named
by `LOCALLLM_CONFIG`. Keys are the field names of `Settings`, for example::

    port = 8642
    model = "starter"
    n_ctx = 4096
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import math
import os
import sys
import typing
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


@dataclass(frozen=True, slots=True)
class Remote:
    """An OpenAI-compatible engine localllm fronts (vLLM, SGLang, TGI, llama-server):
    its models are served as NAME/MODEL. The API key is read from the environment
    variable `api_key_env` when a request is sent; it is never written anywhere."""

    name: str
    url: str  # the engine's OpenAI base URL, e.g. http://gpu-box:8000/v1
    api_key_env: str | None = None
    models: tuple[str, ...] = ()  # the models to expose; empty: whatever the engine lists
    fallback: str | None = None  # a local model that answers while the engine is down
    connect_timeout_s: float = 3.0
    read_timeout_s: float = 300.0  # the longest silence between two streamed pieces
    retries: int = 2  # further tries after a 429 or 503 (Retry-After is honoured)
    failures_to_trip: int = 3  # consecutive failures before the engine is marked down
    down_for_s: float = 30.0  # how long it stays marked down before one request tries again


@dataclass(frozen=True, slots=True)
class RouteRule:
    """One rule of `model: "auto"` routing. A request matches when every condition given
    holds; the first matching rule names the model (local, or a remote's NAME/MODEL)."""

    model: str
    min_prompt_chars: int | None = None  # the prompt's text, messages together
    max_prompt_chars: int | None = None
    tools: bool | None = None  # the request offers tools (true) or none (false)
    json_schema: bool | None = None  # it asks for structured output
    priority: str | None = None  # "high" or "normal"
    client: str | None = None  # the API key's name ("chat" for the terminal chat)


@dataclass(frozen=True, slots=True)
class McpServer:
    """An MCP server whose tools the chat may offer its model (TOML: [[mcp_servers]]):
    a command started over stdio, or the URL of a streamable-HTTP server. Its tools are
    off until the user turns them on for a conversation, and each call is approved."""

    name: str
    command: str | None = None
    args: tuple[str, ...] = ()
    url: str | None = None
    # added to the command's environment (which holds only HOME, PATH and a few more of
    # this process's variables: the mcp SDK's rule)
    env: dict[str, str] = field(default_factory=dict)
    enabled: bool = True


# the chat's built-in tools (agent/builtin.py), as `chat_tools` names them
BUILTIN_TOOLS = ("read_file", "list_folder", "search_files", "edit_file", "run_command")
MAX_AGENT_STEPS = 100

MAX_KEEP_ALIVE_S = 366 * 24 * 3600  # a keep-alive longer than a year is a mistake
KV_CACHE_TYPES = ("f16", "q8_0", "q4_0")  # what one KV element is stored as
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
    kv_cache_type: str = "f16"  # f16 | q8_0 | q4_0: a quantized KV cache fits longer contexts
    deterministic: bool = False  # requests run alone, output independent of the cache
    max_body_bytes: int = 8 * 1024 * 1024
    stream_interval_ms: int = 20  # a stream frames at most this often (first at once); n open: n x
    prompt_cache_ram_mb: int | None = None  # None: a quarter of available memory, <= 8 GiB
    prompt_cache_disk_mb: int = 2048  # 0 turns the disk tier off
    context_policy: str = "error"  # API prompts over the context: error | truncate-oldest
    max_loaded_models: int = 3  # models resident at once (the default + on-demand ones)
    keep_alive_s: int = 300  # idle seconds before an on-demand model unloads; -1: never
    memory_budget_mb: int | None = None  # all loaded models together; None: what is free
    force_load: bool = False  # load even when the estimate says it will not fit
    speculate: str = "auto"  # off | lookup | draft | auto (lookup, or the draft model if set)
    draft_model: str | None = None  # a smaller model with the target's vocabulary
    # LoRA adapters the default model (`model`) loads with: "FILE" or "FILE:SCALE" each,
    # ids 0, 1, ... in this order (engine/adapters.py)
    lora: tuple[str, ...] = ()
    # the projector (mmproj GGUF) the default model reads images and audio with; None: the
    # one beside the model file, if any (models/projector.py)
    mmproj: str | None = None
    # image_url parts with http(s) URLs are fetched only when this is on (offline default)
    fetch_image_urls: bool = False
    log_level: str = "warning"
    # security (see server/guard.py): Host names served besides loopback, the bound
    # address and IP literals ("*": any); browser origins allowed besides loopback and IDE
    # webviews ("*": any, "scheme://*": any of that scheme); model paths over the API
    allowed_hosts: tuple[str, ...] = ()
    allowed_origins: tuple[str, ...] = ()
    allow_model_paths: bool = False
    no_auth: bool = False  # serve a non-loopback address with no API key
    drain_s: float = 10.0  # on SIGTERM, seconds to let running answers finish
    # a stream whose client takes none of it for this long gives its sequence up when
    # another request waits for one (it is paused, not decoded, as soon as it falls behind)
    stall_timeout_s: float = 30.0
    header_timeout_s: float = 10.0  # a connection's request head must arrive within this
    body_timeout_s: float = 120.0  # and its body within this (8 MiB at 1 Mbit/s: 67 s)
    max_connections_per_client: int = 128  # open connections from one address
    data_dir: Path = field(default_factory=_data_dir)
    cache_dir: Path = field(default_factory=_cache_dir)
    lmstudio_dir: Path = field(default_factory=_lmstudio_dir)  # models used where they lie
    ollama_dir: Path = field(default_factory=_ollama_dir)
    # engines elsewhere (TOML: [[remotes]] tables) and the rules of model "auto" ([[routes]])
    remotes: tuple[Remote, ...] = ()
    routes: tuple[RouteRule, ...] = ()
    # the chat as an agent: the built-in tools a new conversation starts with (none: each
    # is turned on in F4), MCP servers ([[mcp_servers]]), and the tool calls an answer
    # may make before the chat stops it
    chat_tools: tuple[str, ...] = ()
    mcp_servers: tuple[McpServer, ...] = ()
    agent_steps: int = 8

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


_TABLES: dict[str, type] = {"remotes": Remote, "routes": RouteRule, "mcp_servers": McpServer}


def _tables(name: str, value: Any, source: str) -> tuple[Any, ...]:
    """A list of tables (TOML [[name]], or a JSON list in the environment), each checked
    against its dataclass: a scalar, an unknown key or a wrong type is one line naming
    the key and where it came from."""
    import json

    import pydantic

    if isinstance(value, str) and source.startswith(ENV_PREFIX):  # JSON in the environment
        try:
            value = json.loads(value)
        except ValueError as exc:
            raise ConfigError(f"{source}: {name} is not a JSON list of tables ({exc})") from None
    if not isinstance(value, list):
        raise ConfigError(
            f"{source}: {name} must be a list of tables ([[{name}]] in TOML), "
            f"got {type(value).__name__} {value!r}"
        )
    kind = _TABLES[name]
    adapter: pydantic.TypeAdapter[Any] = pydantic.TypeAdapter(kind)
    known = [f.name for f in dataclasses.fields(kind)]
    items = []
    for i, table in enumerate(value):
        if not isinstance(table, dict):
            raise ConfigError(f"{source}: {name}[{i}] must be a table, got {table!r}")
        unknown = sorted(set(table) - set(known))
        if unknown:
            raise ConfigError(
                f"{source}: {name}[{i}] has unknown key(s) {', '.join(unknown)}; "
                f"known: {', '.join(known)}"
            )
        try:
            items.append(adapter.validate_python(table))
        except pydantic.ValidationError as exc:
            err = exc.errors()[0]
            where = ".".join(str(p) for p in err["loc"]) or "(table)"
            said = err["msg"].replace("tuple", "list")
            raise ConfigError(
                f"{source}: {name}[{i}].{where}: {said} (got {err.get('input')!r})"
            ) from None
    return tuple(items)


# -- the layers, through pydantic-settings ---------------------------------------------------
# Settings stays a plain frozen dataclass inside the app (see the house style); loading it
# is pydantic-settings' job: one source per layer (flags, then LOCALLLM_* variables, then
# the TOML file, over the defaults), each field validated against its annotated type.
# Each source checks its own values first, so that an error names the key and the file
# or variable it came from (pydantic reports only the merged result).


@functools.cache
def _types() -> dict[str, Any]:
    """Each setting's type, the annotations resolved (Path, int | None, tuple[Remote, ...])."""
    return typing.get_type_hints(Settings)


@functools.cache
def _adapter(name: str) -> Any:
    import pydantic

    return pydantic.TypeAdapter(_types()[name])


def _checked(name: str, value: Any, source: str) -> Any:
    """A value from the TOML file or the environment, as the setting's type."""
    import pydantic

    if value is None:
        return None
    if name in _TABLES:
        return _tables(name, value, source)
    kind = _types()[name]
    if kind is Path or kind == Path | None:
        value = Path(str(value)).expanduser()
    elif str(kind).startswith("tuple"):  # a list of strings: TOML list, or commas in env
        if not source.startswith(ENV_PREFIX) and not isinstance(value, list):
            raise ConfigError(
                f'{source}: {name} must be a list of strings (as {name} = ["a", "b"]), '
                f"got {value!r}"
            )
        items = value.split(",") if isinstance(value, str) else value
        if isinstance(items, list | tuple):
            value = tuple(str(v).strip() for v in items if str(v).strip())
    elif isinstance(value, bool) and bool not in typing.get_args(kind) and kind is not bool:
        raise ConfigError(f"{source}: {name} = {value!r} is not valid (a boolean is not a number)")
    try:
        return _adapter(name).validate_python(value)
    except pydantic.ValidationError as exc:
        said = exc.errors()[0]["msg"].replace("tuple", "list")
        raise ConfigError(f"{source}: {name} = {value!r} is not valid ({said})") from None


def _from_text(name: str, text: str) -> Any:
    """An environment variable's text for a setting: None-words for optional numbers."""
    kind = _types()[name]
    optional = type(None) in typing.get_args(kind)
    if optional and text.strip().lower() in ("", "none", "auto"):
        return None
    return text


def config_path(env: Mapping[str, str]) -> Path:
    """The TOML file to read: LOCALLLM_CONFIG, else config.toml in the user config dir."""
    explicit = env.get(ENV_PREFIX + "CONFIG")
    if explicit:
        return Path(explicit).expanduser()
    return Path(platformdirs.user_config_dir(APP_NAME)) / "config.toml"


def _sources(env: Mapping[str, str], path: Path) -> tuple[Any, Any]:
    """The environment and TOML sources for this load (a mapping and a file of its own,
    so tests and the CLI load without touching os.environ)."""
    from pydantic_settings import PydanticBaseSettingsSource, TomlConfigSettingsSource

    class EnvSource(PydanticBaseSettingsSource):
        """LOCALLLM_<KEY> variables."""

        def get_field_value(self, field: Any, field_name: str) -> tuple[Any, str, bool]:
            key = ENV_PREFIX + field_name.upper()
            return env.get(key), key, False

        def __call__(self) -> dict[str, Any]:
            values = {}
            for name in _FIELDS:
                text, key, _ = self.get_field_value(None, name)
                if text is not None:
                    values[name] = _checked(name, _from_text(name, text), key)
            return values

    class TomlSource(TomlConfigSettingsSource):
        """config.toml: unknown keys and unreadable files are refused, naming the file."""

        def __call__(self) -> dict[str, Any]:
            raw = super().__call__()
            unknown = sorted(set(raw) - set(_FIELDS))
            if unknown:
                raise ConfigError(
                    f"Unknown key(s) in {path}: {', '.join(unknown)}. "
                    f"Known keys: {', '.join(_FIELDS)}."
                )
            return {k: _checked(k, v, str(path)) for k, v in raw.items()}

    def toml(settings_cls: Any) -> Any:
        if path.is_dir():  # (/dev/null, the way to say "no config file", reads as empty)
            raise ConfigError(f"Cannot read config file {path}: it is a folder")
        try:
            return TomlSource(settings_cls, toml_file=path)
        except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
            raise ConfigError(f"Cannot read config file {path}: {exc}") from None

    return EnvSource, toml


def _layered(env: Mapping[str, str], path: Path) -> Any:
    """A pydantic-settings class with Settings' fields and this load's sources."""
    import pydantic
    from pydantic_settings import BaseSettings, SettingsConfigDict

    env_source, toml_source = _sources(env, path)

    class Layers(BaseSettings):
        model_config = SettingsConfigDict(extra="forbid", frozen=True)

        @classmethod
        def settings_customise_sources(
            cls,
            settings_cls: Any,
            init_settings: Any,
            env_settings: Any,
            dotenv_settings: Any,
            file_secret_settings: Any,
        ) -> tuple[Any, ...]:
            # first wins: flags (the init arguments), LOCALLLM_*, config.toml; then defaults
            return (init_settings, env_source(settings_cls), toml_source(settings_cls))

    fields: dict[str, Any] = {}
    for f in dataclasses.fields(Settings):
        if f.default_factory is not dataclasses.MISSING:
            fields[f.name] = (_types()[f.name], pydantic.Field(default_factory=f.default_factory))
        else:
            fields[f.name] = (_types()[f.name], f.default)
    return pydantic.create_model("LocalllmSettings", __base__=Layers, **fields)


def load_settings(
    flags: Mapping[str, Any] | None = None, *, env: Mapping[str, str] | None = None
) -> Settings:
    """Build Settings from defaults, the TOML file, the environment and flags (in that order).

    Flags whose value is None are treated as not given.
    """
    import pydantic

    env = os.environ if env is None else env
    given = {k: v for k, v in (flags or {}).items() if v is not None}
    for key in given:
        if key not in _FIELDS:
            raise ConfigError(f"Unknown setting '{key}'")
    try:
        layers = _layered(env, config_path(env))(**given)
    except pydantic.ValidationError as exc:  # a flag of the wrong type (the CLI checks them)
        err = exc.errors()[0]
        raise ConfigError(f"{err['loc'][0]}: {err['msg']} (got {err.get('input')!r})") from None
    settings = Settings(**{name: getattr(layers, name) for name in _FIELDS})
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
    if s.kv_cache_type not in KV_CACHE_TYPES:
        raise ConfigError(
            f"kv_cache_type must be one of {', '.join(KV_CACHE_TYPES)}, got '{s.kv_cache_type}'"
        )
    if s.mmproj is not None and not Path(s.mmproj).expanduser().is_file():
        raise ConfigError(f"mmproj: there is no projector file at {s.mmproj}")
    for spec in s.lora:
        path, _scale = lora_spec(spec)
        if not Path(path).exists():
            raise ConfigError(f"lora: there is no LoRA adapter at {path}")
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
    for key in ("stall_timeout_s", "header_timeout_s", "body_timeout_s"):
        if not 0.1 <= getattr(s, key) <= 3600:
            raise ConfigError(f"{key} must be 0.1 to 3600 seconds, got {getattr(s, key)}")
    if not 1 <= s.max_connections_per_client <= 65536:
        raise ConfigError(
            f"max_connections_per_client must be 1 to 65536, got {s.max_connections_per_client}"
        )
    _validate_remotes(s)
    _validate_agent(s)
    if s.max_body_bytes < 1024:
        raise ConfigError(f"max_body_bytes must be at least 1024, got {s.max_body_bytes}")


def _validate_remotes(s: Settings) -> None:
    names = [r.name for r in s.remotes]
    for r in s.remotes:
        if not r.name or "/" in r.name or names.count(r.name) > 1:
            raise ConfigError(
                f"remote name {r.name!r} must be unique, non-empty and without '/' "
                f"(its models are named {r.name or 'NAME'}/MODEL)"
            )
        if not r.url.startswith(("http://", "https://")):
            raise ConfigError(f"remote '{r.name}': url must start with http:// or https://")
        if r.retries < 0 or r.failures_to_trip < 1 or r.down_for_s < 0:
            raise ConfigError(
                f"remote '{r.name}': retries >= 0, failures_to_trip >= 1 and down_for_s >= 0, "
                f"got {r.retries}, {r.failures_to_trip}, {r.down_for_s}"
            )
    for i, rule in enumerate(s.routes):
        if rule.priority not in (None, "high", "normal"):
            raise ConfigError(f"routes[{i}].priority must be high or normal, got {rule.priority!r}")
        if rule.model == "auto":
            raise ConfigError(f"routes[{i}].model cannot be auto (it would route to itself)")


def _validate_agent(s: Settings) -> None:
    unknown = [t for t in s.chat_tools if t not in BUILTIN_TOOLS]
    if unknown:
        raise ConfigError(
            f"chat_tools: {', '.join(unknown)} is not a built-in tool; "
            f"they are {', '.join(BUILTIN_TOOLS)}"
        )
    if not 1 <= s.agent_steps <= MAX_AGENT_STEPS:
        raise ConfigError(f"agent_steps must be 1 to {MAX_AGENT_STEPS}, got {s.agent_steps}")
    names = collections.Counter(m.name for m in s.mcp_servers)
    for m in s.mcp_servers:
        if not m.name or not m.name.replace("-", "").replace("_", "").isalnum():
            raise ConfigError(
                f"mcp server name {m.name!r}: letters, digits, - and _ only (its tools are "
                "offered as NAME__TOOL)"
            )
        if names[m.name] > 1:
            raise ConfigError(f"mcp server name {m.name!r} is given {names[m.name]} times")
        if (m.command is None) == (m.url is None):
            raise ConfigError(
                f"mcp server '{m.name}': give a command (stdio) or a url (streamable HTTP), "
                "one of the two"
            )
        if m.url is not None and not m.url.startswith(("http://", "https://")):
            raise ConfigError(f"mcp server '{m.name}': url must start with http:// or https://")


def lora_spec(text: str) -> tuple[str, float]:
    """A LoRA adapter as `FILE` or `FILE:SCALE` (scale 1.0 when not given; a colon followed
    by something that is not a number belongs to the path, as in C:\\lora.gguf)."""
    path, sep, tail = text.rpartition(":")
    if not sep or not path:
        return text, 1.0
    try:
        scale = float(tail)
    except ValueError:
        return text, 1.0
    if not math.isfinite(scale):
        raise ConfigError(f"lora: the scale in {text!r} must be a finite number")
    return path, scale
