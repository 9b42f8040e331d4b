"""The chat app driven with Pilot on the real starter model."""

from __future__ import annotations

import gc
import threading
import time
import weakref
from pathlib import Path

import openai
import pytest
from textual import events
from textual.widgets import Button, DataTable, ProgressBar, Select, Static

from localllm.backends import get_backend
from localllm.history import ConversationSettings, History
from localllm.models.quantize import quantized_from
from localllm.models.store import ModelStore
from localllm.tui.app import ChatApp
from localllm.tui.live import LiveText
from localllm.tui.screens.dialogs import FullContextScreen
from localllm.tui.screens.model_picker import ModelPicker
from localllm.tui.screens.quantize import QuantizeScreen
from localllm.tui.widgets.messages import ChatMessage
from tests.conftest import free_port
from tests.tui.conftest import answers, app_with, ask, ready, wait_for

GREEDY = ConversationSettings(temperature=0.0, max_tokens=24)


def press_enter_without_waiting(app: ChatApp) -> None:
    """Enter in the prompt box. Pilot.press would wait for the app to go idle, which a
    streaming answer keeps it from doing until the answer is complete."""
    app.prompt_box.post_message(events.Key("enter", "\r"))


async def test_question_gets_a_streamed_answer(make_app, history: History):
    history.create("t", ConversationSettings(temperature=0.0, max_tokens=40))
    app = make_app()
    seen_lengths: set[int] = set()

    def watch() -> bool:
        msgs = list(app.chat.query(ChatMessage))
        if msgs and msgs[-1].role == "assistant" and msgs[-1].query(".body"):
            live = sum(len(t.text) for t in msgs[-1].query(LiveText).results(LiveText))
            seen_lengths.add(len(msgs[-1].body.source) + live)  # Markdown and live text
        return len(answers(app)) == 1

    async with app.run_test(size=(100, 30)) as pilot:
        await ready(pilot)
        app.prompt_box.load_text("Write a story about a dragon.")
        press_enter_without_waiting(app)
        for _ in range(3000):
            if watch():
                break
            await pilot.pause(0.01)
        stored = answers(app)[0]
        shown = list(app.chat.query(ChatMessage))
        assert [m.role for m in shown] == ["user", "assistant"]
        assert stored.content and shown[-1].body.source == stored.content
        assert stored.stats and stored.stats["generated_tokens"] == 40
        assert "tokens" in str(shown[-1].query_one(".stats").render())
        # text arrived in pieces while it was generated, not all at the end
        assert any(0 < n < len(stored.content) for n in seen_lengths), seen_lengths
        assert app.pacer.redraws > 1  # the screen was redrawn as the pieces came
        assert app.status.context.startswith("ctx ")


async def test_escape_stops_and_keeps_the_partial_answer(make_app, history: History):
    history.create("t", ConversationSettings(temperature=0.0, max_tokens=400))
    app = make_app()
    async with app.run_test(size=(100, 30)) as pilot:
        await ready(pilot)
        app.prompt_box.load_text("Write a very long essay about the history of bridges.")
        await pilot.press("enter")

        def has_text() -> bool:
            msgs = list(app.chat.query(ChatMessage))
            last = msgs[-1] if msgs else None
            return last is not None and last.role == "assistant" and bool(
                last.query(".body")) and len(last.body.source) > 5

        await wait_for(pilot, has_text, "some answer text")
        await pilot.press("escape")
        await wait_for(pilot, lambda: len(answers(app)) == 1, "the stopped answer to be stored")
        stored = answers(app)[0]
        assert stored.stats is not None and stored.stats["finish_reason"] == "cancelled"
        assert 0 < stored.stats["generated_tokens"] < 400
        assert stored.content
        assert "stopped" in str(list(app.chat.query(ChatMessage))[-1].query_one(".stats").render())


async def test_regenerate_replaces_the_last_answer(make_app, history: History):
    history.create("t", GREEDY)
    app = make_app()
    async with app.run_test(size=(100, 30)) as pilot:
        await ready(pilot)
        await ask(pilot, "What is a cat?")
        first = answers(app)[0]
        first_widget = list(app.chat.query(ChatMessage))[-1]
        await pilot.press("ctrl+r")
        await wait_for(pilot, lambda: list(app.chat.query(ChatMessage))[-1] is not first_widget
                       and len(answers(app)) == 1 and not app.generating,
                       "the regenerated answer")
        again = answers(app)
        assert len(again) == 1
        assert again[0].content == first.content  # greedy: the same answer, stored anew
        assert [m.role for m in app.chat.query(ChatMessage)] == ["user", "assistant"]


async def test_edit_last_prompt_puts_it_back_in_the_input(make_app, history: History):
    history.create("t", GREEDY)
    app = make_app()
    async with app.run_test(size=(100, 30)) as pilot:
        await ready(pilot)
        await ask(pilot, "Name a fruit.")
        await pilot.press("ctrl+l")
        await pilot.pause(0.1)
        assert app.prompt_box.text == "Name a fruit."
        assert app.history.messages(app.conv.id) == []
        assert list(app.chat.query(ChatMessage)) == []


async def test_conversation_survives_reopening(store: ModelStore, tmp_path: Path):
    db = tmp_path / "chat.sqlite3"
    for round_ in range(2):
        with app_with(tmp_path, store, db=db) as (app, history):
            if round_ == 0:
                history.create("first", GREEDY)
            async with app.run_test(size=(100, 30)) as pilot:
                await ready(pilot)
                if round_ == 0:
                    await ask(pilot, "Say hello.")
                    await pilot.press("ctrl+n")  # a second, empty conversation...
                    await pilot.pause(0.1)
                    await app.open_conversation(history.conversations()[-1].id)  # ...back
                else:
                    shown = list(app.chat.query(ChatMessage))
                    assert [m.role for m in shown] == ["user", "assistant"]
                    assert shown[0].content == "Say hello."
                    assert app.conv is not None and app.conv.title == "first"  # reopened
                    assert app.sidebar.option_count == 2
                    # the prompt can be recalled with Up
                    app.prompt_box.focus()
                    await pilot.press("up")
                    assert app.prompt_box.text == "Say hello."


async def test_full_context_offers_dropping_the_oldest_turns(tmp_path: Path, store: ModelStore):
    with app_with(tmp_path, store, n_ctx=160) as (app, history):
        conv = history.create("long", ConversationSettings(temperature=0.0, max_tokens=4))
        filler = "The quick brown fox jumps over the lazy dog. " * 6
        for _ in range(2):
            history.add(conv.id, "user", filler)
            history.add(conv.id, "assistant", filler)
        async with app.run_test(size=(110, 32)) as pilot:
            await ready(pilot)
            app.prompt_box.load_text("And now?")
            await pilot.press("enter")
            await wait_for(pilot, lambda: isinstance(app.screen, FullContextScreen),
                           "the full-context dialog")
            dialog = app.screen
            assert isinstance(dialog, FullContextScreen)
            assert dialog.n_ctx == 160 and dialog.prompt_tokens >= 160
            text = " ".join(str(w.render()) for w in dialog.query("Label"))
            assert "160" in text and f"{dialog.prompt_tokens:,}" in text
            await pilot.click("#drop")
            await wait_for(pilot, lambda: len(answers(app)) == 3 and not app.generating,
                           "an answer after dropping turns")
            msgs = history.messages(conv.id)
            dropped = [m for m in msgs if not m.in_context]
            assert dropped and dropped[0].id == msgs[0].id  # the oldest went first
            assert msgs[-1].role == "assistant" and msgs[-1].in_context
            assert len(msgs) == 6  # nothing was deleted


async def test_full_context_new_chat_moves_the_prompt(tmp_path: Path, store: ModelStore):
    with app_with(tmp_path, store, n_ctx=160) as (app, history):
        conv = history.create("long", ConversationSettings(temperature=0.0, max_tokens=4))
        history.add(conv.id, "user", "The quick brown fox jumps over the lazy dog. " * 14)
        history.add(conv.id, "assistant", "ok")
        async with app.run_test(size=(110, 32)) as pilot:
            await ready(pilot)
            app.prompt_box.load_text("Fresh question")
            await pilot.press("enter")
            await wait_for(pilot, lambda: isinstance(app.screen, FullContextScreen), "dialog")
            await pilot.click("#new")
            await wait_for(pilot, lambda: app.conv is not None and app.conv.id != conv.id
                           and len(answers(app)) == 1 and not app.generating, "the new chat")
            assert app.conv is not None
            assert history.messages(app.conv.id)[0].content == "Fresh question"
            assert [m.role for m in history.messages(conv.id)] == ["user", "assistant"]


async def test_endpoint_answers_while_the_app_streams(store: ModelStore, tmp_path: Path):
    port = free_port()
    result: dict = {}

    def call_api() -> None:
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="x",
                               max_retries=0)
        r = client.chat.completions.create(
            model="starter", messages=[{"role": "user", "content": "Say hi"}], max_tokens=5,
            temperature=0)
        result["text"], result["usage"] = r.choices[0].message.content, r.usage
        result["finish"] = r.choices[0].finish_reason

    with app_with(tmp_path, store, serve=True, port=port) as (app, history):
        history.create("t", ConversationSettings(temperature=0.0, max_tokens=60))
        async with app.run_test(size=(100, 30)) as pilot:
            await ready(pilot)
            await wait_for(pilot, lambda: app.status.endpoint != "endpoint starting", "endpoint")
            assert app.status.endpoint == f"http://127.0.0.1:{port}/v1"
            app.prompt_box.load_text("Write a story about a robot.")
            press_enter_without_waiting(app)
            await wait_for(pilot, lambda: app.generating, "generation to start", limit=400)
            caller = threading.Thread(target=call_api)
            caller.start()
            assert app.generating  # the API request was made while the answer streams
            await wait_for(pilot, lambda: not caller.is_alive(), "the API call")
            caller.join()
            await wait_for(pilot, lambda: len(answers(app)) == 1, "the chat answer")
        assert result["finish"] == "length" and result["usage"].completion_tokens == 5
        assert result["text"]
        assert answers(app)[0].stats["generated_tokens"] == 60


async def test_port_in_use_is_shown_and_chat_goes_on(store: ModelStore, tmp_path: Path):
    import socket

    with socket.socket() as blocker:
        blocker.bind(("127.0.0.1", 0))
        blocker.listen(1)
        port = blocker.getsockname()[1]
        with app_with(tmp_path, store, serve=True, port=port) as (app, history):
            history.create("t", ConversationSettings(temperature=0.0, max_tokens=4))
            async with app.run_test(size=(100, 30)) as pilot:
                await ready(pilot)
                await wait_for(pilot, lambda: app.status.endpoint != "endpoint starting",
                               "the endpoint to try its port")
                assert app.status.endpoint == f"endpoint off: port {port} in use"
                await ask(pilot, "Hi")
                assert answers(app)[0].content


async def test_model_that_fails_to_load_is_a_message_not_a_crash(tmp_path: Path,
                                                                 store: ModelStore,
                                                                 starter_ref):
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(starter_ref.path.read_bytes()[:200_000])
    with app_with(tmp_path, store, model=str(broken)) as (app, _history):
        async with app.run_test(size=(100, 30)) as pilot:
            await wait_for(pilot, lambda: app.status.state == "model not loaded", "load failure")
            # notify() posts a message; the notification is listed once the app handles it
            await wait_for(pilot, lambda: len(app._notifications) > 0, "the notification")
            notes = [n.message for n in app._notifications]
            assert any("Could not load model" in n for n in notes), notes
            app.prompt_box.load_text("still typing")  # the app is usable
            assert app.prompt_box.text == "still typing"
            assert app.is_running


async def test_copy_export_and_commands(make_app, history: History, tmp_path: Path):
    conv = history.create("Code chat", GREEDY)
    history.add(conv.id, "user", "Show code")
    history.add(conv.id, "assistant", "Here:\n\n```python\nprint('hi')\n```\n\nDone.")
    app = make_app()
    async with app.run_test(size=(100, 30)) as pilot:
        await wait_for(pilot, lambda: len(app.query(ChatMessage)) == 2, "the conversation")
        await pilot.press("f9")
        assert app.last_copied == "print('hi')"
        await pilot.press("f5")
        assert app.last_copied and app.last_copied.startswith("Here:")
        await pilot.press("ctrl+s")
        out = tmp_path / f"code-chat-{conv.id}.md"
        assert out.read_text().startswith("# Code chat")
        assert "print('hi')" in out.read_text()
        titles = {c.title for c in app.get_system_commands(app.screen)}
        for wanted in ("Stop", "Regenerate", "Edit last", "Copy answer", "Copy code", "Export",
                       "Rename", "Delete chat", "Models", "Settings", "New chat"):
            assert wanted in titles


async def test_rename_settings_and_delete(make_app, history: History):
    keep = history.create("Keep me")
    history.create("Old title")
    app = make_app()
    async with app.run_test(size=(110, 44)) as pilot:
        await wait_for(pilot, lambda: app.sidebar.option_count == 2, "sidebar")
        await pilot.press("f2")
        await wait_for(pilot, lambda: app.screen.query("#title"), "the rename dialog")
        app.screen.query_one("#title").value = "New title"
        await pilot.press("enter")
        await wait_for(pilot, lambda: app.conv is not None and app.conv.title == "New title",
                       "the rename")
        sidebar = app.sidebar
        labels = [str(sidebar.get_option_at_index(i).prompt) for i in range(sidebar.option_count)]
        assert "New title" in labels and "Old title" not in labels

        await pilot.press("f4")
        await wait_for(pilot, lambda: app.screen.query("#temperature"), "settings")
        app.screen.query_one("#temperature").value = "5"
        await pilot.click("#save")
        await wait_for(pilot, lambda: str(app.screen.query_one("#error").render()), "an error")
        error = str(app.screen.query_one("#error").render())
        assert "5.0 is outside 0..2" in error  # refused with the range, dialog stays open
        app.screen.query_one("#temperature").value = "0.3"
        app.screen.query_one("#system_prompt").load_text("Be brief.")
        app.screen.query_one("#save").press()
        await wait_for(pilot, lambda: app.conv is not None
                       and app.conv.settings.temperature == 0.3, "saved settings")
        conv = app.conv  # the conversation as saved (a new object)
        assert conv is not None
        saved = history.get(conv.id)
        assert saved is not None and saved.settings.system_prompt == "Be brief."
        assert app._request(app.conv).messages[0].content == "Be brief."

        doomed = app.conv.id
        await pilot.press("f8")
        await wait_for(pilot, lambda: app.screen.query("#yes"), "the confirmation")
        await pilot.click("#yes")
        await wait_for(pilot, lambda: history.get(doomed) is None, "the deletion")
        assert app.conv is not None and app.conv.id == keep.id


async def test_model_picker_switches_the_loaded_model(make_app, history: History,
                                                      store: ModelStore, starter_ref):
    store.models_dir.mkdir(parents=True)
    (store.models_dir / "twin.gguf").symlink_to(starter_ref.path)
    history.create("t", GREEDY)
    app = make_app()
    async with app.run_test(size=(110, 32)) as pilot:
        await ready(pilot)
        assert app.status.model == "starter"
        await pilot.press("f3")
        await wait_for(pilot, lambda: isinstance(app.screen, ModelPicker), "the picker")
        table = app.screen.query_one(DataTable)
        assert table.row_count == 2
        names = [table.get_row_at(i)[1] for i in range(table.row_count)]
        assert names == ["starter", "twin"]
        await pilot.press("down", "enter")
        await wait_for(pilot, lambda: app.status.model == "twin" and not app.status.state,
                       "the switch to twin")
        ref = app.engine.status().model_ref
        assert ref is not None and ref.name == "twin"
        await ask(pilot, "Hi")  # and it answers on the new model
        assert answers(app)[0].content


async def test_switching_conversations_while_streaming(make_app, history: History):
    other = history.create("Other", ConversationSettings(max_tokens=48))  # its answer ends
    history.add(other.id, "user", "An older question")
    history.add(other.id, "assistant", "An older answer")
    streaming = history.create("Streaming", ConversationSettings(temperature=0.0,
                                                                 max_tokens=400))
    app = make_app()
    async with app.run_test(size=(100, 30)) as pilot:
        await ready(pilot)
        app.prompt_box.load_text("Write a very long essay about mountains.")
        press_enter_without_waiting(app)
        await wait_for(pilot, lambda: app.generating, "generation to start", limit=400)

        def words_written() -> bool:  # stopped before its first word, nothing would be kept
            running = app.engine.status().activity.get("requests", ())
            return any(r.get("generated", 0) >= 2 for r in running)

        await wait_for(pilot, words_written, "the first words of the answer", limit=400)
        await app.open_conversation(other.id)  # what selecting it in the sidebar does
        app.action_stop()
        await wait_for(pilot, lambda: not app.generating, "the answer to stop")
        shown = [m.content for m in app.chat.query(ChatMessage)]
        assert shown == ["An older question", "An older answer"]
        kept = history.messages(streaming.id)
        assert [m.role for m in kept] == ["user", "assistant"]  # the partial answer is kept
        assert kept[1].stats and kept[1].stats["finish_reason"] == "cancelled"
        await ask(pilot, "And now?")  # the app goes on in the other conversation
        assert history.messages(other.id)[-1].role == "assistant"


@pytest.mark.skipif(not get_backend("mlx").available(), reason="the mlx extra is not installed")
async def test_backend_setting_moves_the_conversation_to_mlx(make_app, history: History):
    history.create("t", ConversationSettings(temperature=0.0, max_tokens=3))
    app = make_app()
    async with app.run_test(size=(110, 44)) as pilot:
        await ready(pilot)
        assert "auto:" in app.status.device  # the status bar says why this backend
        await pilot.press("f4")
        await wait_for(pilot, lambda: app.screen.query("#backend"), "settings")
        app.screen.query_one("#backend").value = "metal"
        app.screen.query_one("#save").press()
        await wait_for(pilot, lambda: str(app.screen.query_one("#error").render()), "an error")
        assert "'metal' is not one of auto, llamacpp, mlx" in str(
            app.screen.query_one("#error").render()
        )
        app.screen.query_one("#backend").value = "mlx"
        app.screen.query_one("#save").press()
        await wait_for(pilot, lambda: app.conv.settings.backend == "mlx", "saved settings")
        await ask(pilot, "Hi")
        assert app.status.device.startswith("mlx ")
        assert app.status.device.endswith("set to mlx; MLX import starter-mlx")
        stats = answers(app)[-1].stats
        assert stats is not None and stats["generated_tokens"] == 3


async def test_model_picker_starts_a_quantization(make_app, history: History, store: ModelStore):
    history.create("t", GREEDY)
    app = make_app()
    async with app.run_test(size=(120, 44)) as pilot:
        await ready(pilot)
        await pilot.press("f3")
        await wait_for(pilot, lambda: isinstance(app.screen, ModelPicker), "the picker")
        await pilot.press("q")
        await wait_for(pilot, lambda: isinstance(app.screen, QuantizeScreen), "the dialog")
        dialog = app.screen
        assert isinstance(dialog, QuantizeScreen) and dialog.source.name == "starter"
        await pilot.click("#start")  # q4_0 from the Q4_1 starter: refused in the dialog
        refusal = str(dialog.query_one("#plan", Static).render())
        assert "already quantized (Q4_1)" in refusal and dialog.result is None
        dialog.query_one("#type", Select).value = "f16"
        # the refusal above changed the dialog's layout, and a click could land where Start
        # was before (it did: nothing started); the button is pressed as a click would
        await pilot.pause()
        dialog.query_one("#start", Button).press()
        started = time.monotonic()
        try:
            await wait_for(pilot, lambda: dialog.result is not None and not dialog.running,
                           "the quantization")
        except AssertionError as exc:  # say where it stood: this has been slow in full runs
            state = (
                f"after {time.monotonic() - started:.0f} s: running={dialog.running}, "
                f"bar={dialog.query_one('#bar', ProgressBar).progress}, "
                f"outcome={dialog.query_one('#outcome', Static).render()!s}"
            )
            raise AssertionError(f"{exc} ({state})") from None
        assert "Made starter-f16 (258.3 MiB)" in str(dialog.query_one("#outcome", Static).render())
        made = quantized_from(store.models_dir / "starter-f16")
        assert made is not None and made.startswith("f16 of starter (")
        assert dialog.query_one("#bar", ProgressBar).progress == 100
        await pilot.press("escape")
        await wait_for(pilot, lambda: isinstance(app.screen, ModelPicker), "the picker again")
        table = app.screen.query_one(DataTable)
        names = [table.get_row_at(i)[1] for i in range(table.row_count)]
        assert names == ["starter", "starter-f16"]


async def test_speculation_figures_show_after_an_answer(make_app, history: History):
    from tests.backends.test_speculative import EDIT

    history.create("t", ConversationSettings(temperature=0.0, max_tokens=32, speculate="lookup"))
    app = make_app()
    async with app.run_test(size=(120, 36)) as pilot:
        await ready(pilot)
        await ask(pilot, EDIT)
        stats = answers(app)[0].stats
        assert stats and stats["draft_proposed"] > 0 and stats["draft_accepted"] > 0
        shown = app.chat.query(ChatMessage).last()
        line = str(shown.query_one(".stats").render())
        assert f"drafts {stats['draft_accepted']}/{stats['draft_proposed']} (" in line
        assert app.status.speculation.startswith(f"drafts {stats['draft_accepted']}/")


async def test_a_model_load_freezes_no_garbage(make_app, history: History):
    """After a load the app freezes what lives (later collections skip it), but collects
    first: a cycle that became garbage before the load is freed, not kept for good."""
    history.create("t", GREEDY)
    app = make_app()
    async with app.run_test(size=(100, 30)) as pilot:
        await ready(pilot)
        assert gc.get_freeze_count() > 0

        class Node:
            other: Node

        gc.disable()  # only a collection the app makes may free the cycle
        try:
            a, b = Node(), Node()
            a.other, b.other = b, a
            gone = weakref.ref(a)
            del a, b
            await app.load_model("starter").wait()  # loads again, freezes again
        finally:
            gc.enable()
        gc.collect()
        assert gone() is None


async def test_a_remote_model_in_the_chat(tmp_path: Path, store: ModelStore, starter_ref):
    """The chat on a remote engine's model (llama-cpp-python's server here): it answers
    with nothing loaded here; the picker lists the remote models, and one whose engine is
    down is answered by its local fallback, with a note saying so."""
    from localllm.config import Remote
    from tests.remote_engines import LlamaCppServer

    engine_server = LlamaCppServer(tmp_path, starter_ref.path, "smol")
    remotes = (Remote("team", engine_server.base + "/v1"),
               Remote("gone", f"http://127.0.0.1:{free_port()}/v1", models=("big",),
                      fallback="starter", connect_timeout_s=1))
    try:
        with app_with(tmp_path, store, model="team/smol", remotes=remotes) as (app, history):
            history.create("t", ConversationSettings(temperature=0.0, max_tokens=8))
            async with app.run_test(size=(110, 32)) as pilot:
                await wait_for(pilot, lambda: app.status.model == "team/smol", "the model")
                assert app.status.device == "remote"
                await ask(pilot, "Hi")
                assert answers(app)[0].content and app.engine.status().model_info is None
                await pilot.press("f3")
                await wait_for(pilot, lambda: isinstance(app.screen, ModelPicker), "the picker")
                table = app.screen.query_one(DataTable)
                names = [table.get_row_at(i)[1] for i in range(table.row_count)]
                assert names == ["starter", "team/smol", "gone/big"]
                assert table.get_row_at(1)[2] == "remote"
                await pilot.press("down", "down", "enter")
                await wait_for(pilot, lambda: app.status.model == "gone/big", "the switch")
                await ask(pilot, "Hello?")
                await wait_for(pilot, lambda: len(app._notifications) > 0, "the note")
                notes = [n.message for n in app._notifications]
                assert any("gone/big is unavailable" in n and "starter answers" in n
                           for n in notes), notes
                assert answers(app)[1].content
    finally:
        engine_server.stop()


async def test_a_file_named_with_at_is_attached(make_app, history: History, tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch):
    """@notes.txt sends the file's text with the prompt and says how many tokens it adds;
    a binary file is refused in one line and the prompt stays in the box."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "notes.txt").write_text("The launch is on Tuesday.\n")
    (tmp_path / "blob.bin").write_bytes(b"\x89PNG\x00\x00")
    history.create("t", GREEDY)
    app = make_app()
    async with app.run_test(size=(100, 30)) as pilot:
        await ready(pilot)
        app.prompt_box.focus()
        app.prompt_box.load_text("Describe @blob.bin")
        await pilot.press("enter")
        await wait_for(pilot, lambda: len(app._notifications) > 0, "the refusal")
        assert "@blob.bin: a binary file" in [n.message for n in app._notifications][-1]
        assert app.prompt_box.text == "Describe @blob.bin" and not answers(app)
        app.prompt_box.load_text("When is the launch? @notes.txt")
        await pilot.press("enter")

        def noted() -> list[str]:
            return [n.message for n in app._notifications if n.message.startswith("Attached")]

        await wait_for(pilot, lambda: bool(noted()), "the note of what was attached")
        assert noted()[0].startswith("Attached notes.txt (") and noted()[0].endswith(" tokens)")
        await wait_for(pilot, lambda: len(answers(app)) == 1 and not app.generating,
                       "the answer")
        assert app.conv is not None
        sent = [m.content for m in history.messages(app.conv.id) if m.role == "user"]
        assert sent == ["When is the launch? @notes.txt\n\nFile notes.txt:\n```\n"
                        "The launch is on Tuesday.\n```"]


async def test_a_thinking_model_s_reasoning_is_folded_and_not_sent_again(
        tmp_path: Path, store: ModelStore, starter_ref):
    """The reasoning shows as a folded, dimmed section above the answer; the history keeps
    it, the next turn's prompt leaves it out; thinking off (F4) asks the template not to."""
    from textual.widgets import Collapsible

    from tests.server.test_thinking import thinking_model

    path = thinking_model(starter_ref, tmp_path)
    with app_with(tmp_path, store, model=str(path)) as (app, history):
        conv = history.create("t", ConversationSettings(temperature=0.0, max_tokens=12))
        sent: list = []
        app.engine.observe(lambda request, *_: sent.append(request.messages))
        async with app.run_test(size=(100, 30)) as pilot:
            await ready(pilot)
            await ask(pilot, "What is two plus two?")
            stored = answers(app)[0].content
            assert stored.startswith("<think>") and "</think>" in stored
            section = app.chat.query(ChatMessage).last().query_one(".thinking", Collapsible)
            assert section.collapsed and section.title.startswith("Thinking · ")
            await ask(pilot, "And three plus three?")
            earlier = [m.content for m in sent[-1] if m.role == "assistant"]
            assert earlier and all("<think>" not in c and "</think>" not in c for c in earlier)
            history.save_settings(conv.id, ConversationSettings(
                temperature=0.0, max_tokens=12, thinking=False))
            app.conv = history.get(conv.id)
            await ask(pilot, "And four plus four?")
            assert not answers(app)[-1].content.startswith("<think>")
            assert not app.chat.query(ChatMessage).last().query(".thinking")


async def test_find_and_pull_a_model_from_the_hub(make_app, history: History, store: ModelStore,
                                                  starter_ref, monkeypatch: pytest.MonkeyPatch):
    """F3, S: search the hub (the loopback stand-in, through huggingface_hub), list what a
    repository offers with sizes and fit, pull one in the background while the chat
    answers a question, and the pulled name then resolves."""
    from textual.widgets import Input

    from localllm.models import hub as hubmod
    from localllm.tui.screens.hub_search import HubSearch
    from localllm.units import format_bytes
    from tests.hubserver import HubServer

    GGUF_SPEC = "test-org/tiny-GGUF"
    history.create("t", GREEDY)
    with HubServer() as hub:
        hub.add(GGUF_SPEC, {"tiny-Q4_1.gguf": starter_ref.path,
                                       "tiny-Q8_0.gguf": starter_ref.path})
        hub.stall_after["tiny-Q4_1.gguf"] = 20_000_000  # held mid-way until released
        monkeypatch.setenv("HF_ENDPOINT", hub.url)
        app = make_app()
        async with app.run_test(size=(120, 44)) as pilot:
            await ready(pilot)
            await pilot.press("f3")
            await wait_for(pilot, lambda: isinstance(app.screen, ModelPicker), "the picker")
            await pilot.press("s")
            await wait_for(pilot, lambda: isinstance(app.screen, HubSearch), "the search")
            dialog = app.screen
            assert isinstance(dialog, HubSearch)
            dialog.query_one("#query", Input).value = "tiny"
            await pilot.press("enter")
            table = dialog.query_one("#hub-results", DataTable)
            await wait_for(pilot, lambda: table.row_count == 1, "the search results")
            assert table.get_row_at(0)[:2] == ["test-org/tiny-GGUF", "GGUF"]
            # the estimate of `localllm pull` (the header read from the hub: KV, buffers);
            # free memory set between the two quantizations' needs (the same size here:
            # so just under it, and neither fits)
            expected = hubmod.estimate_remote(hubmod.plan_pull(f"{GGUF_SPEC}:tiny-Q4_1")).total
            dialog.free_bytes = expected - 1
            await pilot.press("enter")
            await wait_for(pilot, lambda: dialog.repo is not None and table.row_count == 2,
                           "the quantizations")
            await wait_for(pilot, lambda: table.get_row_at(1)[3] != "checking…", "the fit")
            rows = [table.get_row_at(i) for i in range(2)]
            assert [r[0] for r in rows] == ["test-org/tiny-GGUF:tiny-Q4_1",
                                            "test-org/tiny-GGUF:tiny-Q8_0"]
            assert rows[0][2] == "93.8 MiB"
            assert rows[0][3] == rows[1][3] == f"no (needs {format_bytes(expected)})"
            dialog.free_bytes = expected
            dialog.estimate(dialog.offered)
            await wait_for(pilot, lambda: table.get_row_at(0)[3] == "yes", "a fit")
            await pilot.press("enter")  # pull the first
            bar = dialog.query_one("#pull-bar", ProgressBar)
            await wait_for(pilot, lambda: (bar.progress or 0) >= 20_000_000, "the pull to start")
            assert "pulling test-org/tiny-GGUF:tiny-Q4_1" in app.status.pulling
            await pilot.press("escape")  # the dialogs close; the pull goes on
            await pilot.press("escape")
            await ask(pilot, "Hi")  # the chat answers while the pull waits mid-way
            assert answers(app)[-1].content and app.status.pulling
            hub.stall_after.clear()
            hub.stop_stalling.set()
            await wait_for(pilot, lambda: not app.status.pulling, "the pull to finish")
            ref = store.resolve("test-org/tiny-GGUF:tiny-Q4_1")
            assert ref.name == "tiny-Q4_1" and ref.size_bytes == starter_ref.size_bytes


async def test_the_hub_search_offline_says_so_in_one_line(make_app, history: History,
                                                          monkeypatch: pytest.MonkeyPatch):
    import socket

    from textual.widgets import Input, Label

    from localllm.tui.screens.hub_search import HubSearch

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{port}")
    history.create("t", GREEDY)
    app = make_app()
    async with app.run_test(size=(120, 44)) as pilot:
        await ready(pilot)
        await pilot.press("f3")
        await wait_for(pilot, lambda: isinstance(app.screen, ModelPicker), "the picker")
        await pilot.press("s")
        await wait_for(pilot, lambda: isinstance(app.screen, HubSearch), "the search")
        dialog = app.screen
        dialog.query_one("#query", Input).value = "qwen"
        await pilot.press("enter")
        status = dialog.query_one("#hub-status", Label)
        await wait_for(pilot, lambda: "no network?" in str(status.render()), "the refusal")
        text = str(status.render())
        assert "cannot reach" in text and "\n" not in text
