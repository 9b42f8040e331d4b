"""Run the endpoint: in the foreground (`localllm serve`) or on a thread beside the TUI."""

from __future__ import annotations

import logging
import socket
import threading

import uvicorn

from localllm.config import Settings
from localllm.engine.worker import Engine
from localllm.errors import ConfigError
from localllm.server.app import create_app

log = logging.getLogger(__name__)


def bind(host: str, port: int) -> socket.socket:
    """A listening socket, or ConfigError saying the port is taken."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise ConfigError(
            f"cannot listen on {host}:{port} ({exc.strerror}); choose another port with --port"
        ) from None
    sock.listen(128)
    return sock


def make_server(settings: Settings, engine: Engine) -> uvicorn.Server:
    debug = settings.log_level in ("debug", "info")
    config = uvicorn.Config(
        create_app(settings, engine),
        log_level=settings.log_level,
        access_log=debug,
        lifespan="off",
    )
    return uvicorn.Server(config)


class BackgroundEndpoint:
    """The endpoint on its own thread and event loop, sharing the caller's engine."""

    def __init__(self, settings: Settings, engine: Engine) -> None:
        self.settings = settings
        self.url = settings.base_url()
        self.error: str | None = None
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None
        try:
            sock = bind(settings.host, settings.port)
        except ConfigError as exc:
            self.error = exc.message
            return
        self._server = make_server(settings, engine)
        server = self._server
        self._thread = threading.Thread(
            target=lambda: server.run(sockets=[sock]), name="localllm-endpoint", daemon=True
        )
        self._thread.start()

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def stop(self) -> None:
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=10)
