"""The chat's loop guard: an answer that repeats itself verbatim is stopped and the user
told, a long answer that does not repeat is never stopped, and Ctrl+G lets a stopped
answer go on where it stopped. The guard's rules on text alone; the chat on the
scripted model (backends/fake.py), whose replies stage the loop."""

from __future__ import annotations

from localllm.agent.loop_guard import LoopGuard
from localllm.history import ConversationSettings
from tests.tui.conftest import wait_for

LOOP = "def is_prime(n):\n" + "    if isinstance(n, bool) and n == 1: return False\n" * 19
PLAN = "".join(f"{i}. Step {i}: check the value against {i * 7} and write it down.\n"
               for i in range(1, 40))


def tripped(text: str, piece: int = 5) -> str | None:
    guard = LoopGuard()
    for i in range(0, len(text), piece):
        if guard.feed(text[i : i + piece]):
            return guard.tripped
    return None


def test_repeats_are_caught_by_line_sentence_and_block():
    assert tripped(LOOP) == "if isinstance(n, bool) and n == 1: return False"
    assert tripped("The cat sat down. " * 5 + "More") == "The cat sat down."
    assert tripped("a = load(x)\nb = save(y)\n" * 3) == "a = load(x) / b = save(y)"


def test_what_is_not_a_loop():
    assert tripped(PLAN) is None  # long, and every line differs
    assert tripped("}\n" * 10) is None  # too short to be a loop: syntax
    assert tripped("if x:\n    pass\n" * 2) is None  # twice is not a loop
    assert tripped("The cat sat down. " * 3) is None  # three times in a row


async def test_a_looping_answer_is_stopped_and_goes_on_with_ctrl_g(scripted):
    def reply(prompt: str) -> str:
        return " # and so on\nprint(is_prime(7))\n" if "return False\n" in prompt else LOOP

    app, history = scripted(reply)
    history.create("t", ConversationSettings(max_tokens=3000))
    async with app.run_test(size=(100, 30)) as pilot:
        await wait_for(pilot, lambda: app.status.model == "scripted", "the model")
        app.prompt_box.load_text("Write is_prime.")
        await pilot.press("enter")
        await wait_for(pilot, lambda: not app.generating and len(history.messages(1)) == 2,
                       "the stopped answer")
        stopped = history.messages(1)[-1]
        assert stopped.stats is not None and stopped.stats["finish_reason"] == "cancelled"
        assert stopped.stats["loop_guard"] == "if isinstance(n, bool) and n == 1: return False"
        assert stopped.content.count("return False") == 4  # stopped at the fourth time
        assert len(stopped.content) < len(LOOP)
        assert any("kept repeating" in n.message for n in app._notifications)
        await pilot.press("ctrl+g")
        await wait_for(pilot, lambda: not app.generating and "print" in
                       history.messages(1)[-1].content, "the answer to go on")
        msgs = history.messages(1)
        assert len(msgs) == 2  # the same answer, gone on: not a second one
        assert msgs[-1].content == stopped.content + " # and so on\nprint(is_prime(7))\n"
        assert msgs[-1].stats is not None and "loop_guard" not in msgs[-1].stats


async def test_a_long_answer_that_does_not_repeat_is_not_stopped(scripted):
    app, history = scripted(lambda prompt: PLAN)
    history.create("t", ConversationSettings(max_tokens=3000))
    async with app.run_test(size=(100, 30)) as pilot:
        await wait_for(pilot, lambda: app.status.model == "scripted", "the model")
        app.prompt_box.load_text("Plan it.")
        await pilot.press("enter")
        await wait_for(pilot, lambda: not app.generating and len(history.messages(1)) == 2,
                       "the answer")
        done = history.messages(1)[-1]
        assert done.content == PLAN and done.stats is not None
        assert done.stats["finish_reason"] == "stop" and "loop_guard" not in done.stats
