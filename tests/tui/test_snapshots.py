"""Snapshots of the main screens (pytest-textual-snapshot). Update with --snapshot-update."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest
from textual.pilot import Pilot

from localllm.config import Settings
from localllm.history import ConversationSettings, History
from localllm.tui.app import ChatApp
from localllm.tui.screens.model_picker import ModelPicker
from localllm.tui.screens.settings import SettingsScreen
from localllm.tui.widgets.messages import ChatMessage
from tests.tui.conftest import ready, wait_for


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    """The screens show the thread count: two, also when xdist workers use one each."""
    return Settings(n_threads=2, data_dir=tmp_path / "data", cache_dir=tmp_path / "cache")


SIZE = (110, 32)
STATS = {"prompt_tokens": 31, "cached_tokens": 0, "generated_tokens": 42, "ttft_s": 0.142,
         "decode_tps": 96.3, "draft_accepted": 0, "draft_proposed": 0, "finish_reason": "stop"}


def seed(history: History) -> None:
    history.create("Older chat")
    conv = history.create("Sorting in Python", ConversationSettings(
        system_prompt="You are concise.", temperature=0.2, max_tokens=256))
    history.add(conv.id, "user", "How do I sort a list of dicts by a key?")
    history.add(conv.id, "assistant",
                "Use `sorted` with a key function:\n\n```python\n"
                "people.sort(key=lambda p: p[\"age\"])\n```\n\nIt sorts in place; "
                "`sorted(people, key=...)` returns a new list.", STATS)


async def settle(pilot: Pilot) -> None:
    app = pilot.app
    assert isinstance(app, ChatApp)
    await ready(pilot)
    await wait_for(pilot, lambda: len(app.query(ChatMessage)) == 2, "the conversation")
    await pilot.pause(0.2)


def test_chat_screen(snap_compare, make_app, history: History):
    seed(history)
    assert snap_compare(make_app(), terminal_size=SIZE, run_before=settle)


def open_with(key: str, screen: type) -> Callable[[Pilot], Awaitable[None]]:
    """A run_before that opens a modal screen with `key` once the app has settled."""

    async def run_before(pilot: Pilot) -> None:
        await settle(pilot)
        await pilot.press(key)
        await wait_for(pilot, lambda: isinstance(pilot.app.screen, screen), screen.__name__)
        await pilot.pause(0.2)

    return run_before


def test_model_picker(snap_compare, make_app, history: History):
    seed(history)
    assert snap_compare(make_app(), terminal_size=SIZE, run_before=open_with("f3", ModelPicker))


def test_settings(snap_compare, make_app, history: History):
    seed(history)
    assert snap_compare(make_app(), terminal_size=(110, 40),
                        run_before=open_with("f4", SettingsScreen))
