"""`localllm run`'s turn: the agent runner (agent/turn.py) on a terminal or in a script.

The answer goes to stdout; its reasoning to stderr (dimmed on a terminal; `--no-think`
leaves it out); each tool call and what came of it to stderr. A call runs when `--yes`
or `--allow NAME` allows it, or when the person at the terminal says so (y, n, or a for
always); with no terminal to ask, it is refused and the model is told why. `--json`
writes one JSON object per event on stdout instead, for scripts.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from localllm.agent.session import AgentSession, Approver, Decision, call_line
from localllm.agent.tool import Preview, Tool
from localllm.agent.turn import (
    AGENT_SYSTEM,
    AnswerEnded,
    CallDone,
    CallProposed,
    Event,
    LoopStopped,
    ReasoningDelta,
    TextDelta,
    Turn,
    TurnEnded,
    run_turn,
)
from localllm.backends.base import GenerationStats, Message, SamplingParams
from localllm.config import BUILTIN_TOOLS, Settings

if TYPE_CHECKING:
    from localllm.engine.client import EngineClient

EXIT_STEP_LIMIT = 3  # the model still wanted tools after --steps rounds
EXIT_STOPPED = 4  # stopped: at the terminal, or the answer repeated itself
EXITS = {"done": 0, "step_limit": EXIT_STEP_LIMIT, "stopped": EXIT_STOPPED, "loop": EXIT_STOPPED}
PREVIEW_LINES = 30  # of a call's arguments, diff or command, shown before asking


READ_ONLY = ("read_file", "list_folder", "search_files")  # what a bare --tools offers


def tool_names(text: str | None) -> tuple[str, ...]:
    """`--tools` as given: the tools that only look for a bare flag (editing and running
    commands are asked for by name: at 0.8 the 1.5B coder, asked what a file said, also
    "updated" it), else the names listed."""
    if not text:
        return READ_ONLY
    names = tuple(n.strip() for n in text.split(",") if n.strip())
    unknown = [n for n in names if n not in BUILTIN_TOOLS]
    if unknown:
        raise argparse.ArgumentTypeError(
            f"{', '.join(unknown)}: not a built-in tool; they are {', '.join(BUILTIN_TOOLS)}"
        )
    return names


def approver(args: argparse.Namespace, tty: Callable[[], IO[str] | None]) -> Approver:
    """The hook that decides each call: allowed by the flags, else asked on `tty()`,
    else refused (no one to ask)."""
    allowed = {n for a in args.allow or () for n in a.split(",") if n}

    async def approve(tool: Tool, arguments: dict[str, Any], preview: Preview) -> Decision:
        del arguments
        if args.yes or tool.name in allowed:
            return "once"
        term = tty()
        if term is None:
            return "unasked"
        with term:
            return await asyncio.to_thread(_ask, term, tool, preview)

    return approve


def terminal() -> IO[str] | None:
    """The controlling terminal, to ask on (stdin may be the prompt); None without one."""
    try:
        fd = os.open("/dev/tty", os.O_RDWR | os.O_NOCTTY)
    except OSError:
        return None
    return open(fd, "r+", encoding="utf-8", errors="replace")


def _ask(term: IO[str], tool: Tool, preview: Preview) -> Decision:
    lines = preview.text.splitlines()
    shown = "\n".join(lines[:PREVIEW_LINES])
    more = f"\n  ... {len(lines) - PREVIEW_LINES} more lines" if len(lines) > PREVIEW_LINES else ""
    term.write(f"\n{tool.name} ({tool.source}) wants to run:\n{shown}{more}\n")
    while True:
        term.write(f"Run {tool.name}? [y]es, [n]o, [a]lways for {tool.name}, [s]top: ")
        term.flush()
        answer = term.readline()
        if not answer:  # the terminal closed
            return "stop"
        choice = answer.strip().lower()[:1]
        decided: dict[str, Decision] = {"y": "once", "n": "deny", "a": "always", "s": "stop"}
        if choice in decided:
            return decided[choice]


class Printer:
    """The events for a person: the answer on stdout, the rest on stderr."""

    def __init__(self, out: IO[str], err: IO[str], *, think: bool, stats: bool) -> None:
        self.out, self.err = out, err
        self.think, self.stats = think, stats
        self.dim = err.isatty()
        self._last = "\n"  # the last character written to `out`

    def show(self, event: Event) -> None:
        if isinstance(event, TextDelta):
            self._write(event.text)
        elif isinstance(event, ReasoningDelta):
            if self.think:
                text = f"\x1b[2m{event.text}\x1b[0m" if self.dim else event.text
                self.err.write(text)
                self.err.flush()
        elif isinstance(event, CallProposed):
            self._end_line()
            self.err.write(f"→ {call_line(event.call.name, event.call.arguments)}\n")
        elif isinstance(event, CallDone):
            run = event.run
            first = run.result.strip().splitlines()[0] if run.result.strip() else ""
            size = len(run.result.splitlines())
            self.err.write(
                f"← {run.status}: {first[:100]}" + (f" ({size} lines)\n" if size > 1 else "\n")
            )
        elif isinstance(event, LoopStopped):
            self._end_line()
            self.err.write(
                f"localllm: the answer kept repeating “{event.repeated[:60]}”; stopped\n"
            )
        elif isinstance(event, AnswerEnded):
            if self.stats and event.stats is not None:
                self._end_line()
                self.err.write(stats_line(event.stats, event.finish_reason))
        elif isinstance(event, TurnEnded):
            self._end_line()
            if event.outcome == "step_limit":
                self.err.write(
                    f"localllm: stopped after {event.steps} tool steps (--steps); the model "
                    "wanted more\n"
                )
        self.err.flush()

    def _write(self, text: str) -> None:
        if text:
            self.out.write(text)
            self.out.flush()
            self._last = text[-1]

    def _end_line(self) -> None:
        if self._last != "\n":
            self._write("\n")


def stats_line(s: GenerationStats, finish: str | None) -> str:
    line = (
        f"prompt {s.prompt_tokens} tokens ({s.cached_tokens} cached), generated "
        f"{s.generated_tokens} tokens, first token {s.ttft_s * 1000:.0f} ms, "
        f"{s.decode_tps:.1f} tokens/s, finish: {finish}\n"
    )
    if s.draft_off:
        line += f"speculative: off for this request ({s.draft_off})\n"
    if s.draft_proposed:
        speedup = f", {s.speedup:.2f}x plain speed" if s.speedup else ""
        line += (
            f"speculative: {s.draft_accepted} of {s.draft_proposed} drafted tokens accepted "
            f"({s.draft_accepted / s.draft_proposed:.0%}){speedup}\n"
        )
    return line


def as_json(event: Event) -> dict[str, Any]:
    """One event as the JSON line `--json` writes."""
    if isinstance(event, TextDelta):
        return {"type": "text", "text": event.text}
    if isinstance(event, ReasoningDelta):
        return {"type": "reasoning", "text": event.text}
    if isinstance(event, CallProposed):
        c = event.call
        return {"type": "call", "id": c.id, "name": c.name, "arguments": c.arguments}
    if isinstance(event, CallDone):
        r = event.run
        return {"type": "result", "id": r.call.id, "name": r.call.name, "status": r.status,
                "result": r.result}  # fmt: skip
    if isinstance(event, LoopStopped):
        return {"type": "loop", "repeated": event.repeated}
    if isinstance(event, AnswerEnded):
        s = event.stats
        usage = None if s is None else {"prompt_tokens": s.prompt_tokens,
                                        "cached_tokens": s.cached_tokens,
                                        "completion_tokens": s.generated_tokens}  # fmt: skip
        calls = [{"id": c.id, "name": c.name, "arguments": c.arguments} for c in event.calls]
        return {"type": "answer", "text": event.text, "tool_calls": calls,
                "finish_reason": event.finish_reason, "usage": usage}  # fmt: skip
    return {"type": "end", "outcome": event.outcome, "steps": event.steps}


async def turn_main(
    engine: EngineClient,
    settings: Settings,
    args: argparse.Namespace,
    messages: list[Message],
    params: SamplingParams,
    *,
    model: str | None = None,
    tty: Callable[[], IO[str] | None] = terminal,
) -> int:
    """Run the turn and show it; the exit status its outcome maps to (EXITS)."""
    from localllm.agent.builtin import builtin_tools
    from localllm.agent.workspace import Workspace

    names: tuple[str, ...] = args.tools if args.tools is not None else ()
    folder = Path(args.folder or Path.cwd())
    workspace = Workspace(folder)
    if names and not any(m.role == "system" for m in messages):  # --system replaces it
        messages.insert(0, Message("system", AGENT_SYSTEM))
    session = AgentSession(builtin_tools(workspace, names))
    turn = Turn(
        engine,
        session,
        approver(args, tty),
        steps=args.steps or settings.agent_steps,
        params=params,
        model=model,
        guard=bool(names),  # the agent's turn stops a loop; a plain answer is the model's
    )
    printer = Printer(sys.stdout, sys.stderr, think=not args.no_think, stats=args.stats)
    outcome = "done"
    try:
        async for event in run_turn(turn, messages):
            if args.json:
                sys.stdout.write(json.dumps(as_json(event), ensure_ascii=False) + "\n")
                sys.stdout.flush()
            else:
                printer.show(event)
            if isinstance(event, TurnEnded):
                outcome = event.outcome
    finally:
        with contextlib.suppress(Exception):
            workspace.close()
    return EXITS[outcome]
