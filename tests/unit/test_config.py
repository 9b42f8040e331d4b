from pathlib import Path

import pytest

from localllm.config import DEFAULT_PORT, load_settings
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
