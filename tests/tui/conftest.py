"""Helpers for driving the chat app with Pilot on the real starter model."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from textual.pilot import Pilot

from localllm.config import Settings
from localllm.engine.engine import Engine
from localllm.history import History
from localllm.models.store import ModelStore
from localllm.tui.app import ChatApp
from tests.conftest import loads_model


@pytest.fixture
@loads_model
def engine(settings: Settings, store: ModelStore) -> Iterator[Engine]:
    eng = Engine(settings, store)
    yield eng
    eng.close()


@pytest.fixture
def history(tmp_path: Path) -> Iterator[History]:
    h = History(tmp_path / "history.sqlite3")
    yield h
    h.close()


@pytest.fixture
@loads_model
def make_app(settings: Settings, engine: Engine, history: History, tmp_path: Path
             ) -> Callable[..., ChatApp]:
    def make(**kw: object) -> ChatApp:
        opts: dict = {"serve": False, "live_status": False, "export_dir": tmp_path}
        opts.update(kw)
        return ChatApp(settings, engine, history=history, **opts)

    return make


@pytest.fixture
def scripted(
    settings: Settings, tmp_path: Path
) -> Iterator[Callable[..., tuple[ChatApp, History]]]:
    """Chat apps on the scripted model (backends/fake.py): `build(reply, **settings)` with
    `reply` the model's answer for a prompt's text; the engines and histories are closed
    after the test."""
    from localllm.backends.fake import FakeBackend, Script, write_fake_model

    made: list[tuple[Engine, History]] = []

    def build(reply: Callable[[str], str], **changes: Any) -> tuple[ChatApp, History]:
        write_fake_model(settings.models_dir / "scripted.gguf")
        chosen = dataclasses.replace(settings, **{"model": "scripted", **changes})
        engine = Engine(chosen, backends=[FakeBackend(Script(reply=reply))])
        history = History(tmp_path / "history.sqlite3")
        made.append((engine, history))
        return ChatApp(chosen, engine, history=history, serve=False, live_status=False), history

    yield build
    for engine, history in made:
        engine.close()
        history.close()


async def wait_for(pilot: Pilot, cond: Callable[[], object], what: str, limit: int = 1200) -> None:
    """Let the app run until `cond` holds (a guard against hanging, not a timing assertion)."""
    for _ in range(limit):
        if cond():
            return
        await pilot.pause(0.05)
    raise AssertionError(f"gave up waiting for: {what}")


async def ready(pilot: Pilot) -> None:
    app = pilot.app
    assert isinstance(app, ChatApp)
    await wait_for(pilot, lambda: app.engine.status().model_info is not None and not
                   app.status.state, "the model to load")


def answers(app: ChatApp) -> list:
    """The finished answers stored (one being written is stored too, marked interrupted)."""
    assert app.conv is not None
    return [
        m
        for m in app.history.messages(app.conv.id)
        if m.role == "assistant" and not (m.stats or {}).get("interrupted")
    ]


async def ask(pilot: Pilot, text: str) -> None:
    """Type a prompt, press Enter, and wait until its answer is stored."""
    app = pilot.app
    assert isinstance(app, ChatApp)
    before = len(answers(app))
    app.prompt_box.focus()
    app.prompt_box.load_text(text)
    await pilot.press("enter")
    await wait_for(pilot, lambda: len(answers(app)) > before and not app.generating,
                   "the answer to be stored")


@contextmanager
def app_with(tmp_path: Path, store: ModelStore, *, serve: bool = False,
             db: Path | None = None, **settings: Any) -> Iterator[tuple[ChatApp, History]]:
    """A chat app with its own settings, engine and history, closed afterwards."""
    conf = Settings(**{"n_threads": 2, "data_dir": tmp_path / "d", **settings})
    engine = Engine(conf, store)
    history = History(db or tmp_path / "h.sqlite3")
    try:
        yield ChatApp(conf, engine, history=history, serve=serve, live_status=False), history
    finally:
        history.close()
        engine.close()
