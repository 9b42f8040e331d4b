"""The chat's slash commands and compaction, on the scripted model (backends/fake.py):
/compact replaces the older turns with the model's summary and the next answer still
sees it; the chat compacts by itself near the end of the context; /system, /clear and
Tab completion; an unknown command is not sent."""

from __future__ import annotations

from textual.pilot import Pilot

from localllm.config import Remote
from localllm.history import ConversationSettings, History
from localllm.tui.app import ChatApp
from localllm.tui.commands import SUMMARY_PREFIX, completions
from tests.tui.conftest import wait_for

SUMMARY = "The user is Ada and works on a compiler."


def reply(prompt: str) -> str:
    """Summarizes when asked to; greets Ada by name when the prompt says who she is."""
    if "Summarize the conversation below" in prompt:
        return SUMMARY
    if "The user is Ada" in prompt or "My name is Ada" in prompt:
        return "Yes, Ada."
    return "I do not know."


async def say(app: ChatApp, pilot: Pilot, history: History, text: str, count: int) -> None:
    await wait_for(pilot, lambda: app.status.model == "scripted", "the model")
    app.prompt_box.load_text(text)
    await pilot.press("enter")
    await wait_for(pilot, lambda: not app.generating and len(history.messages(1)) == count,
                   f"{count} messages")


async def test_compact_replaces_older_turns_and_the_next_answer_still_sees_them(scripted):
    app, history = scripted(reply)
    history.create("t", ConversationSettings(max_tokens=200))
    async with app.run_test(size=(100, 30)) as pilot:
        await say(app, pilot, history, "My name is Ada.", 2)
        await say(app, pilot, history, "I write a compiler.", 4)
        await say(app, pilot, history, "Tell me a joke.", 6)
        await say(app, pilot, history, "/compact", 7)
        msgs = history.messages(1)
        summary = msgs[-1]
        assert summary.role == "summary" and summary.content == SUMMARY
        assert summary.stats is not None and summary.stats["summarized"] == 4
        assert [m.in_context for m in msgs[:6]] == [False] * 4 + [True] * 2  # the last kept
        request = app._request(history.get(1))
        assert request.messages is not None
        system = request.messages[0]
        assert system.role == "system" and system.content == SUMMARY_PREFIX + SUMMARY
        assert "My name is Ada" not in " ".join(m.content for m in request.messages)
        await say(app, pilot, history, "Who am I?", 9)
        assert history.messages(1)[-1].content == "Yes, Ada."  # read from the summary


async def test_the_chat_compacts_by_itself_near_the_end_of_the_context(scripted):
    long_reply = "word " * 900  # each answer fills much of the 4,096-token context

    def replies(prompt: str) -> str:
        return SUMMARY if "Summarize the conversation below" in prompt else long_reply

    app, history = scripted(replies)
    history.create("t", ConversationSettings(max_tokens=1700))
    async with app.run_test(size=(100, 30)) as pilot:
        await say(app, pilot, history, "One.", 2)
        await say(app, pilot, history, "Two.", 5)  # its answer, then the summary
        assert any("nearly full" in n.message for n in app._notifications)
        kept = [m.role for m in history.messages(1) if m.in_context]
        assert kept == ["user", "assistant", "summary"]


async def test_system_clear_tab_and_unknown_commands(scripted):
    prompts: list[str] = []

    def record(prompt: str) -> str:
        prompts.append(prompt)
        return "ok"

    remote = Remote("up", "http://127.0.0.1:9/v1", models=("big",))  # never asked here
    app, history = scripted(record, remotes=(remote,))
    history.create("t", ConversationSettings(max_tokens=50))
    async with app.run_test(size=(100, 30)) as pilot:
        await say(app, pilot, history, "/system Answer in French.", 0)
        conv = history.get(1)
        assert conv is not None and conv.settings.system_prompt == "Answer in French."
        await say(app, pilot, history, "Hello.", 2)
        assert "Answer in French." in prompts[-1]
        await say(app, pilot, history, "/clear", 2)
        assert [m.in_context for m in history.messages(1)] == [False, False]
        await say(app, pilot, history, "Again.", 4)
        assert "Hello." not in prompts[-1] and "Again." in prompts[-1]
        await say(app, pilot, history, "/frobnicate", 4)  # not sent, and told
        assert any("/frobnicate is not a command" in n.message for n in app._notifications)
        await say(app, pilot, history, "//frobnicate is a slash word", 6)
        assert "/frobnicate is a slash word" in prompts[-1]
        await say(app, pilot, history, "/usr/bin holds programs", 8)  # a path: a prompt
        app.prompt_box.load_text("/comp")
        await pilot.press("tab")
        assert app.prompt_box.text == "/compact "
        app.prompt_box.load_text("/s")
        await pilot.pause()
        assert "/system" in str(app.prompt_box.border_subtitle)
        assert "/save" in str(app.prompt_box.border_subtitle)
        await say(app, pilot, history, "/model up/big", 8)  # a remote's: nothing loads
        assert app.remote_model == "up/big" and app.status.model == "up/big"
        app.prompt_box.load_text("/model scripted")
        await pilot.press("enter")
        await wait_for(pilot, lambda: app.remote_model is None, "the local model chosen")
        await wait_for(pilot, lambda: app.status.model == "scripted", "the local model back")


def test_completions():
    assert completions("/c") == ["/clear", "/compact"]
    assert completions("/compact ") == [] and completions("hello") == []
