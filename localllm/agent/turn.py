"""One turn of an agent, below every face: answer, run the calls the answer made (each
approved through a hook), answer again with their results, up to a step limit.

`run_turn` takes the conversation so far, the engine (local or remote models alike: it
only submits requests), the conversation's tools (`AgentSession`) and the hooks, and
yields typed events; it draws nothing and asks nobody itself. `localllm run --tools`
prints the events (cli/run.py); a script reads them as JSON lines. What only a person
decides comes through `approve` (a call) and the caller's own choice to go on after a
stop.

The turn ends `done` (an answer with no calls), `step_limit` (the model still wanted
tools after `steps` rounds of calls: those calls are not run, and the model is told
why), `stopped` (the approver stopped the turn) or `loop` (the answer repeated itself:
the loop guard cut it where the repeats began).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from localllm.agent.loop_guard import LoopGuard
from localllm.agent.session import AgentSession, Approver, ToolRun
from localllm.backends.base import GenerationStats, Message, SamplingParams, ToolCall
from localllm.engine.request import Request

if TYPE_CHECKING:
    from localllm.engine.client import EngineClient

Outcome = Literal["done", "step_limit", "stopped", "loop"]

# the system prompt a turn with tools starts from when its caller gives none: without it,
# Qwen2.5-Coder-1.5B read NOTES.md and then called read_file again on each of its 8 steps
# (temperature 0) instead of answering; with it, it answered after one call
AGENT_SYSTEM = (
    "You are a helpful assistant with tools that work in the current folder. Call a tool "
    "when you need to look at files; when the results answer the question, reply to the "
    "user in plain text. Never repeat a call whose result you already have."
)


@dataclass(frozen=True, slots=True)
class TextDelta:
    text: str


@dataclass(frozen=True, slots=True)
class ReasoningDelta:
    text: str


@dataclass(frozen=True, slots=True)
class AnswerEnded:
    """One answer of the turn is whole: its text, the calls it made, its figures."""

    text: str
    calls: tuple[ToolCall, ...]
    finish_reason: str | None
    stats: GenerationStats | None


@dataclass(frozen=True, slots=True)
class CallProposed:
    call: ToolCall


@dataclass(frozen=True, slots=True)
class CallDone:
    """What came of a call: its result as the model reads it, and its status (ok, error,
    denied, stopped, not run)."""

    run: ToolRun


@dataclass(frozen=True, slots=True)
class LoopStopped:
    repeated: str  # the line or block the answer kept writing


@dataclass(frozen=True, slots=True)
class TurnEnded:
    outcome: Outcome
    steps: int  # rounds of calls run


Event = TextDelta | ReasoningDelta | AnswerEnded | CallProposed | CallDone | LoopStopped | TurnEnded


@dataclass(slots=True)
class Turn:
    """A turn's settings: the tools and their approvals, the hook, the limit."""

    engine: EngineClient
    session: AgentSession
    approve: Approver
    steps: int = 8
    params: SamplingParams = field(default_factory=SamplingParams)
    model: str | None = None
    guard: bool = True  # stop an answer that repeats itself


def _over_limit(call: ToolCall, steps: int) -> ToolRun:
    why = f"the limit of {steps} tool steps for this turn was reached"
    return ToolRun(call, f"Not run: {why}.", "not run")


async def run_turn(turn: Turn, messages: list[Message]) -> AsyncIterator[Event]:
    """The turn's events; `messages` grows by each answer and tool result as they come
    (the conversation to keep or to continue from)."""
    rounds = 0
    while True:
        answer: AnswerEnded | None = None
        looped: str | None = None
        async for event in _answer(turn, messages):
            if isinstance(event, LoopStopped):
                looped = event.repeated
            if isinstance(event, AnswerEnded):
                answer = event
            yield event
        assert answer is not None
        messages.append(Message("assistant", answer.text, tool_calls=answer.calls))
        if looped is not None or answer.finish_reason == "cancelled" or not answer.calls:
            yield TurnEnded("loop" if looped is not None else "done", rounds)
            return
        rounds += 1
        over = rounds > turn.steps
        stopped = False
        for call in answer.calls:
            yield CallProposed(call)
            if over:
                run = _over_limit(call, turn.steps)
            elif stopped:
                run = ToolRun(call, "Not run: the user stopped the turn.", "not run")
            else:
                run = await turn.session.run(call, turn.approve)
            stopped = stopped or run.status == "stopped"
            messages.append(Message("tool", run.result, tool_call_id=call.id, name=call.name))
            yield CallDone(run)
        if over or stopped:
            yield TurnEnded("step_limit" if over else "stopped", rounds - over)
            return


async def _answer(turn: Turn, messages: list[Message]) -> AsyncIterator[Event]:
    """One answer streamed as events, ending with AnswerEnded."""
    request = Request(
        turn.params, messages=list(messages), model=turn.model, tools=turn.session.spec()
    )
    stream = turn.engine.submit(request)
    guard = LoopGuard() if turn.guard else None
    parts: list[str] = []
    calls: list[ToolCall] = []
    final = None
    try:
        async for delta in stream.deltas(lambda: 0.0):
            final = delta.final or final
            calls += delta.tool_calls
            if delta.reasoning:
                yield ReasoningDelta(delta.reasoning)
            text = delta.text
            if guard is not None and text and guard.feed(text):
                stream.cancel()  # it repeats itself: cut where the repeats began
                shown = len("".join(parts))
                kept = "".join(parts) + text
                parts = [kept[: guard.cut]]
                if guard.cut > shown:
                    yield TextDelta(kept[shown : guard.cut])
                assert guard.tripped is not None
                yield LoopStopped(guard.tripped)
                yield AnswerEnded(parts[0], (), "cancelled", None)
                return
            if text:
                parts.append(text)
                yield TextDelta(text)
    finally:
        stream.cancel()
    reason = final.finish_reason if final is not None else None
    stats = final.stats if final is not None else None
    yield AnswerEnded("".join(parts), tuple(calls), reason, stats)
