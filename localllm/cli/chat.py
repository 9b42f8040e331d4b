"""localllm chat (the default command): the terminal chat, with the endpoint beside it."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from localllm.cli.common import model_flags, port
from localllm.config import DEFAULT_PORT, Settings

if TYPE_CHECKING:
    from localllm.engine.client import EngineClient


def add_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    chat = sub.add_parser(
        "chat", parents=[common], help="open the terminal chat (the default command)"
    )
    chat.add_argument("model", nargs="?", help="model name, path to a .gguf, or HF repo")
    model_flags(chat, model_flag="model_flag")
    chat.add_argument("--port", type=port, help=f"endpoint port (default: {DEFAULT_PORT})")
    chat.add_argument(
        "--no-serve", action="store_true", help="do not start the endpoint beside the chat"
    )
    chat.set_defaults(run=run)


def run(settings: Settings, args: argparse.Namespace) -> int:
    from localllm.engine.engine import Engine
    from localllm.history import History
    from localllm.tui import pictures
    from localllm.tui.app import ChatApp
    from localllm.tui.logview import logging_to_file

    engine: EngineClient = Engine(settings)
    try:
        if engine.remotes.find(settings.model) is None:  # a remote's model loads nothing
            engine.resolve(settings.model)  # a bad name fails now, with exit code 2
        history = History(settings.data_dir / "history.sqlite3")
        try:
            with logging_to_file(settings.data_dir):  # never drawn over the chat's screen
                app = ChatApp(settings, engine, history=history, serve=not args.no_serve)
                app.inline_images = pictures.probe()  # before the app takes the terminal
                app.run()
        finally:
            history.close()
    finally:
        engine.close()
    return 0
