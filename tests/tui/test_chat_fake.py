"""The chat's control flow on the scripted model (backends/fake.py), moved a step at a
time: what the screen and the history hold while an answer is held mid-way, and where
Escape leaves it. No model and no process: this runs in `make test-fast`. What the
starter model writes is tested in test_chat.py."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path

import pytest

from localllm.backends.fake import FakeBackend, Gate, Script, write_fake_model
from localllm.config import Settings
from localllm.engine.engine import Engine
from localllm.history import ConversationSettings, History
from localllm.tui.app import ChatApp
from localllm.tui.live import LiveText
from localllm.tui.widgets.messages import ChatMessage
from tests.tui.conftest import answers, wait_for


@pytest.fixture
def gate() -> Iterator[Gate]:
    gate = Gate()
    yield gate
    gate.open()


@pytest.fixture
def fake_app(settings: Settings, tmp_path: Path, gate: Gate) -> Iterator[tuple[ChatApp, History]]:
    write_fake_model(settings.models_dir / "scripted.gguf")
    chosen = dataclasses.replace(settings, model="scripted")
    engine = Engine(chosen, backends=[FakeBackend(Script(reply="abcdefghij", gate=gate))])
    history = History(tmp_path / "history.sqlite3")
    try:
        yield ChatApp(chosen, engine, history=history, serve=False, live_status=False), history
    finally:
        gate.open()
        engine.close()
        history.close()


def shown_answer(app: ChatApp) -> str:
    """The text of the last answer on the screen: its live end while it streams, its
    stored text once it ends ("" before it starts)."""
    messages = [m for m in app.chat.query(ChatMessage) if m.role == "assistant"]
    if not messages:
        return ""
    live = messages[-1].query(LiveText)
    return live.first().text if live else messages[-1].content


async def test_escape_ends_a_held_answer_where_it_stands(
    fake_app: tuple[ChatApp, History], gate: Gate
):
    app, history = fake_app
    history.create("t", ConversationSettings(max_tokens=100))
    async with app.run_test(size=(100, 30)) as pilot:
        await wait_for(pilot, lambda: app.status.model == "scripted", "the model to load")
        app.prompt_box.load_text("Say the letters.")
        await pilot.press("enter")
        gate.allow(2)  # the prompt in one step, then a second letter
        await wait_for(pilot, lambda: gate.held(after=2, timeout=0), "two steps")
        await wait_for(pilot, lambda: shown_answer(app) == "ab", "the first two letters")
        assert app.generating and answers(app) == []  # held: nothing is stored as done
        await pilot.press("escape")
        gate.open()
        await wait_for(pilot, lambda: len(answers(app)) == 1, "the stopped answer")
        stored = answers(app)[0]
        assert stored.content == "ab"
        assert stored.stats is not None and stored.stats["finish_reason"] == "cancelled"
        assert stored.stats["generated_tokens"] == 2
        await wait_for(pilot, lambda: not app.generating, "the chat to be ready again")
        assert shown_answer(app) == "ab"


async def test_a_warning_logged_meanwhile_is_a_notification_and_a_file_line(
    fake_app: tuple[ChatApp, History], tmp_path: Path, capsys: pytest.CaptureFixture[str]
):
    """A record logged on another thread while the chat runs (the engine's worker warns
    when drafting switches off, say) is shown as a notification and written to the chat's
    log file, never to the terminal the chat draws on."""
    import logging
    import threading

    from localllm.tui.logview import logging_to_file

    app, _ = fake_app
    terminal = logging.StreamHandler()  # what `localllm` sets up before the chat starts
    root = logging.getLogger()
    root.addHandler(terminal)
    try:
        with logging_to_file(tmp_path) as path:
            assert terminal not in root.handlers
            async with app.run_test(size=(100, 30)) as pilot:
                await wait_for(pilot, lambda: app.status.model == "scripted", "the model")
                worker = threading.Thread(target=logging.getLogger("localllm.test").warning,
                                          args=("drafting switched off: %d of %d kept", 1, 9))
                worker.start()
                worker.join()
                await wait_for(pilot, lambda: any(
                    "drafting switched off: 1 of 9 kept" in str(n.message)
                    for n in app._notifications), "the notification")
            assert "drafting switched off: 1 of 9 kept" in path.read_text()
        assert terminal in root.handlers  # put back once the chat ends
    finally:
        root.removeHandler(terminal)
    assert "drafting switched off" not in capsys.readouterr().err
