"""Pictures in the chat: `@photo.png` (or a pasted path) sends the image with the prompt to
a model that reads images (the starter with a tiny random-weight projector beside it),
shows a note of it (and the picture, where the terminal draws pictures), keeps it in the
history for the next turns and for a reopened conversation; a file that is not a picture
is refused in one line with the prompt left in the box."""

from __future__ import annotations

from pathlib import Path

import pytest
from textual.widgets import Static

from localllm.backends.base import Message
from localllm.config import Settings
from localllm.engine.engine import Engine
from localllm.history import ConversationSettings, History
from localllm.models.store import ModelStore
from localllm.tui.app import ChatApp
from localllm.tui.widgets.messages import ChatMessage
from tests.conftest import THREADS, loads_model
from tests.gguf_fixtures import noise_png, vision_folder
from tests.tui.conftest import answers, ask, ready, wait_for

pytestmark = pytest.mark.model
GREEDY = ConversationSettings(temperature=0.0, max_tokens=4)


@loads_model
async def test_an_image_named_with_at_is_sent_shown_and_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    vision_folder(tmp_path / "models")
    store = ModelStore(tmp_path / "models", hf_cache=tmp_path / "hf")
    settings = Settings(n_threads=THREADS, data_dir=tmp_path / "d", model="seer")
    engine = Engine(settings, store)
    history = History(tmp_path / "h.sqlite3")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "cat.png").write_bytes(noise_png(seed=3))
    (tmp_path / "fake.png").write_bytes(b"not a picture at all")
    history.create("t", GREEDY)
    app = ChatApp(settings, engine, history=history, serve=False, live_status=False)
    try:
        async with app.run_test(size=(100, 36)) as pilot:
            await ready(pilot)
            app.prompt_box.focus()
            app.prompt_box.load_text("What is this? @fake.png")
            await pilot.press("enter")
            await wait_for(pilot, lambda: len(app._notifications) > 0, "the refusal")
            refusal = [n.message for n in app._notifications][-1]
            assert refusal.startswith("@fake.png is not an image")
            assert app.prompt_box.text == "What is this? @fake.png" and not answers(app)

            await ask(pilot, "What is this? @cat.png")
            assert app.conv is not None
            (user,) = [m for m in history.messages(app.conv.id) if m.role == "user"]
            assert user.content == "What is this? @cat.png"
            assert [(a.name, a.kind, a.data) for a in user.attachments] == [
                ("cat.png", "image", noise_png(seed=3))]
            notes = [str(w.render()) for w in app.query(".attachment").results(Static)]
            assert len(notes) == 1 and notes[0].startswith("▣ image cat.png · 48x40 · ")
            first = answers(app)[0].stats or {}
            # the picture's 16 tokens are in the prompt the model read
            question = [Message("user", "What is this? @cat.png")]
            text_only = engine.with_model(None, lambda m: len(m.render_chat(question)))
            assert first["prompt_tokens"] == text_only + 16

            await ask(pilot, "And its colours?")  # the picture stays in the conversation
            second = answers(app)[1].stats or {}
            assert second["cached_tokens"] >= first["prompt_tokens"] - 1

            assert not app.query(".picture")  # this terminal draws no pictures: the note
            app.inline_images = True  # one that does (Kitty's protocol, Sixel)
            await app.open_conversation(app.conv.id)  # reopened: the picture is still there
            await pilot.pause()
            shown = [m for m in app.query(ChatMessage) if m.role == "user"]
            assert [len(m.attachments) for m in shown] == [1, 0]
            assert len(app.query(".picture")) == 1 and len(app.query(".attachment")) == 1
    finally:
        history.close()
        engine.close()


async def test_a_picture_for_a_model_that_cannot_read_it_is_not_sent(
    make_app, history: History, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """On the starter (no projector) @cat.png is refused before it is sent, saying what
    would let the model read it; the prompt stays in the box and nothing is stored."""
    from tests.tui.conftest import ready as loaded

    monkeypatch.chdir(tmp_path)
    (tmp_path / "cat.png").write_bytes(noise_png())
    history.create("t", GREEDY)
    app = make_app()
    async with app.run_test(size=(100, 30)) as pilot:
        await loaded(pilot)
        app.prompt_box.focus()
        app.prompt_box.load_text("What is this? @cat.png")
        await pilot.press("enter")
        await wait_for(pilot, lambda: len(app._notifications) > 0, "the refusal")
        said = [n.message for n in app._notifications][-1]
        assert said.startswith("@cat.png: starter cannot read images") and "--mmproj" in said
        assert app.prompt_box.text == "What is this? @cat.png"
        assert app.conv is not None and history.messages(app.conv.id) == []
