"""Run the endpoint: in the foreground (`localllm serve`) or on a thread beside the TUI."""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import math
import socket
import threading
from collections.abc import Callable
from types import FrameType

import anyio
import uvicorn

from localllm.config import Settings
from localllm.engine.accounting import Accounting
from localllm.engine.client import EngineClient
from localllm.errors import ConfigError
from localllm.server.app import close_app, create_app
from localllm.server.connections import uvicorn_protocol

log = logging.getLogger(__name__)


def bind(host: str, port: int) -> socket.socket:
    """A listening socket, or ConfigError saying the port is taken."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # IPPROTO_TCP, not 0: asyncio turns Nagle off only on sockets that say they are TCP;
    # with it on, a client's second request on a kept-alive connection waited ~40 ms for
    # a delayed ACK before the last piece of each response went out
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
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


class QuietServer(uvicorn.Server):
    """uvicorn's server, woken once a second when idle instead of ten times.

    uvicorn looks for a shutdown request every 0.1 s. An endpoint that waits all day
    for an editor's requests then costs a laptop ten wake-ups a second, and beside the
    chat each one takes the interpreter from the model while it decodes. Here the loop
    waits `idle_wake_s` between looks (the Date header is refreshed on each, so once a
    second as before), and `request_exit` (from any thread) or a signal wakes it at once.
    """

    def __init__(
        self,
        config: uvicorn.Config,
        *,
        idle_wake_s: float = 1.0,
        on_exit: Callable[[], None] | None = None,
    ) -> None:
        super().__init__(config)
        self.on_exit = on_exit  # after the last request: close what the app opened
        self.idle_wake_s = idle_wake_s
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake: asyncio.Event | None = None

    async def main_loop(self) -> None:
        self._loop, self._wake = asyncio.get_running_loop(), asyncio.Event()
        # anyio loads its asyncio backend at its first use, which is the first streamed
        # response's task group: 14 ms of imports that request would wait for, taken now
        anyio.current_time()
        while not await self.on_tick(0):  # tick 0: refresh the Date header, then check
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self.idle_wake_s)

    async def serve(self, sockets: list[socket.socket] | None = None) -> None:
        try:
            await super().serve(sockets)
        finally:
            if self.on_exit is not None:
                self.on_exit()

    def request_exit(self) -> None:
        """Stop serving (safe from any thread and from a signal handler)."""
        self.should_exit = True
        self._wake_loop()

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        super().handle_exit(sig, frame)
        self._wake_loop()

    def _wake_loop(self) -> None:
        loop, wake = self._loop, self._wake
        if loop is not None and wake is not None:
            with contextlib.suppress(RuntimeError):  # the loop has already closed
                loop.call_soon_threadsafe(wake.set)


def is_loopback(host: str) -> bool:
    if host in ("localhost", ""):
        return host == "localhost"
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_exposure(settings: Settings, accounting: Accounting) -> None:
    """ConfigError when the endpoint would listen beyond this machine with no API key."""
    if is_loopback(settings.host) or settings.no_auth or accounting.list_keys():
        return
    raise ConfigError(
        f"Listening on {settings.host} lets other machines use the model, and no API key "
        "is configured. Add one with `localllm keys add NAME` (clients then send "
        "'Authorization: Bearer KEY'), or pass --no-auth to serve without keys."
    )


def make_server(settings: Settings, engine: EngineClient, accounting: Accounting) -> QuietServer:
    """The endpoint's server. On SIGTERM or Ctrl-C it stops taking requests and gives the
    running ones `drain_s` seconds to finish; then it cancels them."""
    app = create_app(settings, engine, accounting)
    config = uvicorn.Config(
        app,
        http=uvicorn_protocol(settings),  # bounds on head time and connections per client
        log_level=settings.log_level,
        access_log=False,  # localllm.access writes one JSON line per request instead
        lifespan="off",
        timeout_graceful_shutdown=max(1, math.ceil(settings.drain_s)),
    )
    return QuietServer(config, on_exit=lambda: close_app(app))


class BackgroundEndpoint:
    """The endpoint on its own thread and event loop, sharing the caller's engine."""

    def __init__(self, settings: Settings, engine: EngineClient, accounting: Accounting) -> None:
        self.settings = settings
        self.url = settings.base_url()
        self.error: str | None = None
        self._server: QuietServer | None = None
        self._thread: threading.Thread | None = None
        try:
            check_exposure(settings, accounting)
            sock = bind(settings.host, settings.port)
        except ConfigError as exc:
            self.error = exc.message
            return
        self._server = make_server(settings, engine, accounting)
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
            self._server.request_exit()
        if self._thread is not None:
            self._thread.join(timeout=10)
