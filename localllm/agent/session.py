"""One conversation's tools: which are offered, the approvals its user gave, and each
call run under them. The loop around it (answer, calls, results, answer again, up to
the step limit) is agent/turn.py's: this module decides nothing on screen, so it
is tested without one.

A call is never run, nor the user asked, when its tool is unknown, its arguments do not
match the tool's schema, or the tool knows it cannot run (a path outside the folder):
the model is told why. Otherwise the user is asked first, unless they allowed
that tool for the conversation. A denied call tells the model it was denied."""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Literal

from localllm import jsontext
from localllm.agent.tool import Preview, Tool
from localllm.agent.workspace import ToolRefused
from localllm.backends.base import ToolCall
from localllm.backends.tools import ToolChoice, ToolSpec
from localllm.fsguard import PathRefused

# "unasked": nobody could be asked (a script with no terminal): refused, the model told why
Decision = Literal["once", "always", "deny", "stop", "unasked"]
Status = Literal["ok", "error", "denied", "stopped", "not run"]
# asks the user about one call: the tool, its checked arguments and what to show
Approver = Callable[[Tool, dict[str, Any], Preview], Awaitable[Decision]]

log = logging.getLogger(__name__)

DENIED = "The user denied this call; it was not run. Do not try it again unasked."
UNASKED = (
    "Not run: nobody was there to approve this call (no terminal to ask, and it was not "
    "allowed in advance). Answer with what you have."
)


@dataclass(frozen=True, slots=True)
class ToolRun:
    """A call and what came of it, as the history keeps it and the model reads it."""

    call: ToolCall
    result: str
    status: Status

    def record(self) -> dict[str, Any]:
        return {
            "tool_call_id": self.call.id,
            "name": self.call.name,
            "arguments": self.call.arguments,
            "status": self.status,
        }


class AgentSession:
    def __init__(self, tools: list[Tool]) -> None:
        self.tools = {t.name: t for t in tools}
        self.always: set[str] = set()  # tools allowed for the rest of the conversation

    def spec(self) -> ToolSpec | None:
        """The request's tools (the model chooses: a call or an answer), None for none."""
        if not self.tools:
            return None
        return ToolSpec(
            tuple(t.function() for t in self.tools.values()), ToolChoice("auto", parallel=True)
        )

    async def run(self, call: ToolCall, approve: Approver) -> ToolRun:
        """Check, ask, run: a run whose status is "stopped" ends the loop (the user
        pressed Esc in the dialog); the others go back to the model."""
        tool = self.tools.get(call.name)
        if tool is None:
            names = ", ".join(self.tools) or "none"
            return ToolRun(
                call, f"There is no tool named {call.name!r}; the tools are: {names}.", "error"
            )
        try:
            args = tool.checked(call.arguments)
            tool.refusal(args)
        except (ToolRefused, PathRefused) as exc:
            return ToolRun(call, f"Not run: {exc}.", "error")
        except OSError as exc:
            return ToolRun(call, f"Not run: {exc.strerror or exc}.", "error")
        if tool.name not in self.always:
            decision = await approve(tool, args, tool.preview(args))
            if decision == "stop":
                return ToolRun(call, "Not run: the user stopped the turn.", "stopped")
            if decision == "deny":
                return ToolRun(call, DENIED, "denied")
            if decision == "unasked":
                return ToolRun(call, UNASKED, "denied")
            if decision == "always":
                self.always.add(tool.name)
        try:
            return ToolRun(call, await tool.call(args), "ok")
        except (ToolRefused, PathRefused) as exc:
            return ToolRun(call, f"Failed: {exc}.", "error")
        except OSError as exc:
            return ToolRun(call, f"Failed: {exc.strerror or exc}.", "error")
        except Exception as exc:  # a tool's own fault still ends as a result, not a crash
            log.exception("the tool %s failed", tool.name)
            return ToolRun(call, f"Failed: {type(exc).__name__}: {exc}.", "error")


def call_line(name: str, arguments: str, limit: int = 80) -> str:
    """'read_file(path="a.py")': a call in one short line, for titles and lists."""
    try:
        args = jsontext.loads(arguments or "{}")
        inner = ", ".join(f"{k}={json.dumps(v, ensure_ascii=False)}" for k, v in args.items())
    except (json.JSONDecodeError, AttributeError):
        inner = arguments
    text = f"{name}({inner})"
    return text if len(text) <= limit else text[: limit - 1] + "…"
