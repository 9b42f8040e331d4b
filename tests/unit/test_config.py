import dataclasses
import json
from pathlib import Path

import pytest

from localllm.config import DEFAULT_PORT, McpServer, Remote, RouteRule, Settings, load_settings
from localllm.errors import ConfigError


def test_precedence_defaults_file_env_flags(tmp_path: Path):
    cfg = tmp_path / "c.toml"
    cfg.write_text('port = 9001\nmodel = "from-file"\nn_ctx = 1024\n')
    env = {"LOCALLLM_CONFIG": str(cfg), "LOCALLLM_PORT": "9002"}
    s = load_settings({"model": "from-flag", "n_ctx": None}, env=env)
    assert s.port == 9002  # env beats file
    assert s.model == "from-flag"  # flag beats file
    assert s.n_ctx == 1024  # file beats default; a None flag is "not given"
    assert s.host == "127.0.0.1"


def test_defaults_without_file(tmp_path: Path):
    s = load_settings(env={"LOCALLLM_CONFIG": str(tmp_path / "missing.toml")})
    assert s.port == DEFAULT_PORT
    assert DEFAULT_PORT not in (8000, 8080)
    assert s.model == "starter"
    assert s.n_ctx is None


def test_bad_values_name_the_key_and_value(tmp_path: Path):
    env = {"LOCALLLM_CONFIG": str(tmp_path / "x.toml"), "LOCALLLM_PORT": "eighty"}
    with pytest.raises(ConfigError, match="LOCALLLM_PORT: port = 'eighty'"):
        load_settings(env=env)
    with pytest.raises(ConfigError, match="between 1 and 65535, got 70000"):
        load_settings({"port": 70000}, env={"LOCALLLM_CONFIG": str(tmp_path / "x.toml")})


def test_unknown_key_and_broken_toml_are_reported(tmp_path: Path):
    cfg = tmp_path / "c.toml"
    cfg.write_text("prot = 1\n")
    with pytest.raises(ConfigError, match="Unknown key"):
        load_settings(env={"LOCALLLM_CONFIG": str(cfg)})
    cfg.write_text("port = \n")
    with pytest.raises(ConfigError, match="Cannot read config file"):
        load_settings(env={"LOCALLLM_CONFIG": str(cfg)})


# One value per layer for every setting (file, environment, flag), each valid for it.
HERE = Path(__file__).parent
LAYER_VALUES: dict[str, tuple[object, str, object]] = {
    "host": ("10.0.0.1", "10.0.0.2", "10.0.0.3"),
    "port": (9001, "9002", 9003),
    "model": ("a", "b", "c"),
    "backend": ("llamacpp", "mlx", "auto"),
    "n_ctx": (1024, "2048", 4096),
    "n_threads": (1, "2", 3),
    "n_gpu_layers": (0, "10", 20),
    "max_queue": (2, "3", 4),
    "parallel": (2, "3", 5),
    "kv_cache_type": ("q8_0", "q4_0", "f16"),
    "deterministic": (True, "false", True),
    "max_body_bytes": (2048, "4096", 8192),
    "stream_interval_ms": (10, "30", 50),
    "prompt_cache_ram_mb": (10, "20", 30),
    "prompt_cache_disk_mb": (0, "100", 200),
    "context_policy": ("truncate-oldest", "error", "truncate-oldest"),
    "max_loaded_models": (1, "2", 4),
    "keep_alive_s": (-1, "60", 120),
    "memory_budget_mb": (100, "200", 300),
    "force_load": (True, "no", True),
    "speculate": ("off", "lookup", "draft"),
    "draft_model": ("d1", "d2", "d3"),
    "lora": (["/dev/null:0.5"], "/dev/null, /dev/null:2", ("/dev/null",)),  # files that exist
    "mmproj": (__file__, str(HERE / "__init__.py"), str(HERE / "test_cli.py")),  # files
    "fetch_image_urls": (True, "false", True),
    "log_level": ("info", "debug", "error"),
    "allowed_hosts": (["a.test"], "b.test, c.test", ("d.test",)),
    "allowed_origins": (["https://a.test"], "https://b.test", ("*",)),
    "allow_model_paths": (True, "0", True),
    "no_auth": (True, "yes", False),
    "drain_s": (1.5, "2.5", 3.0),
    "stall_timeout_s": (5.0, "6.5", 7.0),
    "header_timeout_s": (2.0, "3.5", 4.0),
    "body_timeout_s": (30.0, "45.5", 60.0),
    "max_connections_per_client": (10, "20", 30),
    "data_dir": ("~/d1", "~/d2", Path("/d3")),
    "cache_dir": ("/c1", "/c2", Path("/c3")),
    "lmstudio_dir": ("/l1", "/l2", Path("/l3")),
    "ollama_dir": ("/o1", "/o2", Path("/o3")),
    "remotes": ([{"name": "f", "url": "http://f/v1"}], '[{"name": "e", "url": "http://e/v1"}]',
                (Remote("g", "http://g/v1"),)),
    "routes": ([{"model": "f"}], '[{"model": "e", "tools": true}]', (RouteRule("g"),)),
    "chat_tools": (["read_file"], "list_folder, run_command", ("edit_file",)),
    "agent_steps": (3, "4", 5),
    "mcp_servers": ([{"name": "f", "command": "f-mcp"}], '[{"name": "e", "url": "http://e/mcp"}]',
                    (McpServer("g", command="g-mcp", enabled=False),)),
}


def _expected(name: str, value: object) -> object:
    """What each layer's value means, as the loader before pydantic-settings read it."""
    kind = {f.name: f.type for f in dataclasses.fields(Settings)}[name]
    if name in ("remotes", "routes", "mcp_servers"):
        items = json.loads(value) if isinstance(value, str) else value
        cls = {"remotes": Remote, "routes": RouteRule, "mcp_servers": McpServer}[name]
        assert isinstance(items, (list, tuple))
        return tuple(i if isinstance(i, cls) else cls(**i) for i in items)
    if "Path" in str(kind):
        return Path(str(value)).expanduser()
    if str(kind).startswith("tuple"):
        items = value.split(",") if isinstance(value, str) else value
        assert isinstance(items, (list, tuple))
        return tuple(str(v).strip() for v in items)
    if str(kind) == "bool" and isinstance(value, str):
        return value in ("true", "1", "yes")
    if "float" in str(kind):
        return float(value)  # type: ignore[arg-type]
    if "int" in str(kind):
        return int(value)  # type: ignore[call-overload]
    return value


def test_every_key_keeps_its_meaning_and_precedence(tmp_path: Path):
    """Each setting from the file alone, over it from the environment, over both from a
    flag: the value each layer gives is the one the settings hold, with its type."""
    import tomlkit

    assert set(LAYER_VALUES) == {f.name for f in dataclasses.fields(Settings)}
    cfg = tmp_path / "c.toml"
    cfg.write_text(tomlkit.dumps({k: list(v[0]) if isinstance(v[0], tuple) else v[0]
                                  for k, v in LAYER_VALUES.items()}))
    env = {"LOCALLLM_CONFIG": str(cfg)}
    from_file = load_settings(env=env)
    env |= {"LOCALLLM_" + k.upper(): v[1] for k, v in LAYER_VALUES.items()}
    from_env = load_settings(env=env)
    from_flags = load_settings({k: v[2] for k, v in LAYER_VALUES.items()}, env=env)
    for name, (file_value, env_text, flag_value) in LAYER_VALUES.items():
        assert getattr(from_file, name) == _expected(name, file_value), name
        assert getattr(from_env, name) == _expected(name, env_text), name
        assert getattr(from_flags, name) == _expected(name, flag_value), name
        assert type(getattr(from_env, name)) is type(_expected(name, env_text)), name


def test_dev_null_is_no_config_file(tmp_path: Path):
    assert load_settings(env={"LOCALLLM_CONFIG": "/dev/null"}).port == DEFAULT_PORT
    with pytest.raises(ConfigError, match="it is a folder"):
        load_settings(env={"LOCALLLM_CONFIG": str(tmp_path)})


def test_words_the_environment_may_use(tmp_path: Path):
    env = {"LOCALLLM_CONFIG": str(tmp_path / "none.toml"), "LOCALLLM_N_CTX": "auto",
           "LOCALLLM_PARALLEL": "", "LOCALLLM_ALLOWED_HOSTS": " a.test ,, b.test "}
    s = load_settings(env=env)
    assert s.n_ctx is None and s.parallel is None
    assert s.allowed_hosts == ("a.test", "b.test")
    for key, value, said in [("LOCALLLM_DRAIN_S", "soon", "LOCALLLM_DRAIN_S: drain_s = 'soon'"),
                             ("LOCALLLM_NO_AUTH", "maybe", "no_auth = 'maybe' is not valid"),
                             ("LOCALLLM_KV_CACHE_TYPE", "q3_k",
                              "kv_cache_type must be one of f16, q8_0, q4_0, got 'q3_k'"),
                             ("LOCALLLM_LORA", "/no/such/lora.gguf:0.5",
                              "lora: there is no LoRA adapter at /no/such/lora.gguf"),
                             ("LOCALLLM_LORA", "/dev/null:inf",
                              "lora: the scale in '/dev/null:inf' must be a finite number")]:
        with pytest.raises(ConfigError, match=said):
            load_settings(env={**env, key: value})
    cfg = tmp_path / "c.toml"
    cfg.write_text("port = true\n")
    with pytest.raises(ConfigError, match="a boolean is not a number") as err:
        load_settings(env={"LOCALLLM_CONFIG": str(cfg)})
    assert str(cfg) in err.value.message
    cfg.write_text('allowed_hosts = "a.test"\n')  # a list setting given a scalar
    with pytest.raises(ConfigError, match="allowed_hosts must be a list of strings") as err:
        load_settings(env={"LOCALLLM_CONFIG": str(cfg)})
    assert str(cfg) in err.value.message and "\n" not in err.value.message
