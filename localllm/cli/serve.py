"""localllm serve: the endpoint alone (every API on one port)."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
from typing import TYPE_CHECKING, Any

from localllm.cli.common import (
    EXIT_USAGE,
    model_flags,
    port,
    progress_printer,
)
from localllm.config import DEFAULT_PORT, Settings
from localllm.errors import ConfigError, LocalLLMError

if TYPE_CHECKING:
    from localllm.engine.client import EngineClient


def add_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    serve = sub.add_parser("serve", parents=[common], help="serve the OpenAI-compatible endpoint")
    model_flags(serve)
    serve.add_argument("--host", help="address to bind (default: 127.0.0.1)")
    serve.add_argument("--port", type=port, help=f"port (default: {DEFAULT_PORT})")
    serve.add_argument(
        "--no-auth",
        action="store_true",
        default=None,
        help="serve a non-loopback --host with no API key (anyone who can reach it may use it)",
    )
    serve.set_defaults(run=run)


def run(settings: Settings, args: argparse.Namespace) -> int:
    from localllm.engine.accounting import Accounting
    from localllm.engine.engine import Engine
    from localllm.server.runner import bind, check_exposure, make_server

    accounting = Accounting.for_settings(settings)
    try:
        check_exposure(settings, accounting)
    except ConfigError:
        accounting.close()
        raise
    engine: EngineClient = Engine(settings)
    engine.observe(accounting.observe)
    engine.limit_by(accounting)  # the keys' daily token quotas
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
    from localllm.cli.logs import write_file_log

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
