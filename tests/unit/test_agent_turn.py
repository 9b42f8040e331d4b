"""The agent's turn below every face (agent/turn.py) and `localllm run --tools`'s face
of it (cli/run_turn.py), on the scripted model (backends/fake.py): its replies are the
generic tool format's JSON, chosen by what the prompt already holds, so a test stages a
call, its approval and the answer after it. The tools are the real built-in ones on a
real folder."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import io
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from localllm.agent.builtin import builtin_tools
from localllm.agent.session import UNASKED, AgentSession, Decision
from localllm.agent.turn import (
    AnswerEnded,
    CallDone,
    Event,
    LoopStopped,
    TextDelta,
    Turn,
    TurnEnded,
    run_turn,
)
from localllm.agent.workspace import Workspace
from localllm.backends.base import Message, SamplingParams
from localllm.backends.fake import FakeBackend, Script, write_fake_model
from localllm.cli import run_turn as face
from localllm.config import Settings
from localllm.engine.engine import Engine


def call(name: str, **args: object) -> str:
    return json.dumps({"tool_calls": [{"name": name, "arguments": args}]})


def answer(text: str) -> str:
    return json.dumps({"content": text})


def engine_for(settings: Settings, reply: Callable[[str], str]) -> Engine:
    write_fake_model(settings.models_dir / "scripted.gguf")
    chosen = dataclasses.replace(settings, model="scripted")
    return Engine(chosen, backends=[FakeBackend(Script(reply=reply))])


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    work = tmp_path / "work"
    work.mkdir()
    (work / "NOTES.md").write_text("The secret word is pelican.\n")
    return work


def reads_then_answers(prompt: str) -> str:
    if "The result of " not in prompt:
        return call("read_file", path="NOTES.md")
    return answer("The word is pelican." if "pelican" in prompt else "I could not read it.")


def turn_of(engine: Engine, folder: Path, decide: Decision = "once", **kw: Any) -> Turn:
    async def approve(*_: object) -> Decision:
        return decide

    session = AgentSession(builtin_tools(Workspace(folder), ("read_file", "list_folder")))
    return Turn(engine, session, approve, params=SamplingParams(temperature=0), **kw)


def events_of(turn: Turn, messages: list[Message]) -> list[Event]:
    async def collect() -> list[Event]:
        return [e async for e in run_turn(turn, messages)]

    return asyncio.run(collect())


def test_a_turn_reads_a_file_then_answers(settings: Settings, folder: Path):
    engine = engine_for(settings, reads_then_answers)
    try:
        messages = [Message("user", "What is the secret word in NOTES.md?")]
        events = events_of(turn_of(engine, folder), messages)
    finally:
        engine.close()
    kinds = [type(e).__name__ for e in events if not isinstance(e, TextDelta)]
    assert kinds == ["AnswerEnded", "CallProposed", "CallDone", "AnswerEnded", "TurnEnded"]
    done = next(e for e in events if isinstance(e, CallDone))
    assert done.run.status == "ok" and "pelican" in done.run.result
    assert "".join(e.text for e in events if isinstance(e, TextDelta)) == "The word is pelican."
    assert events[-1] == TurnEnded("done", 1)
    # the conversation grew by the answer with its call, the result, and the answer
    assert [m.role for m in messages] == ["user", "assistant", "tool", "assistant"]
    assert messages[1].tool_calls[0].name == "read_file"
    assert messages[2].tool_call_id == messages[1].tool_calls[0].id


def test_the_step_limit_ends_the_turn_and_the_model_is_told(settings: Settings, folder: Path):
    engine = engine_for(settings, lambda prompt: call("list_folder", path="."))
    try:
        messages = [Message("user", "Look around.")]
        events = events_of(turn_of(engine, folder, steps=2), messages)
    finally:
        engine.close()
    runs = [e.run for e in events if isinstance(e, CallDone)]
    assert [r.status for r in runs] == ["ok", "ok", "not run"]
    assert "limit of 2 tool steps" in runs[-1].result
    assert events[-1] == TurnEnded("step_limit", 2)


@pytest.mark.parametrize(("decide", "status", "outcome"), [
    ("unasked", "denied", "done"), ("deny", "denied", "done"), ("stop", "stopped", "stopped")])
def test_what_the_approver_decides(settings: Settings, folder: Path, decide: Decision,
                                   status: str, outcome: str):
    engine = engine_for(settings, reads_then_answers)
    try:
        events = events_of(turn_of(engine, folder, decide),
                           [Message("user", "What is the secret word in NOTES.md?")])
    finally:
        engine.close()
    done = next(e for e in events if isinstance(e, CallDone))
    assert done.run.status == status and "pelican" not in done.run.result
    if decide == "unasked":
        assert done.run.result == UNASKED
    assert isinstance(events[-1], TurnEnded) and events[-1].outcome == outcome


def test_an_answer_that_repeats_itself_is_stopped(settings: Settings, folder: Path):
    looping = answer("We go round.\n" * 30)
    engine = engine_for(settings, lambda prompt: looping)
    try:
        events = events_of(turn_of(engine, folder), [Message("user", "Go.")])
    finally:
        engine.close()
    assert any(isinstance(e, LoopStopped) and "We go round." in e.repeated for e in events)
    ended = next(e for e in events if isinstance(e, AnswerEnded))
    assert ended.text.count("We go round.") == 4 and ended.finish_reason == "cancelled"
    assert events[-1] == TurnEnded("loop", 0)


def _args(**kw: Any) -> argparse.Namespace:
    base = {"tools": ("read_file",), "folder": None, "steps": None, "allow": None,
            "yes": False, "json": True, "no_think": False, "stats": False}
    return argparse.Namespace(**{**base, **kw})


def test_run_tools_writes_json_events_and_says_the_outcome_in_its_status(
    settings: Settings, folder: Path, capsys: pytest.CaptureFixture[str]
):
    """`localllm run --tools --json`: one JSON object per event; with no terminal and
    nothing allowed a call is refused (the model told), with --allow it runs."""
    engine = engine_for(settings, reads_then_answers)
    ask = [Message("user", "What is the secret word in NOTES.md?")]
    try:
        for args, said in ((_args(folder=str(folder)), "could not"),
                           (_args(folder=str(folder), allow=["read_file"]), "pelican")):
            status = asyncio.run(face.turn_main(engine, settings, args, list(ask),
                                                SamplingParams(temperature=0),
                                                tty=lambda: None))
            lines = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
            assert status == 0 and lines[-1] == {"type": "end", "outcome": "done", "steps": 1}
            result = next(x for x in lines if x["type"] == "result")
            assert result["name"] == "read_file"
            text = "".join(x["text"] for x in lines if x["type"] == "text")
            assert said in text
    finally:
        engine.close()
    engine = engine_for(settings, lambda prompt: call("read_file", path="NOTES.md"))
    try:
        limited = _args(folder=str(folder), yes=True, steps=1, json=False)
        status = asyncio.run(face.turn_main(engine, settings, limited, list(ask),
                                            SamplingParams(temperature=0), tty=lambda: None))
    finally:
        engine.close()
    assert status == face.EXIT_STEP_LIMIT
    err = capsys.readouterr().err
    assert '→ read_file(path="NOTES.md")' in err and "stopped after 1 tool steps" in err


def test_a_call_is_asked_on_the_terminal(settings: Settings, folder: Path):
    """y, n, a (always) and s (stop), read from the terminal the prompt came past; what it
    was asked shows the call's arguments."""
    tool = builtin_tools(Workspace(folder), ("read_file",))[0]
    preview = tool.preview({"path": "NOTES.md"})
    for typed, decided in (("y\n", "once"), ("nope\nn\n", "deny"), ("a\n", "always"),
                           ("s\n", "stop"), ("", "stop")):
        term = Terminal(typed)
        approve = face.approver(_args(), _given(term))
        assert _decide(approve, tool, preview) == decided
        assert "NOTES.md" in term.shown
    assert _decide(face.approver(_args(), lambda: None), tool, preview) == "unasked"
    assert _decide(face.approver(_args(yes=True), lambda: None), tool, preview) == "once"
    allowed = face.approver(_args(allow=["list_folder,read_file"]), lambda: None)
    assert _decide(allowed, tool, preview) == "once"


class Terminal(io.StringIO):
    """A terminal the person types `typed` into; what it was shown is kept."""

    def __init__(self, typed: str) -> None:
        super().__init__(typed)
        self.shown = ""

    def write(self, text: str) -> int:
        self.shown += text
        return len(text)


def _given(term: Terminal) -> Callable[[], io.StringIO]:
    return lambda: term


def _decide(approve: Any, tool: Any, preview: Any) -> Decision:
    async def ask() -> Decision:
        decided: Decision = await approve(tool, {"path": "NOTES.md"}, preview)
        return decided

    return asyncio.run(ask())
